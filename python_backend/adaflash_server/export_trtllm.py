"""`adaflash export-trtllm`: a Triton model repository in which TensorRT-LLM serves the target and our drafter.

One model, TensorRT-LLM's LLM-API Python model (`triton_backend/all_models/llmapi/`): its `model.yaml` holds the
arguments of `tensorrt_llm.LLM` (the target folder, TensorRT-LLM's DFlash path loading our drafter folder, and
AdaFlash's policy as the draft-length schedule, `adaflash.serving.trtllm`) and its `config.pbtxt` the tensors.
Configuration only: the model's code (model.py, helpers.py) comes from the TensorRT-LLM release that serves it
(docs/gpu.md, "TensorRT-LLM"). Nothing here imports TensorRT-LLM or needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.models.checkpoint import read_config
from adaflash.serving.trtllm import (
    LLMAPI_MODEL,
    LLMAPI_OUTPUTS,
    REQUEST_TENSORS,
    RESPONSE_SWITCHES,
    TRTLLM_RELEASE,
    LengthSchedule,
    LlmApiTensor,
    acceptance_rates,
    derive_schedule,
    load_cost_table,
)

SCHEDULE_REPORT = "adaflash-schedule.json"


def register(sub: argparse._SubParsersAction) -> None:
    """The `adaflash export-trtllm` command (entry point `adaflash.commands`)."""
    p = sub.add_parser("export-trtllm", help="a Triton model repository serving the target and drafter on "
                                             f"TensorRT-LLM {TRTLLM_RELEASE}'s DFlash path, with the length "
                                             "policy as its draft-length schedule")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the model repository to write")
    p.add_argument("--cost-table", type=Path, required=True,
                   help="measured costs of the device that will serve: a CostModel JSON (serve's --cost-table) or "
                        "an adaflash bench report (its cost_model_ms)")
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="folder with target/ and the drafter")
    p.add_argument("--drafter", default="drafter", help="drafter folder name inside --model-dir")
    p.add_argument("--acceptance", type=Path,
                   help="per-position acceptance (calibration.json; default: the drafter's own)")
    p.add_argument("--max-batch-size", type=int, help="sequences at once (default: the cost table's largest batch)")
    p.add_argument("--max-seq-len", type=int, help="tokens per sequence (default: the target's trained context)")


def run(args: argparse.Namespace) -> int:
    drafter_dir = args.model_dir / args.drafter
    cost_path = args.cost_table
    acceptance = args.acceptance or drafter_dir / "calibration.json"
    try:
        schedule = export_trtllm(args.out, args.model_dir / "target", drafter_dir,
                                 json.loads(cost_path.read_text()), json.loads(acceptance.read_text()),
                                 args.max_batch_size, args.max_seq_len,
                                 sources={"cost_table": str(cost_path), "acceptance": str(acceptance)})
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"model_repository": str(args.out), "max_draft_len": schedule.max_draft_len,
                      "draft_len_schedule": schedule.draft_len_schedule(),
                      "max_concurrency": schedule.max_concurrency}))
    return 0


def export_trtllm(out: Path, target_dir: Path, drafter_dir: Path, cost_report: dict, calibration: dict,
                  max_batch: int | None = None, max_seq_len: int | None = None,
                  sources: dict[str, str] | None = None) -> LengthSchedule:
    """Derive the schedule and write the repository; refuses a table on which speculation never pays, since
    TensorRT-LLM's DFlash path would then only slow the target down."""
    cost = load_cost_table(cost_report)
    block_size = read_config(drafter_dir)["block_size"]
    rates = acceptance_rates(calibration, block_size)
    schedule = derive_schedule(rates, cost, max_batch or max(cost.verify), block_size)
    if schedule.max_draft_len == 0:
        raise ValueError("speculation never pays on this cost table and acceptance: serve the target alone")
    model = out / LLMAPI_MODEL
    (model / "1").mkdir(parents=True, exist_ok=True)
    args = llm_args(target_dir, drafter_dir, schedule, len(schedule.lengths),
                    max_seq_len or read_config(target_dir)["max_position_embeddings"])
    (model / "1" / "model.yaml").write_text(model_yaml(args, schedule))
    (model / "config.pbtxt").write_text(config_pbtxt())
    report = {"tensorrt_llm": TRTLLM_RELEASE, **(sources or {}), "acceptance_rates": np.round(rates, 4).tolist(),
              "draft_len_by_batch": dict(enumerate(schedule.lengths, start=1)),
              "draft_len_schedule": schedule.draft_len_schedule(), "max_concurrency": schedule.max_concurrency}
    (model / SCHEDULE_REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return schedule


def llm_args(target_dir: Path, drafter_dir: Path, schedule: LengthSchedule, max_batch: int,
             max_seq_len: int) -> dict:
    """The keyword arguments of `tensorrt_llm.LLM`. Only `draft_len_schedule`, never `max_concurrency` with it:
    TensorRT-LLM refuses both together, and the schedule's implicit zero above its largest key is the cut-off.
    The drafter's mask token and target layers are left for TensorRT-LLM to read from its dflash_config."""
    return {
        "model": str(target_dir.resolve()),
        "max_batch_size": max_batch,
        "max_seq_len": max_seq_len,
        "speculative_config": {
            "decoding_type": "DFlash",
            "speculative_model": str(drafter_dir.resolve()),
            "max_draft_len": schedule.max_draft_len,
            "draft_len_schedule": schedule.draft_len_schedule(),
        },
        "triton_config": {"max_batch_size": 0, "decoupled": True},  # TensorRT-LLM batches in flight, not Triton
    }


def model_yaml(args: dict, schedule: LengthSchedule) -> str:
    header = [f"# Written by `adaflash export-trtllm` for tensorrt-llm=={TRTLLM_RELEASE} (LLM-API Triton model).",
              f"# Speculation stops paying above {schedule.max_concurrency} sequences at once "
              "(draft_len_schedule's largest key); per batch size: ../" + SCHEDULE_REPORT + "."]
    return "\n".join(header + _yaml(args, 0)) + "\n"


def _yaml(value: dict, indent: int) -> list[str]:
    """Block-style YAML of nested mappings of scalars: the config has no lists, and the project pins no YAML
    writer. Strings are JSON-quoted, which YAML reads as double-quoted scalars; integer keys stay integers."""
    lines = []
    for key, item in value.items():
        head = " " * indent + f"{key}:"
        if isinstance(item, dict):
            lines += [head] + _yaml(item, indent + 2)
        else:
            lines.append(f"{head} {_scalar(item)}")
    return lines


def _scalar(item: object) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int | float):
        return repr(item)
    if isinstance(item, str):
        return json.dumps(item)
    raise TypeError(f"no YAML form for {type(item).__name__}")


def config_pbtxt() -> str:
    """The LLM-API model's config: a Python-backend model; batching and decoupling come from model.yaml's
    triton_config, which the model applies itself."""
    inputs = (*REQUEST_TENSORS.values(), *RESPONSE_SWITCHES)
    return (f'name: "{LLMAPI_MODEL}"\nbackend: "python"\n\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n\n"
            f"input [\n{_tensor_list(inputs, True)}\n]\noutput [\n{_tensor_list(LLMAPI_OUTPUTS, False)}\n]\n")


def _tensor_list(tensors: tuple[LlmApiTensor, ...], is_input: bool) -> str:
    def entry(t: LlmApiTensor) -> str:
        optional = " optional: true" if is_input and t.optional else ""
        return f'  {{ name: "{t.name}" data_type: {t.triton_type} dims: [ {", ".join(map(str, t.dims))} ]{optional} }}'
    return ",\n".join(entry(t) for t in tensors)

"""Build a Triton model repository from the templates in `model_repository/`.

The templates carry `${...}` fields (model folders, instance counts, sequence slots, queue
delays, limits, and each model's tensors, written from the declarations in
`adaflash.serving.protocol`); this fills them and copies the model code. It loads no model: the
verify/draft cost table of the length policy is measured by the target model when it starts, in
the process and on the device that run its forwards (or a given table is reused).

The builder's arithmetic needs the core's model modules, which import torch; they are imported where they are
used, so that importing this module for its options costs no torch. `adaflash serve`'s launcher, which lives as
long as its server and needs torch for nothing else, builds in a short-lived interpreter (`build_apart`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import string
import subprocess
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from adaflash.cli_args import byte_size
from adaflash_contract.modes import modes_served
from adaflash.serving.pacing import AUTO

if TYPE_CHECKING:
    from adaflash.models.placement import Placement
    from adaflash.serving.protocol import TensorSpec

TEMPLATES = Path(__file__).resolve().parents[2] / "model_repository"
# A stock-contract ensemble: one step, the entry model, with TensorRT-LLM's tensors only.
STOCK_ENSEMBLE = """name: "${name}"
platform: "ensemble"
max_batch_size: ${max_batch_size}
input [
${inputs}
]
output [
${outputs}
]
ensemble_scheduling {
  step [
    {
      model_name: "${entry}"
      model_version: -1
${maps}
    }
  ]
}
"""


@dataclass
class RepositoryConfig:
    max_active: int = 64  # sequences generated at once; also the target's and drafter's batch size
    max_queued: int = 256  # requests beyond max_active wait in a FIFO of this size (a burst of 4x max_active)
    max_queue_wait_s: float = 60.0  # a request that waits longer for a sequence slot is refused (UNAVAILABLE)
    stream_interval_ms: float = 0.0  # a stream's responses at most this often; 0: one per step (serving/pacing.py)
    max_responses_per_s: float = AUTO  # streamed responses per second, shared by the streams; 0: no limit;
    # AUTO (-1): RESPONSES_PER_CORE_S per CPU core of the serving machine
    max_batch_size: int = 64  # requests per execute of the public model
    max_len: int = 2048  # tokens per sequence (prompt + output + one draft block)
    max_prompt_tokens: int = 1024
    max_output_tokens: int = 1000
    idle_timeout_s: int = 600  # a sequence silent this long is reclaimed
    drafter_timeout_s: float = 10.0  # a slower draft is dropped and the request decodes plainly
    target_timeout_s: float = 120.0  # a target call unanswered this long fails the request (never a hang)
    default_spec_mode: str = "adaflash"
    device: str = "auto"  # the target's and drafter's: auto (CUDA when this machine's PyTorch sees one), cpu, cuda[:N]
    dtype: str = ""  # their floating dtype; empty: the device's default (placement.py)
    kv_cache_memory: str = ""  # bytes for the target's KV cache and the drafter's context together (e.g. 40GiB):
    # when they hold fewer than max_active x max_len positions the caches are paged (kv_page positions a page) and
    # a request waits until the positions it may fill are free; empty: max_active x max_len, unpaged
    kv_page: int = 64
    target_in_orchestrator: bool = True  # the target's forwards in the orchestrator's process: no `target` model, no
    # round trip per step (served 3-32% faster here: docs/history.md, round 14); False: a `target` model of its own
    drafter_in_orchestrator: bool = True  # with target_in_orchestrator: the drafter beside the target, sharing its
    # embedding and LM head, on its thread, in one process (the `drafter` model is written, for `publish-drafter`,
    # but not loaded: `models_to_load`); False: the `drafter` model of its own
    drafter_backend: str = "torch"  # what runs the drafter's block forward: torch, or onnx (ONNX Runtime; CPU float32,
    # the onnx extra): adaflash.models.backends.DRAFTER_BACKENDS


def build_repository(out_dir: str | Path, model_dir: str | Path, drafter: str | None = "drafter",
                     config: RepositoryConfig | None = None, cost_table: str | Path | None = None,
                     stock_contract_ensemble: str | None = None) -> Path:
    """Write the repository to `out_dir` (replaced); returns it. Without a drafter only ar/ngram are served.

    `stock_contract_ensemble`: the name of an ensemble over the `adaflash` model with TensorRT-LLM's tensors only
    (`protocol.STOCK_CONTRACT`), to try or compare a client against that contract without TensorRT-LLM. Triton
    tells an ensemble's running step nothing of a client's cancellation, so a stream cancelled there runs to its
    end. Not a RepositoryConfig field, so `adaflash serve` has none: its drain stops the `adaflash` model only."""
    from adaflash.models.backends import check_backend
    from adaflash.models.drafter import DEFAULT_BLOCK_SIZE
    from adaflash.models.placement import CPU, placement
    from adaflash.serving.protocol import MODEL_TENSORS

    out_dir, model_dir = Path(out_dir).resolve(), Path(model_dir).resolve()
    cfg = fit_to_context(config or RepositoryConfig(), _target_context(model_dir))
    drafter_dir = model_dir / drafter if drafter else None
    place = placement(cfg.device, cfg.dtype or None, present=False)
    if drafter_dir:
        check_backend(cfg.drafter_backend, place)
    kv_pages = pages_for_budget(cfg, model_dir, drafter_dir, place)
    if cfg.max_prompt_tokens + cfg.max_output_tokens + DEFAULT_BLOCK_SIZE > cfg.max_len:
        raise ValueError("max_len must hold max_prompt_tokens + max_output_tokens + a draft block")
    modes = modes_served(drafter_dir is not None)
    default_mode = cfg.default_spec_mode if cfg.default_spec_mode in modes else "ar"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    # Without a given table the target model measures one when it starts (`load_or_measure_costs`).
    cost_path = out_dir.parent / f"{out_dir.name}.cost.json"
    cost_path.unlink(missing_ok=True)
    if drafter_dir and cost_table:
        shutil.copyfile(cost_table, cost_path)
    fields = {**{k: str(v) for k, v in asdict(cfg).items()}, "target_dir": str(model_dir / "target"),
              "kv_pages": str(kv_pages), "device": place.device.type, "dtype": place.dtype_name, "model_instances": _instances(place),
              "entry_instances": _instances(place) if cfg.target_in_orchestrator else _instances(CPU),
              "drafter_dir": str(drafter_dir or ""), "cost_table": str(cost_path if cost_path.exists() else ""),
              "idle_us": str(cfg.idle_timeout_s * 1_000_000), "default_spec_mode": default_mode,
              "drafter_in_orchestrator": str(cfg.drafter_in_orchestrator and cfg.target_in_orchestrator)}
    for name in MODEL_TENSORS:
        if (name == "drafter" and not drafter_dir) or (name == "target" and cfg.target_in_orchestrator):
            continue
        shutil.copytree(TEMPLATES / name, out_dir / name, ignore=shutil.ignore_patterns("__pycache__", ".gitkeep"))
        config_path = out_dir / name / "config.pbtxt"
        config_path.write_text(string.Template(config_path.read_text()).substitute(fields, **_tensors(name)))
    if drafter_dir:
        shutil.copytree(drafter_dir, out_dir / "drafter" / "1" / "weights")
    if stock_contract_ensemble:
        _write_stock_ensemble(out_dir / stock_contract_ensemble, cfg.max_batch_size)
    return out_dir


def models_to_load(repository: str | Path) -> list[str]:
    """The models a server of `repository` loads when it starts: all of them, except the `drafter` model where the
    drafter runs in the orchestrator's process (`drafter_in_orchestrator`); a published `drafter_<n>` is loaded
    when it is published."""
    from adaflash_contract.wire import ENTRY

    names = sorted(p.name for p in Path(repository).iterdir() if (p / "config.pbtxt").exists())
    entry = Path(repository) / ENTRY / "config.pbtxt"
    here = entry.exists() and re.search(r'key: "drafter_in_orchestrator" value: \{ string_value: "True" \}',
                                        entry.read_text())
    return [n for n in names if not (here and n == "drafter")]  # protocol.DRAFTER, whose module imports torch


def _write_stock_ensemble(path: Path, max_batch_size: int) -> None:
    from adaflash.serving.protocol import ENTRY, STOCK_CONTRACT

    inputs, outputs = STOCK_CONTRACT
    (path / "1").mkdir(parents=True)
    maps = "\n".join([*(f'      input_map {{ key: "{s.name}" value: "{s.name}" }}' for s in inputs),
                      *(f'      output_map {{ key: "{s.name}" value: "{s.name}" }}' for s in outputs)])
    (path / "config.pbtxt").write_text(string.Template(STOCK_ENSEMBLE).substitute(
        name=path.name, max_batch_size=max_batch_size, inputs=_tensor_list(inputs, True),
        outputs=_tensor_list(outputs, False), entry=ENTRY, maps=maps))


def pages_for_budget(cfg: RepositoryConfig, model_dir: Path, drafter_dir: Path | None, place: Placement) -> int:
    """The pages of `kv_page` positions that `kv_cache_memory` holds (target KV and drafter context in the served
    dtype, `models/memory.py`), or 0 (unpaged) when there is no budget or it holds max_active x max_len anyway."""
    if not cfg.kv_cache_memory:
        return 0
    from adaflash.models.checkpoint import read_config
    from adaflash.models.drafter import DrafterConfig
    from adaflash.models.memory import plan_memory, tokens_for_budget
    from adaflash.models.target import TargetConfig

    try:
        budget = byte_size(cfg.kv_cache_memory)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"kv_cache_memory: {exc}") from None
    drafter_cfg = DrafterConfig.from_hf(read_config(drafter_dir)) if drafter_dir else None
    plan = plan_memory(TargetConfig.from_hf(read_config(model_dir / "target")), drafter_cfg, place.dtype,
                       cfg.max_active, cfg.max_len)
    if cfg.kv_page < 1:
        raise ValueError(f"kv_page: must be >= 1, got {cfg.kv_page}")
    tokens = tokens_for_budget(plan, budget)
    if tokens < cfg.max_len:
        raise ValueError(f"kv_cache_memory: {cfg.kv_cache_memory} holds {tokens} positions ({plan.cache_bytes_per_token} "
                         f"bytes each in {place.dtype_name}), less than one sequence of max_len {cfg.max_len}")
    if tokens >= cfg.max_active * cfg.max_len:
        return 0
    return tokens // cfg.kv_page


def _instances(place: Placement) -> str:
    """The target's and drafter's instance group: one instance on the chosen GPU (Triton passes its id to the
    model, which places its tensors there), or on the CPU."""
    if place.device.type == "cuda":
        return f"{{ count: 1 kind: KIND_GPU gpus: [ {place.device.index or 0} ] }}"
    return "{ count: 1 kind: KIND_CPU }"


def _tensor_list(specs: tuple[TensorSpec, ...], is_input: bool) -> str:
    """A config.pbtxt `input` or `output` list body."""
    def entry(s: TensorSpec) -> str:
        extra = " optional: true" if s.optional else ""
        dims = ", ".join(map(str, s.dims))
        return f'  {{ name: "{s.name}" data_type: {s.triton_type} dims: [ {dims} ]{extra if is_input else ""} }}'
    return ",\n".join(entry(s) for s in specs)


def _tensors(model: str) -> dict[str, str]:
    from adaflash.serving.protocol import MODEL_TENSORS

    inputs, outputs = MODEL_TENSORS[model]
    return {"inputs": _tensor_list(inputs, True), "outputs": _tensor_list(outputs, False)}


# What the rest of the running server assumes of the drafter: the target features it receives, the block
# size its length policy plans for, the mask token it drafts with.
SWAP_INVARIANTS = ("hidden_size", "num_target_layers", "target_layer_ids", "block_size", "mask_token_id")


def drafter_models(repository: str | Path) -> list[str]:
    """The drafter models of a repository, oldest first: `drafter`, then each published `drafter_<n>`."""
    from adaflash.serving.protocol import drafter_models_in

    return drafter_models_in(p.name for p in Path(repository).iterdir() if (p / "config.pbtxt").exists())


def publish_drafter(repository: str | Path, drafter_dir: str | Path) -> str:
    """Add `drafter_dir` to the repository as a new drafter model (`drafter_<n>`); returns its name.

    A separate model, not a new version of `drafter`: Triton 2.51 reloads every version of a model
    when one is added, which would drop the context the running version keeps for each sequence.
    Only files are written here; the server loads the model when told (`load_model`), and the
    orchestrator sends new requests to the newest ready drafter while running ones keep theirs.
    """
    from adaflash.models.drafter import DrafterConfig
    from adaflash.serving.protocol import next_drafter_name

    names = drafter_models(repository)
    if not names:
        raise ValueError(f"{repository} has no drafter model to publish beside")
    current = Path(repository) / names[-1]
    old = DrafterConfig.from_hf(json.loads((current / "1" / "weights" / "config.json").read_text()))
    new = DrafterConfig.from_hf(json.loads((Path(drafter_dir) / "config.json").read_text()))
    for field_name in SWAP_INVARIANTS:
        if getattr(old, field_name) != getattr(new, field_name):
            raise ValueError(f"{drafter_dir}: {field_name} is {getattr(new, field_name)}, the served drafter has "
                             f"{getattr(old, field_name)}; a hot swap cannot change it (restart the server)")
    name = next_drafter_name(names[-1])
    staging = Path(repository) / f".staging-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(current, staging, ignore=shutil.ignore_patterns("weights", "__pycache__"))
    shutil.copytree(drafter_dir, staging / "1" / "weights")
    config = staging / "config.pbtxt"
    config.write_text(re.sub(r'^name: "[^"]*"', f'name: "{name}"', config.read_text(), count=1, flags=re.M))
    staging.rename(staging.parent / name)  # appears complete or not at all
    return name


def _target_context(model_dir: Path) -> int:
    from adaflash.models.target import TargetConfig

    return TargetConfig.from_hf(json.loads((model_dir / "target" / "config.json").read_text())).max_position_embeddings


def fit_to_context(cfg: RepositoryConfig, context: int) -> RepositoryConfig:
    """Shrink the prompt and output limits to the target's trained context (half each when both exceed it):
    positions beyond it were never trained, so serving them would silently degrade the text."""
    if cfg.max_prompt_tokens + cfg.max_output_tokens <= context:
        return cfg
    from adaflash.models.drafter import DEFAULT_BLOCK_SIZE

    prompt = min(cfg.max_prompt_tokens, context // 2)
    output = min(cfg.max_output_tokens, context - prompt)
    return replace(cfg, max_prompt_tokens=prompt, max_output_tokens=output,
                   max_len=min(cfg.max_len, prompt + output + DEFAULT_BLOCK_SIZE))


def tiny_model_dir(state_dir: str | Path) -> Path:
    """The seeded tiny random target and drafter written as a model folder (for tests and a first run)."""
    from adaflash.models.bundle import save_bundle, tiny_random_bundle

    path = Path(state_dir) / "models" / "tiny-random"
    if not (path / "drafter" / "config.json").exists():
        save_bundle(tiny_random_bundle(seed=0), path)
    return path


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """An option per RepositoryConfig field (`--no-<flag>` for a flag), its default the field's."""
    for f in fields(RepositoryConfig):
        if isinstance(f.default, bool):
            p.add_argument(f"--{f.name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)


def config_from_arguments(args: argparse.Namespace) -> RepositoryConfig:
    return RepositoryConfig(**{f.name: getattr(args, f.name) for f in fields(RepositoryConfig)})


def config_argv(cfg: RepositoryConfig) -> list[str]:
    """The options of `add_config_arguments` that give `cfg` back (`config_from_arguments`)."""
    argv = []
    for f in fields(RepositoryConfig):
        flag, value = f.name.replace("_", "-"), getattr(cfg, f.name)
        if isinstance(f.default, bool):
            argv.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            argv.append(f"--{flag}={value}")  # one word: an empty value or a negative number stays this option's
    return argv


def build_apart(out_dir: Path, model_dir: Path | None, drafter: str | None, config: RepositoryConfig,
                cost_table: Path | None = None) -> tuple[Path, Path]:
    """`build_repository` in a short-lived interpreter (this module's `main`), on the seeded tiny random models
    (written beside `out_dir` first) when `model_dir` is None; returns the repository and the model folder.

    Why apart: building imports torch (the device to serve on, the memory plan, the tiny models), and a process
    keeps what it imported: `adaflash serve`'s launcher would hold torch's memory for as long as its server runs,
    to use it once. A builder that fails has said why on stderr; its exit status ends the caller too."""
    source = ["--model-dir", str(model_dir)] if model_dir else ["--tiny-random"]
    table = ["--cost-table", str(cost_table)] if cost_table else []
    argv = [sys.executable, "-m", "adaflash_server.repository", str(out_dir), *source, "--drafter", drafter or "",
            *table, *config_argv(config)]
    built = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    if built.returncode:
        raise SystemExit(built.returncode)
    made = json.loads(built.stdout.strip().splitlines()[-1])
    return Path(made["model_repository"]), Path(made["model_dir"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out_dir", type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-dir", type=Path)
    src.add_argument("--tiny-random", action="store_true")
    p.add_argument("--drafter", default="drafter", help="drafter folder name in --model-dir ('' for none)")
    p.add_argument("--cost-table", type=Path, help="reuse a measured cost table (JSON)")
    p.add_argument("--stock-contract-ensemble", metavar="NAME",
                   help="also write an ensemble NAME with TensorRT-LLM's tensors only (e.g. `ensemble`, "
                        "TensorRT-LLM's own name), to try or compare clients written for that contract")
    add_config_arguments(p)
    args = p.parse_args(argv)
    cfg = config_from_arguments(args)
    model_dir = tiny_model_dir(args.out_dir.parent) if args.tiny_random else args.model_dir
    try:
        out = build_repository(args.out_dir, model_dir, args.drafter or None, cfg, args.cost_table,
                               args.stock_contract_ensemble)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(json.dumps({"model_repository": str(out), "model_dir": str(model_dir)}))


if __name__ == "__main__":
    main()

"""`adaflash train`: the AdaFlash recipe for any target, from its folder and a set of prompts, in one resumable run.

Stages, in order, each in a folder of its own under the work folder:
- regenerate: the target's own responses to the training prompts (batched on the engine, chunks shared among
  processes): the drafter learns the target, not the prompts' authors;
- dflash: the DFlash drafter on them (`dflash.fit_drafter`), from a new drafter or `--init`;
- opd: on-policy distillation with reverse KL (`opd.distill_rounds`), text generated through the drafter;
- heads: the AdaFlash length heads and their calibration (`heads.train_heads`).
A finished stage is skipped on a rerun (its drafter is saved in fp32 and loaded), a stage killed mid-way goes on
from its last checkpoint to the weights an uninterrupted run ends with. Tau per domain on the held-out prompts is
measured before the first stage and after each that changes the drafter, and the report (JSON, and a plot where
matplotlib is installed) gathers it with the loss curves. The output is a drafter folder in the published DFlash
format with the heads, which `adaflash serve --drafter` and `publish-drafter` take as is.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer

from adaflash.models.drafter import DFlashDrafter
from adaflash.models.placement import Placement, move_to, place_of
from adaflash.models.target import Transformer
from adaflash.models.tokenizer import BYTE_SPECIALS
from adaflash.training.dflash import fit_drafter, new_drafter
from adaflash.training.distributed import SINGLE, World
from adaflash.training.generation import Generation, generate_rows
from adaflash.training.heads import HEADS, HeadsSchedule, train_heads, with_heads
from adaflash.training.memory import TrainingShape, format_stage, training_plan
from adaflash.training.opd import DistillConfig, RoundSchedule, distill_rounds
from adaflash.training.precision import master_place
from adaflash.training.prompts import PromptSet
from adaflash.training.report import write_report
from adaflash.training.tau import heldout_tau

STAGES = ("dflash", "opd", "heads")  # regeneration runs whenever one of these needs its text


@dataclass(frozen=True)
class Recipe:
    """Every setting of a run; the defaults are the recipe of the shipped default drafter (`make models`)."""

    stages: tuple[str, ...] = STAGES
    seed: int = 0
    batch: int = 1  # sequences per training step, all processes together
    response_tokens: int = 256
    generation_batch: int = 32
    generation_chunk: int = 128
    layers: int = 2
    block_size: int = 16
    mask_token_id: int | None = None
    dflash_steps: int = 6000
    dflash_lr: float = 2e-3
    dflash_anchors: int = 64
    opd_kind: str = "reverse"
    opd_alpha: float = 0.5
    opd_kl_cap: float = 5.0
    opd_rounds: int = 2
    opd_prompts_per_domain: int = 40
    opd_steps: int = 300
    opd_lr: float = 3e-4
    opd_anchors: int = 32
    opd_temperatures: tuple[float, ...] = (0.0, 1.0)
    heads_steps: int = 600
    heads_anchors: int = 16
    head_dim: int = 64
    heads_holdout: float = 0.1
    heads_sequences: int | None = None  # regenerated sequences the heads learn from (None: all); their blocks are kept
    checkpoint_every: int = 200
    eval_tokens: int = 128
    feature_cache: int = 2 * 2**30
    save_dtype: str = "float16"


@dataclass
class Run:
    """What the stages share: the models' placement, the processes, the folders, the prompts."""

    target: Transformer
    tokenizer: Tokenizer
    prompts: PromptSet
    recipe: Recipe
    work: Path
    world: World = SINGLE
    progress: bool = True
    report: dict = field(default_factory=dict)

    def folder(self, stage: str) -> Path:
        return self.work / stage

    def say(self, text: str) -> None:
        if self.world.is_main and self.progress:
            print(text, flush=True)


def train(target_dir: Path, prompts: PromptSet, tokenizer: Tokenizer, out: Path, work: Path, recipe: Recipe,
          place: Placement, init: Path | None = None, world: World = SINGLE, progress: bool = True,
          stage_drafters: Path | None = None) -> dict:
    """The whole run (every process of it calls this); returns the report, which rank 0 also writes. With
    `stage_drafters`, the drafters of the DFlash and on-policy stages are also written there as `drafter-dflash`
    and `drafter-adaflash` (the names `make models` gives them; `adaflash evaluate` compares them)."""
    run = Run(Transformer.from_pretrained(target_dir, place), tokenizer, prompts, recipe, work, world, progress)
    check_work(run, target_dir, init)
    drafter = initial_drafter(run, init)
    run.report = {"target": str(target_dir), "out": str(out), "init": None if init is None else str(init),
                  "world_size": world.size, "recipe": _jsonable(dataclasses.asdict(recipe)),
                  "prompts": {"train": len(prompts.train), "heldout": len(prompts.heldout)},
                  "stages": {}, "tau": {}}
    print_plan(run, drafter)
    measure_tau(run, "initial", drafter)
    rows = regenerate_stage(run) if set(recipe.stages) & {"dflash", "heads"} else []
    if "dflash" in recipe.stages:
        drafter = dflash_stage(run, drafter, rows)
    if "opd" in recipe.stages:
        drafter = opd_stage(run, drafter)
    if "heads" in recipe.stages:
        drafter = heads_stage(run, drafter, rows)
    if world.is_main:
        _save(drafter, out, getattr(torch, recipe.save_dtype))
        calibration = run.folder("heads") / "calibration.json"
        if "heads" in recipe.stages and calibration.exists():
            shutil.copy(calibration, out / "calibration.json")
        if stage_drafters is not None:
            export_stage_drafters(run, stage_drafters, getattr(torch, recipe.save_dtype))
        write_report(run.report, work)
        run.say(f"drafter: {out}  report: {work / 'report.json'}")
    world.barrier()
    return run.report


def check_work(run: Run, target_dir: Path, init: Path | None) -> None:
    """A work folder serves one run: the same prompts, global batch, seed and start; a rerun with others would
    mix two runs' checkpoints, so it is refused, naming the folder."""
    manifest = {"prompts": run.prompts.fingerprint(), "batch": run.recipe.batch, "seed": run.recipe.seed,
                "init": None if init is None else str(init.resolve()), "target": str(target_dir.resolve())}
    path = run.work / "run.json"
    if path.exists():
        have = json.loads(path.read_text())
        differ = sorted(k for k in manifest if have.get(k) != manifest[k])
        if differ:
            raise ValueError(f"{run.work} holds a run with other {', '.join(differ)}: give another --work, or "
                             "remove it to start again")
    run.world.barrier()
    if run.world.is_main and not path.exists():
        run.work.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=1) + "\n")
    run.world.barrier()


def mask_token(tokenizer: Tokenizer, target: Transformer, asked: int | None) -> int:
    """The drafter's mask id: the one asked, the project's mask token, else the first embedding row no token uses
    (what the published Qwen3 drafters use); ValueError when none is free."""
    if asked is not None:
        return asked
    own = tokenizer.token_to_id(BYTE_SPECIALS[2])
    if own is not None:
        return own
    used = tokenizer.get_vocab_size(with_added_tokens=True)
    if used < target.config.vocab_size:
        return used
    raise ValueError("the tokenizer uses every embedding row: give --mask-token-id")


def initial_drafter(run: Run, init: Path | None) -> DFlashDrafter:
    """A new drafter shaped for the target, or `init`'s weights and shape without its length heads (they are
    fitted last, on the final drafter), in fp32 where the target is."""
    master = master_place(place_of(run.target))
    if init is None:
        return new_drafter(run.target, mask_token(run.tokenizer, run.target, run.recipe.mask_token_id),
                           run.recipe.layers, run.recipe.block_size, run.recipe.seed)
    loaded = DFlashDrafter.from_pretrained(init)
    bare = DFlashDrafter(dataclasses.replace(loaded.config, length_head=False, position_head=False))
    bare.load_state_dict({k: v for k, v in loaded.state_dict().items() if not k.startswith(tuple(HEADS.values()))})
    bare.check_target(run.target)
    return move_to(bare, master)


def print_plan(run: Run, drafter: DFlashDrafter) -> None:
    """Each stage's memory and arithmetic (rank 0), before anything heavy runs."""
    plan = training_plan(run.target.config, drafter.config, shape_of(run, drafter))
    run.report["memory_plan"] = plan
    for stage in ("regenerate", *run.recipe.stages):
        run.say(format_stage(stage, plan[stage]))


def shape_of(run: Run, drafter: DFlashDrafter) -> TrainingShape:
    return training_shape(run.recipe, run.prompts, place_of(run.target).dtype_name, run.world.size)


def training_shape(recipe: Recipe, prompts: PromptSet, dtype: str, processes: int) -> TrainingShape:
    """The sizes the memory plan reads, from the recipe and the tokenized prompts."""
    r, train = recipe, prompts.train
    domains = len({d for d, _ in train})
    return TrainingShape(dtype=dtype, sequence_tokens=max((len(p) for _, p in train), default=1) + r.response_tokens,
                         anchors=r.dflash_anchors, sequences=len(train), steps=r.dflash_steps, batch=r.batch,
                         generation_slots=r.generation_batch, response_tokens=r.response_tokens,
                         opd_sequences=domains * r.opd_prompts_per_domain * r.opd_rounds,
                         opd_steps=r.opd_steps * r.opd_rounds, heads_anchors=r.heads_anchors,
                         feature_cache=r.feature_cache, heads_sequences=min(r.heads_sequences or len(train), len(train)),
                         processes=processes)


def measure_tau(run: Run, point: str, drafter: DFlashDrafter) -> dict:
    """Held-out tau per domain after `point` (rank 0 measures, once: kept in the work folder for reruns)."""
    path = run.work / "tau" / f"{point}.json"
    if run.world.is_main and not path.exists() and run.prompts.heldout:
        drafter.eval()
        figures = heldout_tau(run.target, drafter, run.prompts.heldout, run.recipe.eval_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures) + "\n")
    run.world.barrier()
    figures = json.loads(path.read_text()) if path.exists() else {}
    run.report["tau"][point] = figures
    run.say(f"[tau {point}] " + " ".join(f"{d}={t}" for d, t in figures.items()))
    return figures


def regenerate_stage(run: Run) -> list[dict]:
    """The target's greedy responses to every training prompt."""
    started = time.perf_counter()
    run.say(f"[regenerate] {len(run.prompts.train)} prompts, {run.recipe.response_tokens} tokens each")
    how = Generation(run.recipe.response_tokens, run.recipe.generation_batch, run.recipe.generation_chunk,
                     seed=run.recipe.seed)
    rows = generate_rows(run.target, None, [p for _, p in run.prompts.train], [d for d, _ in run.prompts.train],
                         run.folder("regenerate"), how, run.world, run.progress)
    run.report["stages"]["regenerate"] = {"sequences": len(rows), "seconds": round(time.perf_counter() - started, 1),
                                          "response_tokens": sum(len(r["response"]) for r in rows)}
    return rows


def dflash_stage(run: Run, drafter: DFlashDrafter, rows: list[dict]) -> DFlashDrafter:
    """The DFlash recipe on the regenerated text; skipped when its drafter is saved."""
    folder, r = run.folder("dflash"), run.recipe
    if not _done(folder):
        started = time.perf_counter()
        sequences = [(row["prompt"] + row["response"], len(row["prompt"])) for row in rows]
        fit_drafter(drafter, run.target, sequences, r.dflash_steps, lr=r.dflash_lr, anchors_per_seq=r.dflash_anchors,
                    seed=r.seed, run_dir=folder, checkpoint_every=r.checkpoint_every, progress=run.progress,
                    batch=r.batch, world=run.world, desc="dflash", feature_cache=r.feature_cache)
        _finish(run, folder, drafter, {"sequences": len(sequences), "seconds": round(time.perf_counter() - started, 1)})
    drafter = _load(folder, drafter)
    _record(run, "dflash", folder, [folder / "metrics.jsonl"])
    run.report["stages"]["dflash"]["tau_before"] = _last_tau(run)
    run.report["stages"]["dflash"]["tau_after"] = measure_tau(run, "dflash", drafter)
    return drafter


def opd_stage(run: Run, drafter: DFlashDrafter) -> DFlashDrafter:
    """On-policy distillation rounds with reverse KL; skipped when its drafter is saved."""
    folder, r = run.folder("opd"), run.recipe
    if not _done(folder):
        started = time.perf_counter()
        how = Generation(r.response_tokens, r.generation_batch, r.generation_chunk)
        drafter = distill_rounds(run.target, drafter, folder, DistillConfig(r.opd_kind, r.opd_alpha, r.opd_kl_cap),
                                 r.opd_rounds, lambda k: run.prompts.round_prompts(k, r.opd_prompts_per_domain, r.seed),
                                 RoundSchedule(r.opd_steps, r.opd_lr, r.opd_anchors, r.batch, r.feature_cache), r.response_tokens,
                                 r.opd_temperatures, r.seed, world=run.world, generation=how,
                                 version_dtype=torch.float32, progress=run.progress)
        _finish(run, folder, drafter, {"seconds": round(time.perf_counter() - started, 1)})
    drafter = _load(folder, drafter)
    _record(run, "opd", folder, [folder / f"round-{k}" / "metrics.jsonl" for k in range(1, r.opd_rounds + 1)])
    run.report["stages"]["opd"]["tau_before"] = _last_tau(run)
    run.report["stages"]["opd"]["tau_after"] = measure_tau(run, "opd", drafter)
    return drafter


def heads_stage(run: Run, drafter: DFlashDrafter, rows: list[dict]) -> DFlashDrafter:
    """The length heads on the final drafter, fitted by rank 0 alone (small next to the drafter's training)."""
    folder, r = run.folder("heads"), run.recipe
    drafter = with_heads(drafter, r.head_dim, r.seed)
    drafter = move_to(drafter, master_place(place_of(run.target)))
    if not _done(folder):
        summary: dict = {}
        if run.world.is_main:
            started = time.perf_counter()
            report, losses = train_heads(drafter, run.target, heads_rows(rows, r), HeadsSchedule(r.heads_steps, r.heads_anchors,
                                                                                 r.heads_holdout), r.seed,
                                         progress=run.progress)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "calibration.json").write_text(json.dumps(report, indent=1) + "\n")
            (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "loss": round(x, 4)}) + "\n"
                                                          for i, x in enumerate(losses)))
            summary = {"seconds": round(time.perf_counter() - started, 1)}
        _finish(run, folder, drafter, summary)
    drafter = _load(folder, drafter)
    _record(run, "heads", folder, [folder / "metrics.jsonl"])
    calibration = json.loads((folder / "calibration.json").read_text())
    run.report["stages"]["heads"]["calibration"] = {k: v for k, v in calibration.items() if k != "per_position"}
    tau = _last_tau(run)
    run.report["stages"]["heads"].update(tau_before=tau, tau_after=tau)  # the heads never change a draft
    return drafter


STAGE_DRAFTERS = {"dflash": "drafter-dflash", "opd": "drafter-adaflash"}


def export_stage_drafters(run: Run, folder: Path, dtype: torch.dtype) -> None:
    """Each finished drafter stage's drafter, in the published format, beside the final one."""
    for stage, name in STAGE_DRAFTERS.items():
        if _done(run.folder(stage)):
            _save(DFlashDrafter.from_pretrained(run.folder(stage) / "drafter"), folder / name, dtype)


def heads_rows(rows: list[dict], recipe: Recipe) -> list[dict]:
    """The sequences the heads learn from: all, or a seeded sample of `heads_sequences` (every block's hidden states
    are held at once: on a large target, all of them would not fit a device)."""
    if recipe.heads_sequences is None or recipe.heads_sequences >= len(rows):
        return rows
    picked = random.Random(recipe.seed).sample(range(len(rows)), recipe.heads_sequences)
    return [rows[i] for i in sorted(picked)]


def _done(folder: Path) -> bool:
    return (folder / "done.json").exists()


def _finish(run: Run, folder: Path, drafter: DFlashDrafter, summary: dict) -> None:
    """Rank 0 saves the stage's drafter in fp32 (a rerun resumes from exactly these weights), then marks it done."""
    if run.world.is_main:
        drafter.save_pretrained(folder / "drafter", dtype=torch.float32)
        (folder / "done.json").write_text(json.dumps(summary) + "\n")
    run.world.barrier()


def _load(folder: Path, like: DFlashDrafter) -> DFlashDrafter:
    """The stage's saved drafter, where `like` lives."""
    return DFlashDrafter.from_pretrained(folder / "drafter", place_of(like)).eval()


def _record(run: Run, stage: str, folder: Path, metrics: list[Path]) -> None:
    """The stage's summary and its whole loss curve (all attempts, from its metrics files) in the report."""
    losses = [json.loads(line)["loss"] for path in metrics if path.exists() for line in path.read_text().splitlines()]
    run.report["stages"][stage] = {**json.loads((folder / "done.json").read_text()), "losses": losses}


def _last_tau(run: Run) -> dict:
    return list(run.report["tau"].values())[-1] if run.report["tau"] else {}


def _save(drafter: DFlashDrafter, out: Path, dtype: torch.dtype) -> None:
    """The drafter in the published format (its heads included), replacing what `out` held."""
    if out.exists():
        shutil.rmtree(out)
    drafter.save_pretrained(out, dtype=dtype)


def _jsonable(value: object) -> object:
    return json.loads(json.dumps(value, default=str))

"""The `adaflash train` command line (an `adaflash.commands` entry point) and `python -m adaflash.training`, which
torchrun starts once per process: `torchrun --nproc-per-node N -m adaflash.training ARGS`, or `adaflash train
--nproc N ARGS`, which starts that torchrun itself.

Only argparse at import: `adaflash` loads every registered command to list it, and torch is imported when a run
starts, not then.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

DESCRIPTION = ("Train an AdaFlash drafter (DFlash drafter, reverse-KL on-policy distillation, length heads) for a "
               "Hugging Face target from a prompt file, resumable, on one process or under torchrun "
               "(docs/training.md).")


def register(sub: argparse._SubParsersAction) -> None:
    """`adaflash train`."""
    p = sub.add_parser("train", help="train an AdaFlash drafter for a target from prompts (docs/training.md)",
                       description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=lambda args: run_command(args, _argv_after("train")))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="adaflash train", description=DESCRIPTION)
    add_arguments(p)
    return p


def _byte_size(text: str) -> int:
    from adaflash.cli_args import byte_size  # noqa: PLC0415 (keeps this module's import light)

    return byte_size(text)


def _csv_floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _stages(text: str) -> tuple[str, ...]:
    from adaflash.training.recipe import STAGES  # noqa: PLC0415 (torch: only when parsing a run's options)

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in STAGES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"stages are some of {','.join(STAGES)}, got {text!r}")
    return tuple(s for s in STAGES if s in names)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option; each stage's default is the recipe's (`recipe.Recipe`)."""
    p.add_argument("--target", type=Path, required=True,
                   help="the target's Hugging Face folder (config.json, safetensors, tokenizer.json; chat template)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="JSON lines with `prompt` or chat `messages` and optional `domain` (or a "
                                       "`datasets` dataset name or folder, where that library is installed)")
    src.add_argument("--data", type=Path, help="instead: a corpus folder in `make models`' layout "
                                                "(python_backend/adaflash/data/README.md)")
    p.add_argument("--out", type=Path, required=True, help="the drafter folder to write (published DFlash format)")
    p.add_argument("--work", type=Path, help="checkpoints, generated text, report (default: work/train-<out name>)")
    p.add_argument("--stage-drafters", type=Path,
                   help="also write the DFlash and on-policy stages' drafters here (drafter-dflash, drafter-adaflash)")
    p.add_argument("--init", type=Path, help="a drafter folder to start from (e.g. a published DFlash drafter)")
    p.add_argument("--stages", type=_stages, default=None, help="some of dflash,opd,heads (default: all)")
    p.add_argument("--nproc", type=int, default=1, help="processes (devices) on this node: starts torchrun")
    p.add_argument("--plan-only", action="store_true", help="print each stage's memory and arithmetic and stop")
    p.add_argument("--no-progress", action="store_true", help="no progress bars and stage lines")
    p.add_argument("--chat", action="store_true", help="each `prompt` as the one user message of a conversation in "
                                                       "the target's chat template (`messages` always are)")
    p.add_argument("--chat-kwargs", type=json.loads, default={}, help="the template's switches, a JSON object")
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="a longer prompt keeps its last tokens")
    p.add_argument("--heldout-per-domain", type=int, default=8, help="prompts per domain kept out for tau")
    p.add_argument("--prompts-per-domain", type=int, default=700, help="with --data: training prompts per domain")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, help="sequences per training step, all processes together "
                                             "(default: the number of processes; fixed by the run's first start)")
    p.add_argument("--response-tokens", type=int, default=256)
    p.add_argument("--generation-batch", type=int, default=32, help="sequences the engine decodes at once")
    p.add_argument("--generation-chunk", type=int, default=128, help="prompts per generation chunk (checkpoint)")
    p.add_argument("--layers", type=int, default=2, help="drafter layers (a new drafter)")
    p.add_argument("--block-size", type=int, default=16, help="drafter block (a new drafter)")
    p.add_argument("--mask-token-id", type=int, help="a new drafter's mask id (default: the tokenizer's mask "
                                                     "token, else the first embedding row no token uses)")
    p.add_argument("--dflash-steps", type=int, default=6000)
    p.add_argument("--dflash-lr", type=float, default=2e-3)
    p.add_argument("--dflash-anchors", type=int, default=64, help="blocks per sequence and step")
    p.add_argument("--opd-rounds", type=int, default=2)
    p.add_argument("--opd-prompts-per-domain", type=int, default=40, help="fresh prompts per domain and round")
    p.add_argument("--opd-steps", type=int, default=300, help="per round")
    p.add_argument("--opd-lr", type=float, default=3e-4)
    p.add_argument("--opd-anchors", type=int, default=32)
    p.add_argument("--opd-temperatures", type=_csv_floats, default=(0.0, 1.0), help="prompts alternate between these")
    p.add_argument("--opd-alpha", type=float, default=0.5, help="weight of the cross-entropy to the target's argmax")
    p.add_argument("--opd-kl-cap", type=float, default=5.0)
    p.add_argument("--heads-steps", type=int, default=600)
    p.add_argument("--heads-anchors", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--heads-holdout", type=float, default=0.1, help="share of sequences kept for calibration")
    p.add_argument("--heads-sequences", type=int, help="regenerated sequences the heads learn from (default: all; "
                                                       "their blocks are held at once: cap it on a large target)")
    p.add_argument("--feature-cache", type=_byte_size, default="2GiB",
                   help="target features kept between training steps, on the device (beyond: recomputed)")
    p.add_argument("--checkpoint-every", type=int, default=200, help="training steps between checkpoints")
    p.add_argument("--eval-tokens", type=int, default=128, help="tokens per held-out prompt for tau")
    p.add_argument("--save-dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (each process takes cuda:LOCAL_RANK)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the target's dtype (default: bfloat16 on CUDA, float32 on CPU); the drafter trains in fp32")


def main(argv: list[str] | None = None) -> int:
    """`python -m adaflash.training ARGS`: the same options as `adaflash train`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_command(build_parser().parse_args(argv), argv)


def _argv_after(command: str) -> list[str]:
    """This process's arguments after the subcommand's name: what a torchrun relaunch passes on."""
    return sys.argv[sys.argv.index(command) + 1:] if command in sys.argv else sys.argv[1:]


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ and not args.plan_only:
        return launch(args.nproc, argv)
    from adaflash.training.run import run_from_args  # noqa: PLC0415 (torch)

    return run_from_args(args)


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """torchrun on this node (a free port of its own: --standalone), each process running `python -m
    adaflash.training` with these arguments less --nproc."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "adaflash.training", *rest]


def launch(nproc: int, argv: list[str]) -> int:
    """Run the processes and wait for them; torchrun's exit status."""
    return subprocess.call(torchrun_command(nproc, argv))

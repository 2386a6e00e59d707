"""From `adaflash train`'s options to a run: the process's world and device, the prompts, the recipe."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adaflash.models.chat_template import load_chat_template
from adaflash.models.checkpoint import read_config
from adaflash.models.drafter import DrafterConfig, default_target_layer_ids
from adaflash.models.layers import RopeConfig
from adaflash.models.placement import Placement, placement
from adaflash.models.target import TargetConfig
from adaflash.models.tokenizer import load_tokenizer
from adaflash.training.distributed import World, process_group, world_from_env
from adaflash.training.memory import format_stage, training_plan
from adaflash.training.prompts import PromptSet, corpus_prompts, file_prompts
from adaflash.training.recipe import STAGES, Recipe, train, training_shape


def recipe_of(args: argparse.Namespace, batch: int) -> Recipe:
    """The options' recipe (`batch`: the run's global batch, fixed at its first start)."""
    return Recipe(stages=args.stages or STAGES, seed=args.seed, batch=batch, response_tokens=args.response_tokens,
                  generation_batch=args.generation_batch, generation_chunk=args.generation_chunk, layers=args.layers,
                  block_size=args.block_size, mask_token_id=args.mask_token_id, dflash_steps=args.dflash_steps,
                  dflash_lr=args.dflash_lr, dflash_anchors=args.dflash_anchors, opd_alpha=args.opd_alpha,
                  opd_kl_cap=args.opd_kl_cap, opd_rounds=args.opd_rounds,
                  opd_prompts_per_domain=args.opd_prompts_per_domain, opd_steps=args.opd_steps, opd_lr=args.opd_lr,
                  opd_anchors=args.opd_anchors, opd_temperatures=tuple(args.opd_temperatures),
                  heads_steps=args.heads_steps, heads_anchors=args.heads_anchors, head_dim=args.head_dim,
                  heads_holdout=args.heads_holdout, heads_sequences=args.heads_sequences,
                  feature_cache=args.feature_cache, checkpoint_every=args.checkpoint_every,
                  eval_tokens=args.eval_tokens, save_dtype=args.save_dtype)


def run_batch(args: argparse.Namespace, work: Path, world: World) -> int:
    """The global batch: the one the work folder's run started with, else --batch, else the world size; it
    must split over this run's processes."""
    manifest = work / "run.json"
    started = json.loads(manifest.read_text())["batch"] if manifest.exists() else None
    if started is not None and args.batch is not None and args.batch != started:
        raise ValueError(f"--batch {args.batch}: {work} holds a run with batch {started}")
    batch = started or args.batch or world.size
    if batch % world.size:
        raise ValueError(f"batch {batch} does not split over {world.size} processes: give --batch (a multiple)")
    return batch


def device_of(args: argparse.Namespace, world: World) -> Placement:
    """The process's placement: under torchrun on CUDA, the GPU of its local rank."""
    place = placement(args.device, args.dtype)
    if place.device.type == "cuda" and world.size > 1:
        place = placement(f"cuda:{world.local_rank}", args.dtype)
    return place


def load_prompts(args: argparse.Namespace, target_dir: Path) -> PromptSet:
    """The run's prompts: the corpus folder's (--data) or the prompt file's, tokenized by the target's tokenizer."""
    tokenizer = load_tokenizer(target_dir)
    if args.data is not None:
        return corpus_prompts(args.data, tokenizer, args.prompts_per_domain, args.max_prompt_tokens, args.seed,
                              args.heldout_per_domain)
    chat = load_chat_template(target_dir, **args.chat_kwargs)
    if args.chat and chat is None:
        raise ValueError(f"--chat: {target_dir} has no chat template")
    return file_prompts(args.prompts, tokenizer, chat, args.max_prompt_tokens, args.heldout_per_domain, args.chat)


def plan_only(args: argparse.Namespace, recipe: Recipe, prompts: PromptSet, processes: int) -> int:
    """Print each stage's memory and arithmetic from the configs alone (no weights read)."""
    target = TargetConfig.from_hf(read_config(args.target))
    if args.init is not None:
        drafter = DrafterConfig.from_hf(read_config(args.init))
    else:
        drafter = _new_drafter_config(target, recipe)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    shape = training_shape(recipe, prompts, dtype, processes)
    plan = training_plan(target, drafter, shape)
    for stage in ("regenerate", *recipe.stages):
        print(format_stage(stage, plan[stage]))
    return 0


def _new_drafter_config(target: TargetConfig, recipe: Recipe) -> DrafterConfig:
    """The shape `dflash.new_drafter` gives a drafter for `target`, without building it."""
    return DrafterConfig(hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
                         num_hidden_layers=recipe.layers, num_attention_heads=target.num_attention_heads,
                         num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
                         rope=RopeConfig(head_dim=target.head_dim, theta=target.rope.theta),
                         rms_norm_eps=target.rms_norm_eps, block_size=recipe.block_size,
                         num_target_layers=target.num_hidden_layers,
                         target_layer_ids=default_target_layer_ids(target.num_hidden_layers, recipe.layers),
                         mask_token_id=0, length_head=False, length_head_dim=recipe.head_dim, hf={})


def run_from_args(args: argparse.Namespace) -> int:
    """One process of the run (all of it, without torchrun); with --plan-only, the plan for --nproc processes."""
    world = world_from_env()
    work = args.work or Path("work") / f"train-{args.out.name}"
    planned = World(size=max(world.size, args.nproc)) if args.plan_only else world
    try:
        prompts = load_prompts(args, args.target)
        recipe = recipe_of(args, run_batch(args, work, planned))
    except (ValueError, FileNotFoundError) as exc:
        print(f"adaflash train: error: {exc}", file=sys.stderr)
        return 2
    if args.plan_only:
        return plan_only(args, recipe, prompts, planned.size) if world.is_main else 0
    place = device_of(args, world)
    with process_group(world, place.device) as world:
        try:
            train(args.target, prompts, load_tokenizer(args.target), args.out, work, recipe, place, args.init, world,
                  progress=not args.no_progress, stage_drafters=args.stage_drafters)
        except ValueError as exc:
            print(f"adaflash train: error: {exc}", file=sys.stderr)
            return 2
    return 0

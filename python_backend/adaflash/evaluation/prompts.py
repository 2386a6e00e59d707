"""Prompts for the tools that send them: `adaflash bench`, `adaflash evaluate`, the gRPC benchmark
and the Locust load all read the same JSON-lines format, so they share one type and one reader.

Standard library only (the corpus module included): the Locust process imports this and must
not load torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING

from adaflash.corpus import DOMAINS, PROMPT_DOMAINS, as_prompt

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from adaflash.models.chat_template import ChatTemplate

SAMPLE_PROMPTS: Traversable = resources.files("adaflash") / "data" / "sample_prompts.jsonl"
# A data folder of its own: eval/ holds the first rows of each evaluation set (data/README.md), what `make bench`,
# `make evaluate` and the benchmarks read unless given a full data folder (`--data`, `--eval-data`).
PACKAGED_DATA = Path(str(resources.files("adaflash") / "data"))
# Translation, summarisation, qa, rag, code and math from held-out rows (data/README.md). Its rows carry a
# `split`: a tuning run may read `tune` rows only, so that `holdout` rows measure what tuning did not see.
BROAD_MIX: Traversable = resources.files("adaflash") / "data" / "broad_mix.jsonl"
SPLITS = ("tune", "holdout")
EVAL_SETS = {"chat": "mt_bench.jsonl", "code": "humaneval.jsonl", "math": "gsm8k_test.jsonl",
             "multilingual": "heldout_multilingual.jsonl", "prose": "heldout_prose.jsonl"}


@dataclass(frozen=True)
class Prompt:
    text: str
    domain: str | None  # None when neither the row nor its reader names one
    id: str


def read_jsonl(source: Path | Traversable, domain: str | None = None, id_prefix: str = "",
               split: str | None = None) -> list[Prompt]:
    """One prompt per non-blank line: an object with `prompt` and optionally `domain` and `id` (the format
    of the packaged sample prompts and of the shared evaluation sets). A row without a domain takes
    `domain`, one without an id `id_prefix` followed by its line index, so ids stay unique per file.
    With `split`, only the rows whose `split` field is that one; a file with none of them is an error,
    so a tuning run pointed at an unsplit file stops instead of tuning on prompts meant for evaluation."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    prompts = []
    for i, line in enumerate(source.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if "prompt" not in row:
            raise ValueError(f"{source}: line {i + 1} has no 'prompt' field")
        if split is not None and row.get("split") != split:
            continue
        row_domain = str(row["domain"]) if row.get("domain") else domain
        prompts.append(Prompt(row["prompt"], row_domain, str(row.get("id", f"{id_prefix}{i}"))))
    if split is not None and not prompts:
        raise ValueError(f"{source}: no rows with split {split!r}")
    return prompts


def load_prompts(path: str | Path | None, limit: int | None, split: str | None = None) -> list[Prompt]:
    """A JSON-lines file (the packaged sample prompts without `path`), only its `split` rows when given
    (see read_jsonl); with `limit`, domains take turns so every domain is represented."""
    prompts = read_jsonl(SAMPLE_PROMPTS if path is None else Path(path), split=split)
    if limit is None or limit >= len(prompts):
        return prompts
    return _domains_in_turn(prompts, limit)


def _domains_in_turn(prompts: list[Prompt], limit: int) -> list[Prompt]:
    by_domain: dict[str | None, list[Prompt]] = {}
    for p in prompts:
        by_domain.setdefault(p.domain, []).append(p)
    picked: list[Prompt] = []
    while len(picked) < limit:
        for group in by_domain.values():
            if group and len(picked) < limit:
                picked.append(group.pop(0))
    return picked


def eval_prompts(data_dir: str | Path, per_domain: int, training_template: bool = True) -> dict[str, list[str]]:
    """The first `per_domain` prompts of each domain's evaluation set, questions in the training template (without
    it, as written: for a chat template to wrap instead)."""
    out = {}
    for domain in DOMAINS:
        texts = [p.text for p in read_jsonl(Path(data_dir) / "eval" / EVAL_SETS[domain])[:per_domain]]
        out[domain] = [as_prompt(t) for t in texts] if training_template and domain in PROMPT_DOMAINS else texts
    return out


def eval_set_prompts(data_dir: str | Path, per_domain: int, training_template: bool = True) -> list[Prompt]:
    """eval_prompts as benchmark prompts, domain by domain."""
    return [Prompt(text, domain, f"{domain}/{i}")
            for domain, texts in eval_prompts(data_dir, per_domain, training_template).items()
            for i, text in enumerate(texts)]


def encode_prompts(tokenizer: Tokenizer, prompts: list[Prompt], max_prompt_tokens: int,
                   chat: ChatTemplate | None = None) -> list[list[int]]:
    """Token ids per prompt; long prompts keep their last `max_prompt_tokens` tokens (the part nearest the answer).
    With `chat`, each prompt is the one user message of a conversation in the target's chat template: the text a
    chat model's drafter was trained on."""
    return [(tokenizer.encode(p.text).ids if chat is None else chat.encode_user(tokenizer, p.text))[-max_prompt_tokens:]
            for p in prompts]

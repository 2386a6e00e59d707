"""The prompts a training run learns from, and the held-out ones it measures tau on.

Sources: a JSON-lines file (rows with `prompt`, or a chat conversation in `messages`; optional `domain`), a
Hugging Face `datasets` dataset (a name or a saved folder, where the library is installed) with the same
columns, or a corpus folder (`--data`, the layout `make models` reads: its prompts are drawn as
`adaflash-train-drafter` draws them, its held-out prompts are the corpus's `eval/heldout_<domain>.jsonl`).
A prompt file is split by a fixed seed into training and held-out prompts per domain, so that a rerun, a resumed
run and every process of a run see the same split.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from adaflash.corpus import DOMAINS, PROMPT_DOMAINS, as_prompt
from adaflash.models.chat_template import ChatTemplate
from adaflash.training.dflash import training_prompts

NO_DOMAIN = "all"  # the domain of rows that name none
SPLIT_SEED = 20261207  # the held-out split's seed: fixed, so that it never moves with --seed


Tagged = list[tuple[str, list[int]]]  # (domain, prompt ids)


@dataclass
class PromptSet:
    """Training prompts (the whole pool: regeneration and the DFlash stage train on all of it) and held-out
    prompts (tau before and after each stage), tokenized; `round_prompts` gives the on-policy rounds theirs."""

    train: Tagged
    heldout: Tagged
    corpus: Path | None = None  # rounds draw fresh prompts from the corpus, as adaflash-train-opd does
    tokenizer: Tokenizer | None = None
    max_prompt_tokens: int = 256

    def round_prompts(self, r: int, per_domain: int, seed: int) -> Tagged:
        """Round `r`'s prompts: `per_domain` of each domain, drawn afresh from the corpus, else sampled from the
        training pool (seeded by round, in pool order)."""
        if self.corpus is not None:
            return training_prompts(self.corpus, self.tokenizer, per_domain, self.max_prompt_tokens, seed + 1000 * r)
        rng = random.Random(seed + 1000 * r)
        picked: list[int] = []
        for domain in sorted({d for d, _ in self.train}):
            idx = [i for i, (d, _) in enumerate(self.train) if d == domain]
            picked += rng.sample(idx, min(per_domain, len(idx)))
        return [self.train[i] for i in sorted(picked)]

    def fingerprint(self) -> str:
        """What the work folder was made for: a rerun with other prompts must not resume from it."""
        blob = json.dumps([self.train, self.heldout]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def read_rows(source: str) -> list[dict]:
    """Rows of a JSON-lines file, or of a `datasets` dataset (a saved folder or a hub name; its train split)."""
    path = Path(source)
    if path.is_file():
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
        return rows
    return _dataset_rows(source)


def _dataset_rows(source: str) -> list[dict]:
    """A Hugging Face dataset's rows; the library is optional, so its absence is said plainly."""
    try:
        import datasets  # noqa: PLC0415 (optional)
    except ModuleNotFoundError:
        raise ValueError(f"--prompts {source}: no such file, and the `datasets` library that would read it as a "
                         "dataset is not installed") from None
    data = datasets.load_from_disk(source) if Path(source).is_dir() else datasets.load_dataset(source)
    if isinstance(data, datasets.DatasetDict):
        data = data["train"] if "train" in data else next(iter(data.values()))
    return [dict(row) for row in data]


def encode_row(row: dict, n: int, tokenizer: Tokenizer, chat: ChatTemplate | None, max_prompt_tokens: int,
               wrap: bool = False) -> list[int]:
    """One row's prompt ids, its last `max_prompt_tokens` (the part nearest the answer): a conversation in the
    target's chat template `chat`, a `prompt` as written (or, with `wrap`, as the one user message of one)."""
    if "messages" in row:
        if chat is None:
            raise ValueError(f"prompt row {n}: `messages` need the target's chat template, and it has none")
        ids = chat.encode(tokenizer, row["messages"])
    elif "prompt" in row:
        ids = chat.encode_user(tokenizer, row["prompt"]) if wrap and chat else tokenizer.encode(row["prompt"]).ids
    else:
        raise ValueError(f"prompt row {n}: needs `prompt` or `messages`, has {sorted(row)}")
    return ids[-max_prompt_tokens:]


def split_heldout(tagged: Tagged, per_domain: int) -> tuple[Tagged, Tagged]:
    """`per_domain` prompts of each domain held out, chosen by the fixed split seed (never more than half of a
    domain); the rest, in file order, train."""
    rng = random.Random(SPLIT_SEED)
    held: set[int] = set()
    for domain in sorted({d for d, _ in tagged}):
        idx = [i for i, (d, _) in enumerate(tagged) if d == domain]
        held.update(rng.sample(idx, min(per_domain, len(idx) // 2)))
    return ([t for i, t in enumerate(tagged) if i not in held], [t for i, t in enumerate(tagged) if i in held])


def file_prompts(source: str, tokenizer: Tokenizer, chat: ChatTemplate | None, max_prompt_tokens: int,
                 heldout_per_domain: int, wrap: bool = False) -> PromptSet:
    """A prompt file or dataset, tokenized (`encode_row`) and split."""
    rows = read_rows(source)
    if not rows:
        raise ValueError(f"--prompts {source}: no rows")
    tagged = [(str(r.get("domain") or NO_DOMAIN), encode_row(r, n, tokenizer, chat, max_prompt_tokens, wrap))
              for n, r in enumerate(rows, 1)]
    train, held = split_heldout([t for t in tagged if t[1]], heldout_per_domain)
    return PromptSet(train, held, max_prompt_tokens=max_prompt_tokens)


def corpus_prompts(data: Path, tokenizer: Tokenizer, per_domain: int, max_prompt_tokens: int, seed: int,
                   heldout_per_domain: int) -> PromptSet:
    """The recipe's prompts from a corpus folder (`adaflash-train-drafter`'s draw) and its held-out prompts."""
    train = training_prompts(data, tokenizer, per_domain, max_prompt_tokens, seed)
    held: Tagged = []
    for domain in DOMAINS:
        path = data / "eval" / f"heldout_{domain}.jsonl"
        if path.exists():
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:heldout_per_domain]]
            texts = [as_prompt(r["prompt"]) if domain in PROMPT_DOMAINS else r["prompt"] for r in rows]
            held += [(domain, tokenizer.encode(t).ids[-max_prompt_tokens:]) for t in texts]
    return PromptSet(train, [h for h in held if h[1]], corpus=data, tokenizer=tokenizer,
                     max_prompt_tokens=max_prompt_tokens)

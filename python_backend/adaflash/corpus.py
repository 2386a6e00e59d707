"""The training corpus and the template the target was trained on.

Pretraining, drafter training and evaluation all read the same domains in the same template:
a drafter or an evaluation prompt that used another template would ask the target for text
it never learnt to continue. Standard library only, so the prompt loaders can use it without torch. Beside
training/ and evaluation/ rather than in either, so that both read it and neither imports the other.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

DOMAINS = ("chat", "code", "math", "multilingual", "prose")
PROMPT_DOMAINS = ("chat", "math")  # prompt/response records; the others are running text
# What a training command's --data folder holds (python_backend/adaflash/data/README.md, "Training corpus").
TRAIN_LAYOUT = ("train/<domain>.jsonl.gz for each of " + ", ".join(DOMAINS) + " (gzip JSON lines: {\"text\": ...} or "
                "{\"prompt\": ..., \"response\": ...}; layout in python_backend/adaflash/data/README.md)")


def as_prompt(question: str) -> str:
    """The template the target was trained on for prompt/response records: a blank line, then the answer."""
    return f"{question}\n\n"


def documents(data_dir: str | Path, domain: str, limit_chars: int | None = None) -> Iterator[str]:
    """Texts of one training domain; prompt/response records become as_prompt(prompt) + response."""
    total = 0
    with gzip.open(Path(data_dir) / "train" / f"{domain}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            text = r["text"] if "text" in r else as_prompt(r["prompt"]) + r["response"]
            yield text
            total += len(text)
            if limit_chars is not None and total >= limit_chars:
                return

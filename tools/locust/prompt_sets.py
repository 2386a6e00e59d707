"""Prompt sets by domain, for the Locust users. Plain Python (no Locust, no gevent), so tests import it.

Sources, any number of them:
* a JSON lines file: one object per line with `prompt` and optionally `domain` and `id` (the format
  of `python_backend/adaflash/data/sample_prompts.jsonl` and of the project's held-out sets);
  a row without `domain` takes the file's name (`math.jsonl` -> "math");
* a text file (`.txt`): one prompt per line, the domain is the file's name;
* a folder: every `.jsonl` and `.txt` file in it, in name order.

Without a source, the 20 sample prompts shipped in the `adaflash` package (5 domains) are used.
A request picks a domain first (by weight, equal by default), then a prompt of that domain at
random, so a small domain is not drowned by a large one.

Lengths in tokens (`adaflash sweep --max-prompt-tokens`, `--input-tokens`) are counted with the target's own
tokenizer, as the server counts them (`tokenizer.encode(text).ids`), and every cut falls where a token begins
in the text, so it never splits a character.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

from adaflash.cli_args import split_csv
from adaflash.evaluation.prompts import SAMPLE_PROMPTS, Prompt, read_jsonl

_CUT_TRIES = 32  # token boundaries tried around the first guess before settling for fewer tokens
_SYNTHETIC_DRAWS = 20  # windows drawn per synthetic prompt at most, before giving up on the corpus


def _from_file(path: Path) -> list[Prompt]:
    """A file's prompts; a prompt whose source names no domain or id takes the file's name."""
    if path.suffix == ".txt":
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [Prompt(line.replace("\\n", "\n"), path.stem, f"{path.stem}-{i}") for i, line in enumerate(lines)]
    return read_jsonl(path, domain=path.stem, id_prefix=f"{path.stem}-")


def load_prompt_set(sources: list[str | Path] | None = None, domains: list[str] | None = None,
                    max_chars: int | None = None) -> dict[str, list[Prompt]]:
    """Prompts grouped by domain. `domains` keeps only those (an unknown one is an error); `max_chars`
    keeps each prompt's last characters (the part nearest the answer), for servers with short limits."""
    files: list[Path] = []
    for source in sources or []:
        path = Path(source)
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".txt"))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"prompt source {path} does not exist")
    if files:
        prompts = [p for f in files for p in _from_file(f)]
    else:
        with resources.as_file(SAMPLE_PROMPTS) as path:
            prompts = _from_file(Path(path))
    if max_chars:
        prompts = [Prompt(p.text[-max_chars:], p.domain, p.id) for p in prompts]
    by_domain: dict[str, list[Prompt]] = {}
    for p in prompts:
        if p.text.strip():
            by_domain.setdefault(p.domain, []).append(p)
    if domains:
        unknown = sorted(set(domains) - set(by_domain))
        if unknown:
            raise ValueError(f"no prompts for domain(s) {', '.join(unknown)}; have {', '.join(sorted(by_domain))}")
        by_domain = {d: by_domain[d] for d in domains}
    if not by_domain:
        raise ValueError("the prompt set is empty")
    return by_domain


def cut_to_tokens(tokenizer: Tokenizer, text: str, n: int, keep: str = "end") -> str:
    """The last (keep="end") or first (keep="start") part of `text` that encodes to `n` tokens; the whole text
    when it has no more. Why a search: a cut inside a word re-encodes differently (other merges), so the naive
    cut can give n-1 or n+1 tokens; the nearest token boundaries are tried until one gives n, else the longest
    cut under n. Fewer than n happens only where a character spans several tokens (CJK with a byte-level
    tokenizer) at every boundary tried: a string cannot hold part of a character."""
    encoding = tokenizer.encode(text)
    if len(encoding.ids) <= n:
        return text
    guess = encoding.offsets[len(encoding.ids) - n if keep == "end" else n][0]
    boundaries = sorted({start for start, _ in encoding.offsets} - {0}, key=lambda c: abs(c - guess))
    best = ""
    for cut in boundaries[:_CUT_TRIES]:
        piece = text[cut:] if keep == "end" else text[:cut]
        count = len(tokenizer.encode(piece).ids)
        if count == n:
            return piece
        if count < n and len(piece) > len(best):
            best = piece
    return best


def cut_prompt_set(by_domain: dict[str, list[Prompt]], tokenizer: Tokenizer,
                   max_tokens: int) -> dict[str, list[Prompt]]:
    """Each prompt's last `max_tokens` tokens (the part nearest the answer), for servers with short limits."""
    return {domain: [Prompt(cut_to_tokens(tokenizer, p.text, max_tokens), p.domain, p.id) for p in prompts]
            for domain, prompts in by_domain.items()}


def synthetic_prompts(tokenizer: Tokenizer, corpus: list[str], n_tokens: int, count: int,
                      seed: int = 0) -> list[Prompt]:
    """`count` prompts of exactly `n_tokens` tokens: windows of the corpus text (the prompt set's) at seeded
    random token positions; a window that cannot hold exactly n_tokens (a character split across tokens at its
    end) is drawn again. Real text rather than random token ids, because a drafter's acceptance on noise says
    nothing about traffic; aiperf's synthetic prompts are corpus windows too."""
    text = "\n\n".join(corpus)
    while len(tokenizer.encode(text).ids) <= 2 * n_tokens:
        text = f"{text}\n\n{text}"
    starts = [start for start, _ in tokenizer.encode(text).offsets]
    rng = random.Random(seed)
    prompts: list[Prompt] = []
    for _ in range(count * _SYNTHETIC_DRAWS):
        first = rng.randrange(len(starts) - n_tokens)
        end = starts[first + 2 * n_tokens] if first + 2 * n_tokens < len(starts) else len(text)
        window = cut_to_tokens(tokenizer, text[starts[first]:end], n_tokens, keep="start")
        if len(tokenizer.encode(window).ids) == n_tokens:
            prompts.append(Prompt(window, "synthetic", f"synthetic-{len(prompts)}"))
            if len(prompts) == count:
                return prompts
    raise ValueError(f"the prompt set's text gives no {n_tokens}-token windows often enough (too short, or "
                     "most characters span several tokens)")


def write_prompt_set(by_domain: dict[str, list[Prompt]], path: Path) -> None:
    """As JSON lines that `load_prompt_set` reads back unchanged (domain and id kept)."""
    with path.open("w", encoding="utf-8") as f:
        for prompts in by_domain.values():
            for p in prompts:
                f.write(json.dumps({"id": p.id, "domain": p.domain, "prompt": p.text}, ensure_ascii=False) + "\n")


def parse_weights(text: str | None) -> dict[str, float]:
    """"chat=2,code=1" -> {"chat": 2.0, "code": 1.0}; domains not named keep weight 1."""
    weights = {}
    for item in split_csv(text):
        name, _, value = item.partition("=")
        weights[name.strip()] = float(value)
    return weights


class PromptSampler:
    """Draws (domain, prompt) pairs: a domain by weight, then one of its prompts uniformly."""

    def __init__(self, by_domain: dict[str, list[Prompt]], weights: dict[str, float] | None = None,
                 seed: int | None = None) -> None:
        unknown = sorted(set(weights or {}) - set(by_domain))
        if unknown:
            raise ValueError(f"weights for unknown domain(s) {', '.join(unknown)}")
        self.domains = sorted(by_domain)
        self.weights = [float((weights or {}).get(d, 1.0)) for d in self.domains]
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("domain weights must be >= 0 with a positive sum")
        self.by_domain = by_domain
        self.rng = random.Random(seed)

    def sample(self) -> Prompt:
        domain = self.rng.choices(self.domains, weights=self.weights)[0]
        return self.rng.choice(self.by_domain[domain])

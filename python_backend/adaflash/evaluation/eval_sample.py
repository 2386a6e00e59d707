"""Build the packaged evaluation sample (python_backend/adaflash/data/eval/): the rows of the evaluation sets that
`make bench`, `make evaluate` and the benchmarks read by default, so that they run on a clone without the shared
data folder. `--data DIR` / `--eval-data DIR` still take a full data folder of the same layout.

Each file the defaults read (`prompts.EVAL_SETS`, and `heldout_<domain>.jsonl` of every domain, whose references
give the held-out loss) keeps its first `ROWS` rows: the most per domain `make bench` and `make evaluate` ask for,
which the broad mix leaves out for that reason (`broad_mix.BENCHED_ROWS`). Fields `id`, `domain`, `source`, `prompt`
and `reference`, those a row has. Long texts are cut to what is read of them, losslessly for the default target's
tokenizer: a prompt to a tail whose last `PROMPT_TOKENS` tokens (`--max-prompt-tokens` of bench and evaluate, half
the context in the held-out loss) are those of the whole prompt, as written and in the training template; a
reference to a head whose first tokens, up to the context (`CONTEXT`) less the prompt's, are the whole reference's.
Every cut is tokenised again and checked.

Deterministic (rows in file order); run from the repository root:

    .venv/bin/python -m adaflash.evaluation.eval_sample --data DATA
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.corpus import DOMAINS, as_prompt
from adaflash.evaluation.broad_mix import BENCHED_ROWS
from adaflash.evaluation.prompts import EVAL_SETS, PACKAGED_DATA

ROWS = BENCHED_ROWS
PROMPT_TOKENS = 512  # bench's and evaluate's --max-prompt-tokens; the held-out loss keeps CONTEXT // 2
CONTEXT = 1024  # the default target's max_position_embeddings: the held-out loss scores up to this many tokens
FIELDS = ("id", "domain", "source", "prompt", "reference")
MARGINS = (16, 64, 256)  # tokens kept beyond those read, tried in turn until the cut tokenises the same


def sample_files() -> list[str]:
    return sorted(set(EVAL_SETS.values()) | {f"heldout_{d}.jsonl" for d in DOMAINS})


def tail(tokenizer: Tokenizer, text: str, keep: int, forms: tuple[Callable[[str], str], ...]) -> str:
    """The shortest tail of `text`, cut at a token's start, whose last `keep` tokens are `text`'s in every form."""
    enc = tokenizer.encode(text)
    for margin in MARGINS:
        if len(enc.ids) <= keep + margin:
            return text
        cut = text[enc.offsets[len(enc.ids) - keep - margin][0]:]
        if all(tokenizer.encode(f(cut)).ids[-keep:] == tokenizer.encode(f(text)).ids[-keep:] for f in forms):
            return cut
    return text


def head(tokenizer: Tokenizer, text: str, keep: int) -> str:
    """The shortest head of `text`, cut at a token's end, whose first `keep` tokens are `text`'s."""
    enc = tokenizer.encode(text)
    for margin in MARGINS:
        if len(enc.ids) <= keep + margin:
            return text
        cut = text[:enc.offsets[keep + margin - 1][1]]
        if tokenizer.encode(cut).ids[:keep] == enc.ids[:keep]:
            return cut
    return text


def sample_row(tokenizer: Tokenizer, row: dict) -> dict:
    out = {k: row[k] for k in FIELDS if k in row}
    prompt_tokens = len(tokenizer.encode(row["prompt"]).ids)
    out["prompt"] = tail(tokenizer, row["prompt"], PROMPT_TOKENS, (str, as_prompt))
    if isinstance(row.get("reference"), str):  # mt_bench's are lists or null: kept as they are
        out["reference"] = head(tokenizer, row["reference"], CONTEXT - min(PROMPT_TOKENS, prompt_tokens))
    return out


def build(data_dir: str | Path, tokenizer: Tokenizer) -> dict[str, str]:
    """File name -> its JSON lines."""
    out = {}
    for name in sample_files():
        lines = (Path(data_dir) / "eval" / name).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()][:ROWS]
        out[name] = "".join(json.dumps(sample_row(tokenizer, r), ensure_ascii=False) + "\n" for r in rows)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a full data folder (holds eval/)")
    p.add_argument("--tokenizer-dir", type=Path, default=DEFAULT_MODEL_DIR / "target",
                   help="the target folder whose tokenizer.json the cuts are checked with")
    p.add_argument("--out", type=Path, default=PACKAGED_DATA / "eval")
    args = p.parse_args(argv)
    files = build(args.data, Tokenizer.from_file(str(args.tokenizer_dir / "tokenizer.json")))
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
    print(json.dumps({name: len(text.encode()) for name, text in files.items()}))


if __name__ == "__main__":
    main()

"""The packaged prompt sets. The broad evaluation mix: readable by the project's loader, every domain present with
both splits, prompts that fit the default target's context, questions the given text answers. The evaluation sample
(data/eval/): the rows the default commands read, every domain, in the project's data-folder layout. And, where
ADAFLASH_DATA names the project's data folder (`make test` does not need it; a clone has none), both built from it
reproducibly, the mix from held-out rows only, absent from train/."""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from adaflash.cli_args import DEFAULT_MODEL_DIR
from adaflash.corpus import DOMAINS as CORPUS_DOMAINS
from adaflash.evaluation import eval_sample
from adaflash.evaluation.prompts import BROAD_MIX, EVAL_SETS, PACKAGED_DATA, SPLITS, eval_prompts, load_prompts, read_jsonl
from adaflash.evaluation.broad_mix import BENCHED_ROWS, BLANK, DOMAINS, build, to_jsonl

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ["ADAFLASH_DATA"]) if os.environ.get("ADAFLASH_DATA") else None  # the project's data folder
TOKENIZER = ROOT / DEFAULT_MODEL_DIR / "target" / "tokenizer.json"
MAX_PROMPT_TOKENS = 512  # `adaflash bench`/`evaluate` keep a longer prompt's last 512 tokens, cutting its instruction
needs_data = pytest.mark.skipif(DATA is None or not (DATA / "eval").is_dir(),
                                reason="ADAFLASH_DATA does not name the project's data folder (with eval/ and train/)")


def rows() -> list[dict]:
    return [json.loads(line) for line in BROAD_MIX.read_text(encoding="utf-8").splitlines()]


def test_mix_reads_with_the_project_loader_and_has_every_domain_and_split():
    raw, prompts = rows(), read_jsonl(BROAD_MIX)
    assert [p.id for p in prompts] == [r["id"] for r in raw]
    assert len(set(p.id for p in prompts)) == len(prompts)
    counts = Counter(p.domain for p in prompts)
    assert set(counts) == set(DOMAINS) and min(counts.values()) >= 15
    assert {(r["domain"], r["split"]) for r in raw} == {(d, s) for d in DOMAINS for s in SPLITS}
    assert 0.25 <= sum(r["split"] == "tune" for r in raw) / len(raw) <= 0.4


def test_split_filter_keeps_tuning_runs_off_holdout_rows():
    by_split = {s: [r["id"] for r in rows() if r["split"] == s] for s in SPLITS}
    assert [p.id for p in load_prompts(BROAD_MIX, None, split="tune")] == by_split["tune"]
    assert [p.id for p in load_prompts(BROAD_MIX, None, split="holdout")] == by_split["holdout"]
    limited = load_prompts(BROAD_MIX, 12, split="tune")
    assert {p.domain for p in limited} == set(DOMAINS) and {p.id for p in limited} <= set(by_split["tune"])
    with pytest.raises(ValueError, match="no rows with split"):
        load_prompts(None, None, split="tune")  # the sample prompts carry no split: refuse rather than tune on them
    with pytest.raises(ValueError, match="split must be"):
        load_prompts(BROAD_MIX, None, split="heldout")


@pytest.mark.skipif(not TOKENIZER.exists(), reason="the default target's tokenizer is absent")
def test_every_prompt_fits_the_default_context_untruncated():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    lengths = {r["id"]: len(tokenizer.encode(r["prompt"]).ids) for r in rows()}
    assert max(lengths.values()) <= MAX_PROMPT_TOKENS, max(lengths.items(), key=lambda kv: kv[1])


def test_questions_are_answered_by_the_given_text():
    """qa: the blanked word is in the text; rag: it is in the passage the reference cites."""
    for r in rows():
        if r["domain"] not in ("qa", "rag"):
            continue
        text, question = r["prompt"].rstrip("\n").rsplit("\n\n", 1)
        assert BLANK in question, r["id"]
        if r["domain"] == "qa":
            assert re.search(rf"\b{r['reference']}\b", text), r["id"]
        else:
            word, cited = re.fullmatch(r"(\w+) \[(\d)\]", r["reference"]).groups()
            labels_and_passages = re.split(r"^\[(\d)\] ", text, flags=re.M)[1:]
            passages = dict(zip(labels_and_passages[::2], labels_and_passages[1::2]))
            assert len(passages) == len(r["sources"]) in (2, 3), r["id"]
            assert re.search(rf"\b{word}\b", passages[cited]), r["id"]


@needs_data
def test_sources_are_unbenchmarked_heldout_rows_each_used_once():
    allowed = set()
    for path in (DATA / "eval").glob("heldout_*.jsonl"):
        ids = [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]
        allowed |= set(ids[BENCHED_ROWS:])
    used = [s for r in rows() for s in r["sources"]]
    assert set(used) <= allowed and len(used) == len(set(used))


def _squeezed(text: str) -> str:
    return "".join(text.split())


def _probes(row: dict) -> list[str]:
    """What of a prompt must not be in train/, whitespace dropped (passages are reflowed): the middle 40
    characters of each passage paragraph (the mix's own instructions, under 100 bytes, and cloze questions
    left out); a code or math prompt whole: a library repeats docstring paragraphs across its files (networkx
    its parameter descriptions) and MATH problems share phrasings and drawing code, in train/ as well."""
    if row["domain"] in ("code", "math"):
        return [_squeezed(row["prompt"])]
    texts = [_squeezed(p) for p in re.sub(r"^\[\d\] ", "", row["prompt"], flags=re.M).split("\n\n")]
    return [t[len(t) // 2 - 20: len(t) // 2 + 20] for t in texts if len(t.encode()) >= 100 and BLANK not in t]


@needs_data
def test_no_prompt_text_is_in_train():
    probes = {probe for r in rows() for probe in _probes(r)}
    assert len(probes) >= len(rows())
    for path in sorted((DATA / "train").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            train = _squeezed("\n".join(v for line in f for k, v in json.loads(line).items()
                                        if k in ("text", "prompt", "response")))
        found = [p for p in probes if p in train]
        assert not found, (path.name, found[:5])


@needs_data
def test_builder_is_deterministic_and_matches_the_committed_file():
    first = to_jsonl(build(DATA))
    assert to_jsonl(build(DATA)) == first
    assert first == BROAD_MIX.read_text(encoding="utf-8"), "regenerate: see python_backend/adaflash/data/README.md"


def test_the_evaluation_sample_holds_what_the_defaults_read():
    """Every file `adaflash evaluate` and `bench --eval-data` read, BENCHED_ROWS rows each (`make bench` and
    `make evaluate` ask for 16 per domain), in the layout of a data folder; small enough to ship."""
    files = sorted(p.name for p in (PACKAGED_DATA / "eval").glob("*.jsonl"))
    assert files == eval_sample.sample_files()
    assert set(EVAL_SETS.values()) | {f"heldout_{d}.jsonl" for d in CORPUS_DOMAINS} == set(files)
    prompts = eval_prompts(PACKAGED_DATA, BENCHED_ROWS)
    assert {d: len(p) for d, p in prompts.items()} == {d: BENCHED_ROWS for d in CORPUS_DOMAINS}
    for name in files:
        rows = read_jsonl(PACKAGED_DATA / "eval" / name)
        assert len(rows) == BENCHED_ROWS and len({r.id for r in rows}) == BENCHED_ROWS, name
    assert sum(p.stat().st_size for p in (PACKAGED_DATA / "eval").glob("*.jsonl")) < 300_000


@needs_data
@pytest.mark.skipif(not TOKENIZER.exists(), reason="the default target's tokenizer is absent")
def test_evaluation_sample_builder_is_deterministic_and_matches_the_committed_files():
    from tokenizers import Tokenizer

    built = eval_sample.build(DATA, Tokenizer.from_file(str(TOKENIZER)))
    assert eval_sample.build(DATA, Tokenizer.from_file(str(TOKENIZER))) == built
    for name, text in built.items():
        assert text == (PACKAGED_DATA / "eval" / name).read_text(encoding="utf-8"), \
            f"{name}: regenerate: see python_backend/adaflash/data/README.md"

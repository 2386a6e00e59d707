"""Build the broad evaluation mix: translation, summarisation, question answering over a given text,
retrieval-augmented answers, code and math prompts from the held-out rows of the shared data.

Why: the figures so far come from chat, code and math sets, while real traffic also asks to translate,
summarise and answer from passages it pastes in; there the answer copies from the prompt and acceptance
behaves differently. So the mix is built from the shared data's `eval/heldout_<domain>.jsonl` files only
(records removed from train/, never seen in training), and it leaves out the first `BENCHED_ROWS` rows
of each file: `make bench`, `adaflash evaluate` and the packaged sample prompts read those, so the policy
may have been tuned on them. Passages leave out text that train/ also holds. Each held-out row feeds at
most one prompt, so no text is shared between prompts, and a third of each domain's prompts (by the hash
of their ids) are `tune`, the rest `holdout`, which must never feed a tuning run.

Standard library only (with adaflash.corpus: the prompt template and the train/ reader);
deterministic: rows are taken in sha256 order salted with `SEED`. Run from the repository root, DATA being the
project's data folder (its eval/ and train/; python_backend/adaflash/data/README.md):

    .venv/bin/python -m adaflash.evaluation.broad_mix --data DATA --out python_backend/adaflash/data/broad_mix.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from adaflash.corpus import as_prompt, documents

T = TypeVar("T")

SEED = "broad-mix-1"
BENCHED_ROWS = 16  # the most rows per domain `make bench`/`make evaluate` read (the sample prompts read 4)
SOURCE_FILES = ("prose", "multilingual", "code", "math")  # the eval/heldout_<name>.jsonl files read
PASSAGE_SOURCES = ("prose", "multilingual")  # those passages come from, and the train/ files they must avoid
SHARED_RUN = 8  # words: a paragraph sharing this many in a row with a train/ record is not a passage
DOMAINS = ("translation", "summarisation", "qa", "rag", "code", "math")
PER_DOMAIN = 20
# Summarisation, qa, rag and translation from English share the English prose rows: 84 past the benchmarked
# head, 75 of them with passages of their own (see `heldout`), and a rag prompt takes 2 or 3 rows.
# Sixteen prompts each and FROM_ENGLISH use them all.
PER_PROSE_DOMAIN = 16
FROM_ENGLISH = 5  # translation prompts from English prose; the other PER_DOMAIN - FROM_ENGLISH go into English
LANGUAGES = {"de": "German", "es": "Spanish", "fr": "French", "it": "Italian", "ja": "Japanese", "ko": "Korean",
             "pt": "Portuguese", "zh-Hans": "Simplified Chinese", "zh-Hant": "Traditional Chinese"}
CJK_LANGUAGES = ("ja", "ko", "zh-Hans", "zh-Hant")

# Budgets in Latin-character equivalents (`cost`), chosen so every prompt stays within 512 tokens of the
# default tokenizer: the default `--max-prompt-tokens` of `adaflash bench` and `adaflash evaluate`, which
# keep a longer prompt's end and would cut off its instruction or first passage.
WIDE_COST = 6  # a CJK character costs the default tokenizer about six Latin ones (0.6-1.6 vs 3.3-4 chars/token)
TRANSLATION_BUDGET = 700
SUMMARY_BUDGET = 1400
QA_BUDGET = 1200
RAG_BUDGET = 1300  # shared by the prompt's passages
CODE_BUDGET = 900
MIN_PARAGRAPH = 100  # shorter paragraphs are headings, list items or captions
MIN_LETTERS = 0.85  # share of letters among a paragraph's non-space characters: below it, code or a table
PARAGRAPH_END = ".!?:;\"'”’»。！？」』"  # prose ends so; code, tables and headings mostly do not
SENTENCE_END = ".!?"
WIDE_SENTENCE_END = "。！？"  # end a sentence even with the next one right after
# English left untranslated in a translated document (as SOURCES.md tests for it): more than 15% of its words
# are these, common in English and rare in the other languages of the held-out rows.
ENGLISH_WORDS = frozenset("the and of to is that for with are this be by it you not from which can as or their "
                          "have has were if when they these at its into should would than then there been any "
                          "such only other but more may must all use used".split())
ENGLISH_SHARE = 0.15
ABBREVIATION = re.compile(r"(?:^|\s)(?:Mr|Mrs|Ms|Dr|St|Mt|vs|etc|e\.g|i\.e)\.$")  # a full stop that ends no sentence
WORD = r"(?<![\w'’])[A-Za-z]{6,}(?![\w'’])"  # a word of 6+ letters, not part of a contraction
BLANK = "_____"

TRANSLATE_INTO_ENGLISH = "Translate the following {language} text into English.\n\n{text}"
TRANSLATE_FROM_ENGLISH = "Translate the following English text into {language}.\n\n{text}"
SUMMARISE = "{text}\n\nSummarise the text above in two or three sentences."
ASK = "{text}\n\nAnswer from the text above: which word is missing from this sentence of it?\n{sentence}"
ASK_CITING = ("{text}\n\nAnswer from the passages above, citing the passage you used as [n]: "
              "which word is missing from this sentence?\n{sentence}")


@dataclass(frozen=True)
class Source:
    """A held-out row; `paragraphs` are what its passages are cut from (see `heldout`)."""

    id: str
    collection: str  # the row's `source`: the corpus part it comes from
    lang: str  # "en" unless the row names its language
    prompt: str
    paragraphs: tuple[str, ...]


def rank(key: str) -> str:
    """The order rows are taken in: a salted hash, so the choice is fixed yet unrelated to the files' order."""
    return hashlib.sha256(f"{SEED}:{key}".encode()).hexdigest()


def heldout(data_dir: Path) -> dict[str, list[Source]]:
    """The rows past the benchmarked head of each held-out file the mix reads, in `rank` order. Passages
    are cut from a row's own paragraphs less those sharing SHARED_RUN words in a row with train/
    (documentation repeats paragraphs across pages, and the literature has poems in several collections),
    so no passage is text the models were trained on."""
    rows = {name: [json.loads(line) for line in
                   (data_dir / "eval" / f"heldout_{name}.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
            for name in SOURCE_FILES}
    own = {name: own_paragraphs(rows[name]) for name in PASSAGE_SOURCES}
    trained = shared_with_train(data_dir, {p for by_row in own.values() for ps in by_row.values() for p in ps})

    def source(name: str, row: dict) -> Source:
        paragraphs = tuple(p for p in own.get(name, {}).get(row["id"], ()) if p not in trained)
        return Source(row["id"], row["source"], row.get("lang", "en"), row["prompt"], paragraphs)
    return {name: sorted((source(name, r) for r in rows[name][BENCHED_ROWS:]), key=lambda s: rank(s.id))
            for name in SOURCE_FILES}


def own_paragraphs(rows: list[dict]) -> dict[str, list[str]]:
    """Per row past the head, the prose paragraphs of its whole record (prompt + reference) that no other
    row of the file repeats (those are boilerplate: translation notices, licence lines)."""
    texts = {r["id"]: [reflow(p) for p in (r["prompt"] + r["reference"]).split("\n\n")] for r in rows}
    seen = Counter(p for paragraphs in texts.values() for p in set(paragraphs))
    return {r["id"]: [p for p in texts[r["id"]] if seen[p] == 1 and is_prose(p, r.get("lang", "en"))]
            for r in rows[BENCHED_ROWS:]}


def runs(text: str) -> list[tuple[str, ...]]:
    """Every SHARED_RUN words in a row (whitespace-separated, punctuation kept)."""
    words = text.split()
    return [tuple(words[i:i + SHARED_RUN]) for i in range(len(words) - SHARED_RUN + 1)]


def shared_with_train(data_dir: Path, paragraphs: set[str]) -> set[str]:
    """The `paragraphs` that share a run of words with a train/ record of the domains passages come from
    (English prose is also left untranslated in the multilingual ones). Indexes the few paragraphs and
    streams train/ past them, so memory stays small."""
    owners: dict[tuple[str, ...], list[str]] = {}
    for paragraph in paragraphs:
        for run in runs(paragraph):
            owners.setdefault(run, []).append(paragraph)
    found: set[str] = set()
    for domain in PASSAGE_SOURCES:
        for text in documents(data_dir, domain):
            for run in runs(text):
                found.update(owners.get(run, ()))
    return found


class Pool:
    """Rows not used yet: a row taken for one prompt is gone, so no two prompts share a held-out row."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = list(sources)

    def find(self, usable: Callable[[Source], T | None]) -> tuple[Source, T] | None:
        """The first row `usable` makes something of, with that thing (the row leaves the pool); else None."""
        for i, source in enumerate(self.sources):
            made = usable(source)
            if made is not None:
                return self.sources.pop(i), made
        return None

    def take(self, usable: Callable[[Source], T | None]) -> tuple[Source, T]:
        """`find`, for a row the mix cannot do without."""
        found = self.find(usable)
        if found is None:
            raise ValueError("the held-out rows ran out: ask for fewer prompts or relax the passage rules")
        return found


def is_wide(ch: str) -> bool:
    return ord(ch) >= 0x2E80  # CJK radicals and ideographs, kana, Hangul, full-width forms


def cost(text: str) -> int:
    """Length in Latin-character equivalents, a stand-in for tokens that needs no tokenizer."""
    return sum(WIDE_COST if is_wide(ch) else 1 for ch in text)


def reflow(paragraph: str) -> str:
    """One line, single spaces (no-break spaces too); wrapped CJK lines join without a space."""
    text = ""
    for line in paragraph.split("\n"):
        line = " ".join(line.split())
        if text and line:
            text += "" if is_wide(text[-1]) and is_wide(line[0]) else " "
        text += line
    return text


def is_prose(paragraph: str, lang: str) -> bool:
    """Running text in `lang`: long enough, mostly letters, ending as a sentence does (leaves out headings,
    code, tables, command lines), and not English left untranslated in a translated document."""
    chars = [ch for ch in paragraph if not ch.isspace()]
    letters = [ch for ch in chars if ch.isalpha()]
    if cost(paragraph) < MIN_PARAGRAPH or len(letters) < MIN_LETTERS * len(chars) or paragraph[-1] not in PARAGRAPH_END:
        return False
    if lang in CJK_LANGUAGES:
        return 2 * sum(map(is_wide, letters)) >= len(letters)
    words = re.findall(r"[a-z]+", paragraph.lower())
    return lang == "en" or sum(w in ENGLISH_WORDS for w in words) <= ENGLISH_SHARE * len(words)


def fitting(text: str, budget: int) -> str:
    """The longest prefix of `text` that costs at most `budget`."""
    spent = 0
    for i, ch in enumerate(text):
        spent += cost(ch)
        if spent > budget:
            return text[:i]
    return text


def trim(text: str, budget: int, whole_sentences: bool) -> str:
    """`text` within `budget`, cut after the last sentence that fits; when none does, nothing, or with
    `whole_sentences` off the words that fit (a passage has to start somewhere)."""
    head = fitting(text, budget)
    if head == text:
        return text
    stops = [i for i, ch in enumerate(head)
             if ch in WIDE_SENTENCE_END or (ch in SENTENCE_END and not text[i + 1].isalnum())]
    if stops:
        return head[: stops[-1] + 1]
    if whole_sentences:
        return ""
    return head.rsplit(" ", 1)[0] if " " in head else head


def passage(source: Source, budget: int) -> str | None:
    """The row's first prose paragraphs within `budget`; None when they fill less than half of it."""
    taken: list[str] = []
    left = budget
    for paragraph in source.paragraphs:
        part = trim(paragraph, left, whole_sentences=bool(taken))
        if part:
            taken.append(part)
            left -= cost(part) + 2
        if part != paragraph or left < MIN_PARAGRAPH:
            break
    text = "\n\n".join(taken)
    return text if 2 * cost(text) >= budget else None


def sentences(paragraph: str) -> list[str]:
    """The paragraph's sentences: split after . ! ? (and a closing quote), not after an abbreviation."""
    out: list[str] = []
    for piece in re.split(r"(?<=[.!?])\s+|(?<=[.!?][\"'”’])\s+", paragraph):
        if out and ABBREVIATION.search(out[-1]):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def cloze(text: str) -> tuple[str, str] | None:
    """A sentence of `text` with one word blanked, and the word: a question the text answers. The middle
    one of the sentences of 8-40 words that have a word of 6+ letters; its longest such word (the first
    of equals), which tends to carry the sentence's content."""
    candidates = []
    for paragraph in text.split("\n\n"):
        for sentence in sentences(paragraph):
            words = re.findall(WORD, sentence)
            if words and 8 <= len(sentence.split()) <= 40:
                candidates.append((sentence, max(words, key=len)))
    if not candidates:
        return None
    sentence, word = candidates[len(candidates) // 2]
    return re.sub(rf"(?<![\w'’]){word}(?![\w'’])", BLANK, sentence, count=1), word


def passage_with_cloze(budget: int) -> Callable[[Source], tuple[str, tuple[str, str]] | None]:
    def usable(source: Source) -> tuple[str, tuple[str, str]] | None:
        text = passage(source, budget)
        question = cloze(text) if text else None
        return (text, question) if text and question else None
    return usable


def prompt_row(domain: str, sources: list[Source], prompt: str, reference: str | None = None) -> dict:
    """A mix row (its split comes later); its id names the domain and the held-out row the prompt is about."""
    row = {"id": f"{domain}/{sources[0].id}", "domain": domain, "prompt": prompt, "sources": [s.id for s in sources]}
    if reference is not None:
        row["reference"] = reference
    return row


def with_splits(rows: list[dict]) -> list[dict]:
    """One domain's rows with their `split`: the first third in `rank` order of their ids `tune`, the rest
    `holdout` (a count per domain, so every domain has both in the same proportion)."""
    tune = {r["id"] for r in sorted(rows, key=lambda r: rank(r["id"]))[: round(len(rows) / 3)]}
    return [{"id": r["id"], "domain": r["domain"], "split": "tune" if r["id"] in tune else "holdout", **r} for r in rows]


def translation(multilingual: list[Source], prose: Pool) -> list[dict]:
    """Translations into English, the held-out languages in turn; then English prose into those languages."""
    by_language: dict[str, list[Source]] = {}
    for source in multilingual:
        by_language.setdefault(source.lang, []).append(source)
    languages = sorted(by_language, key=rank)
    pools = {lang: Pool(sources) for lang, sources in by_language.items()}
    rows = []
    for i in range(PER_DOMAIN - FROM_ENGLISH):
        source, text = pools[languages[i % len(languages)]].take(lambda s: passage(s, TRANSLATION_BUDGET))
        prompt = TRANSLATE_INTO_ENGLISH.format(language=LANGUAGES[source.lang], text=text)
        rows.append(prompt_row("translation", [source], as_prompt(prompt)))
    for i in range(FROM_ENGLISH):
        source, text = prose.take(lambda s: passage(s, TRANSLATION_BUDGET))
        prompt = TRANSLATE_FROM_ENGLISH.format(language=LANGUAGES[languages[i % len(languages)]], text=text)
        rows.append(prompt_row("translation", [source], as_prompt(prompt)))
    return rows


def summarisation(prose: Pool) -> list[dict]:
    rows = []
    for _ in range(PER_PROSE_DOMAIN):
        source, text = prose.take(lambda s: passage(s, SUMMARY_BUDGET))
        rows.append(prompt_row("summarisation", [source], as_prompt(SUMMARISE.format(text=text))))
    return rows


def qa(prose: Pool) -> list[dict]:
    """A passage and a question on one of its sentences; the reference is the answer."""
    rows = []
    for _ in range(PER_PROSE_DOMAIN):
        source, (text, (sentence, word)) = prose.take(passage_with_cloze(QA_BUDGET))
        rows.append(prompt_row("qa", [source], as_prompt(ASK.format(text=text, sentence=sentence)), word))
    return rows


def retrieved(prose: Pool, like: Source, budget: int) -> tuple[Source, str]:
    """Another row's passage, of the same collection while one is left: retrieval returns related text."""
    def fits(source: Source) -> str | None:
        return passage(source, budget)
    return prose.find(lambda s: fits(s) if s.collection == like.collection else None) or prose.take(fits)


def rag(prose: Pool) -> list[dict]:
    """Three passages of different rows (every third prompt) or two, labelled [1].., and a question on one
    of them (each position in turn); the reference is the answer and the passage to cite."""
    rows = []
    for i in range(PER_PROSE_DOMAIN):
        count = 3 if i % 3 == 0 else 2
        at = i // 3 % count
        source, (asked, (sentence, word)) = prose.take(passage_with_cloze(RAG_BUDGET // count))
        others = [retrieved(prose, source, RAG_BUDGET // count) for _ in range(count - 1)]
        texts = [text for _, text in others]
        texts.insert(at, asked)
        labelled = "\n\n".join(f"[{n}] {text}" for n, text in enumerate(texts, 1))
        rows.append(prompt_row("rag", [source] + [s for s, _ in others],
                               as_prompt(ASK_CITING.format(text=labelled, sentence=sentence)), f"{word} [{at + 1}]"))
    return rows


def code_tail(prefix: str) -> str | None:
    """The whole lines at the end of a held-out file prefix within CODE_BUDGET (None: one longer line)."""
    tail = prefix[-CODE_BUDGET:]
    if len(tail) < CODE_BUDGET:
        return tail
    cut = tail.find("\n")
    return tail[cut + 1:] if cut >= 0 else None


def code(sources: list[Source]) -> list[dict]:
    """File prefixes to continue: running text, as the code eval sets."""
    tails = ((source, code_tail(source.prompt)) for source in sources)
    return [prompt_row("code", [source], tail) for source, tail in tails if tail][:PER_DOMAIN]


def math(sources: list[Source]) -> list[dict]:
    """Problems in the training template, as the math eval sets."""
    return [prompt_row("math", [source], as_prompt(source.prompt)) for source in sources[:PER_DOMAIN]]


def build(data_dir: str | Path) -> list[dict]:
    """The mix, domain by domain. English prose feeds four domains from one pool, the most demanding first."""
    sources = heldout(Path(data_dir))
    prose = Pool(sources["prose"])
    made = {"qa": qa(prose), "rag": rag(prose), "summarisation": summarisation(prose),
            "translation": translation(sources["multilingual"], prose),
            "code": code(sources["code"]), "math": math(sources["math"])}
    return [row for domain in DOMAINS for row in with_splits(made[domain])]


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="the project's data folder (holds eval/ and train/)")
    p.add_argument("--out", type=Path, default=Path("python_backend/adaflash/data/broad_mix.jsonl"))
    args = p.parse_args(argv)
    rows = build(args.data)
    args.out.write_text(to_jsonl(rows), encoding="utf-8")
    print(json.dumps({"rows": len(rows), "per_domain_split": Counter(f"{r['domain']}/{r['split']}" for r in rows)}))


if __name__ == "__main__":
    main()

"""Tokenisation that understands scripts without spaces (Chinese, Japanese, Korean).

PostgreSQL's parsers treat a run of ideographs as one "word", so a Chinese query term never
matches inside a Chinese sentence. We rewrite CJK runs into overlapping character bigrams
(the standard CJK approach of Lucene's CJKAnalyzer) for the *indexed* text only; stored
bodies and offsets are untouched. Indexed text also carries unigrams, so a one-character
query still finds documents; queries use bigrams (unigram for a lone character).
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["is_cjk", "segment_for_index", "segment_for_query", "tokenize"]

_CJK_RANGES = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # hangul syllables
    "\uf900-\ufaff"  # compatibility ideographs
    "\U00020000-\U0002ebef"  # extensions B-F
)
_CJK_RUN = re.compile(f"[{_CJK_RANGES}]+")
_WORD = re.compile(rf"[^\W{_CJK_RANGES}]+")


def is_cjk(ch: str) -> bool:
    return bool(_CJK_RUN.fullmatch(ch))


def _grams(run: str, *, unigrams: bool) -> list[str]:
    if len(run) == 1:
        return [run]
    grams = [run[i : i + 2] for i in range(len(run) - 1)]
    return [*grams, *run] if unigrams else grams


def _rewrite(text: str, *, unigrams: bool) -> str:
    return _CJK_RUN.sub(lambda m: " " + " ".join(_grams(m.group(), unigrams=unigrams)) + " ", text)


def segment_for_index(text: str) -> str:
    """Text for ``to_tsvector``: CJK runs become bigrams plus unigrams, the rest unchanged."""
    return _rewrite(text, unigrams=True)


def segment_for_query(text: str) -> str:
    """Text for the query side: CJK runs become bigrams (a lone character stays itself)."""
    return _rewrite(text, unigrams=False)


def tokenize(text: str, *, for_query: bool = False) -> list[str]:
    """NFKC-normalised, case-folded word tokens plus CJK grams, in text order."""
    norm = unicodedata.normalize("NFKC", text).casefold()
    out: list[str] = []
    pos = 0
    for m in _CJK_RUN.finditer(norm):
        out.extend(_WORD.findall(norm[pos : m.start()]))
        out.extend(_grams(m.group(), unigrams=not for_query))
        pos = m.end()
    out.extend(_WORD.findall(norm[pos:]))
    return out

"""Tokenisation that understands scripts written without spaces (Chinese, Japanese, Korean).

PostgreSQL's parsers treat a run of ideographs as one "word", so a Chinese query term never
matches inside a Chinese sentence. CJK runs are therefore rewritten into overlapping
character bigrams, the approach of Lucene's CJK analyzer, in the *indexed* text only: stored
bodies and byte offsets are untouched.

Index text keeps the bigrams in place, so ``phraseto_tsquery`` adjacency still holds across
a run and the words around it, and appends the run's single characters after the text, so
a one-character query still finds the document without breaking phrase positions. Query
text uses bigrams only (a lone character stays itself), which makes every query gram of a
CJK substring of a document one of that document's index grams.

Runs are NFKC-normalised (half-width katakana, compatibility ideographs and jamo match their
standard forms) and CJK punctuation becomes a space, because a parser would otherwise keep
``。`` as a token. Everything else passes through unchanged.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["is_cjk", "segment_for_index", "segment_for_query", "tokenize"]

_CJK_LETTERS = (
    "\u1100-\u11ff"  # hangul jamo
    "\u3005-\u3007"  # 々 〆 〇
    "\u3021-\u3029"  # hangzhou numerals
    "\u3031-\u3035"  # kana repeat marks
    "\u303b\u303c"  # 〻 〼
    "\u3040-\u309f"  # hiragana
    "\u30a0-\u30ff"  # katakana
    "\u3130-\u318f"  # hangul compatibility jamo
    "\u31f0-\u31ff"  # katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f"  # hangul jamo extended A
    "\uac00-\ud7af"  # hangul syllables
    "\ud7b0-\ud7ff"  # hangul jamo extended B
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width katakana
    "\uffa0-\uffdc"  # half-width hangul
    "\U0001b000-\U0001b16f"  # kana supplement / extended A
    "\U00020000-\U0003134f"  # CJK extensions B-G, compatibility supplement
    "\U00031350-\U000323af"  # CJK extension H
)
_CJK_RUN = re.compile(f"[{_CJK_LETTERS}]+")
_WORD = re.compile(rf"[^\W{_CJK_LETTERS}]+")
# The same words in text with no CJK letter: a plain class matches faster than the
# exclusion above (HISTORY.md#sqlite).
_PLAIN_WORD = re.compile(r"\w+")
_ASCII_WORD = re.compile(r"\w+", re.ASCII)


def _cjk_punctuation() -> str:
    blocks = ((0x3000, 0x303F), (0xFE10, 0xFE1F), (0xFE30, 0xFE4F), (0xFF00, 0xFF65))
    chars = (
        chr(cp)
        for lo, hi in blocks
        for cp in range(lo, hi + 1)
        if unicodedata.category(chr(cp))[0] in "PZ" and not _CJK_RUN.fullmatch(chr(cp))
    )
    return "".join(re.escape(c) for c in chars)


_CJK_PUNCT = re.compile(f"[{_cjk_punctuation()}]")


def is_cjk(text: str) -> bool:
    """Whether ``text`` is non-empty and every character is a CJK letter (not punctuation)."""
    return bool(_CJK_RUN.fullmatch(text))


def _bigrams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _split(text: str, *, for_query: bool) -> tuple[list[str], list[str]]:
    """Pieces of the rewritten text in order, and the unigrams to append (index side)."""
    pieces: list[str] = []
    unigrams: list[str] = []
    pos = 0
    for m in _CJK_RUN.finditer(text):
        pieces.append(text[pos : m.start()])
        run = unicodedata.normalize("NFKC", m.group())
        pieces.append(" " + " ".join(_bigrams(run)) + " ")
        if not for_query and len(run) > 1:
            unigrams.extend(run)
        pos = m.end()
    pieces.append(text[pos:])
    return pieces, unigrams


def _segment(text: str, *, for_query: bool) -> str:
    # Every CJK letter and punctuation mark is outside ASCII: most text of most corpora is
    # settled by one pass in C instead of two scans of large character classes (a seventh
    # of preparing an English record for a write).
    if text.isascii() or (not _CJK_RUN.search(text) and not _CJK_PUNCT.search(text)):
        return text
    pieces, unigrams = _split(text, for_query=for_query)
    out = _CJK_PUNCT.sub(" ", "".join(pieces))
    return f"{out}\n{' '.join(unigrams)}" if unigrams else out


def segment_for_index(text: str) -> str:
    """Text for ``to_tsvector``: CJK runs as in-place bigrams, their characters appended."""
    return _segment(text, for_query=False)


def segment_for_query(text: str) -> str:
    """Text for ``plainto_tsquery``/``phraseto_tsquery``: CJK runs as bigrams only."""
    return _segment(text, for_query=True)


def tokenize(text: str, *, for_query: bool = False) -> list[str]:
    """Terms for the in-memory BM25 scorer, matching what the database indexes.

    The text is NFKC-normalised and case-folded; non-CJK words are maximal runs of word
    characters (``\\w``, underscore included), with no stemming or stopwords so scores stay
    explainable. CJK runs give the grams of :func:`segment_for_index` (``for_query=False``)
    or :func:`segment_for_query` (``for_query=True``), in text order with the index side's
    unigrams last.
    """
    if text.isascii():  # NFKC and case folding are lower() here, and no letter is CJK
        return _ASCII_WORD.findall(text.lower())
    norm = unicodedata.normalize("NFKC", text).casefold()
    if _CJK_RUN.search(norm) is None:
        return _PLAIN_WORD.findall(norm)
    return _grams(norm, for_query=for_query)


def _grams(norm: str, *, for_query: bool) -> list[str]:
    """:func:`tokenize` of normalised text in general: words between CJK runs, each run's
    bigrams in place (and, for the index, its characters last)."""
    out: list[str] = []
    tail: list[str] = []
    pos = 0
    for m in _CJK_RUN.finditer(norm):
        out.extend(_WORD.findall(norm, pos, m.start()))
        run = m.group()
        out.extend(_bigrams(run))
        if not for_query and len(run) > 1:
            tail.extend(run)
        pos = m.end()
    out.extend(_WORD.findall(norm, pos))
    return out + tail

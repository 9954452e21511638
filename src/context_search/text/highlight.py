"""Where a query's words appear in a snippet, and a word-bounded excerpt around them.

Highlights are computed from the query text and the returned snippet alone, never from
what a backend's lexical arm reports: every connector then marks the same bytes of the
same snippet, and a highlight can only point into text the caller was given (a masked
title that matched the query has no bytes in the snippet, so nothing marks it).

A highlight is a ``(start, end)`` pair of UTF-8 byte offsets *into the snippet*
(``snippet.encode()[start:end]``; add the hit's ``start_byte`` for offsets into the body).
Terms are the query's positive words and quoted-phrase words as :func:`tokenize` reads
them (negated words are not marked): a word matches when its NFKC, case-folded form equals
a query word's after a light inflection fold (plural ``-s``/``-es``/``-ies``, ``-ing``,
``-ed``), so the inflected forms a stemming lexical arm (PostgreSQL's ``english``) matches
are marked on every backend alike. Scripts written without spaces are matched as the index
reads them: two-character grams, and single characters for a one-character query term; the
overlapping grams of a longer term merge into one span.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from context_search.text.query import parse_query
from context_search.text.segment import _CJK_RUN, _WORD, tokenize

__all__ = ["Span", "excerpt", "highlight_spans", "query_terms"]

#: ``(start, end)`` UTF-8 byte offsets, end exclusive.
Span = tuple[int, int]

_VOWEL = frozenset("aeiouy")


def _fold(word: str) -> str:
    """A light English inflection fold (plural, ``-ing``, ``-ed``, silent ``-e``), applied
    to both sides.

    Deliberately small: it only touches lowercase ASCII words of four letters or more, and
    folds repeatedly (``speeds`` -> ``speed`` -> ``spe``) so a word and its inflections
    reach the same form.
    """
    while True:
        folded = _fold_once(word)
        if folded == word:
            return word
        word = folded


def _fold_once(word: str) -> str:
    if len(word) < 4 or not word.isascii() or not word.isalpha():
        return word
    if len(word) >= 5 and word.endswith(("ies", "ied")):
        return word[:-3] + "y"
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) >= 3 and _VOWEL & set(stem):
            if len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
                stem = stem[:-1]  # running -> run, planned -> plan
            return stem
    if word.endswith(("sses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    if word.endswith("e") and not word.endswith("ee"):
        return word[:-1]  # cache, caches, cached, caching -> cach
    return word


def query_terms(query: str) -> frozenset[str]:
    """The folded terms a query's highlights mark: positive words and phrase words."""
    parsed = parse_query(query)
    return frozenset(_fold(t) for t in tokenize(parsed.positive_text, for_query=True))


def _merge(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sorted spans with overlapping ones joined (a CJK term's grams overlap)."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)


def _byte_offsets(text: str) -> list[int]:
    """Byte offset of every character index (and of the end)."""
    offsets = [0] * (len(text) + 1)
    total = 0
    for i, ch in enumerate(text):
        offsets[i] = total
        total += len(ch.encode("utf-8", "surrogatepass"))
    offsets[len(text)] = total
    return offsets


def _norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def highlight_spans(snippet: str, terms: frozenset[str]) -> tuple[Span, ...]:
    """Byte spans of ``snippet`` holding one of ``terms`` (from :func:`query_terms`).

    Every span starts and ends on a character boundary, so each decodes on its own.
    """
    if not terms or not snippet:
        return ()
    offs: list[int] | None = None
    found: list[tuple[int, int]] = []  # character spans
    cjk = [(m.start(), m.end()) for m in _CJK_RUN.finditer(snippet)]
    pos = 0
    for start, end in [*cjk, (len(snippet), len(snippet))]:
        for m in _WORD.finditer(snippet, pos, start):
            if _fold(_norm(m.group())) in terms:
                found.append((m.start(), m.end()))
        if end > start:
            if end - start == 1 or any(len(t) == 1 for t in terms):
                found.extend((i, i + 1) for i in range(start, end) if _norm(snippet[i]) in terms)
            found.extend(
                (i, i + 2) for i in range(start, end - 1) if _norm(snippet[i : i + 2]) in terms
            )
        pos = end
    if not found:
        return ()
    offs = _byte_offsets(snippet)
    return _merge((offs[a], offs[b]) for a, b in found)


_WORD_CHAR = re.compile(r"\w")


def _inside_word(text: str, i: int) -> bool:
    """Whether character boundary ``i`` splits a word of a script written with spaces.

    Two word characters meet there and neither is CJK (those may be cut between any two
    characters); a combining mark after ``i`` also belongs to the character before it.
    """
    if i <= 0 or i >= len(text):
        return False
    before, after = text[i - 1], text[i]
    if unicodedata.combining(after) or after == "\u200d" or before == "\u200d":
        return True
    if _CJK_RUN.match(before) or _CJK_RUN.match(after):
        return False
    return bool(_WORD_CHAR.match(before) and _WORD_CHAR.match(after))


def excerpt(snippet: str, highlights: Iterable[Span] = (), *, max_bytes: int = 160) -> Span:
    """Byte offsets into ``snippet`` of an excerpt of at most ``max_bytes`` for display.

    The excerpt begins a little before the first highlight (or at the start), never starts
    or ends inside a word of a space-separated script (CJK text may be cut between any two
    characters) and never inside a UTF-8 sequence; surrounding whitespace is dropped. A
    single word longer than ``max_bytes`` is the one case cut inside a word, at a character
    boundary, since no word-bounded excerpt of it exists. The whole snippet is returned
    when it fits.
    """
    if max_bytes < 1:
        raise ValueError("max_bytes must be positive")
    offs = _byte_offsets(snippet)
    n = len(snippet)
    if offs[n] <= max_bytes:
        return (0, offs[n])
    first = min((s for s, _ in highlights), default=0)
    # Character index of the first highlight, then a quarter of the budget of lead-in.
    anchor = next(i for i, b in enumerate(offs) if b >= first)
    lead = offs[anchor] - max_bytes // 4
    start = next(i for i, b in enumerate(offs) if b >= max(lead, 0))
    while start < anchor and _inside_word(snippet, start):
        start += 1
    while start < n and snippet[start].isspace():
        start += 1
    # Shift left when the window would run past the end, keeping word boundaries.
    limit = offs[start] + max_bytes
    if limit > offs[n]:
        lo = offs[n] - max_bytes
        start = next(i for i, b in enumerate(offs) if b >= lo)
        while start < n and (_inside_word(snippet, start) or snippet[start].isspace()):
            start += 1
        limit = offs[n]
    end = start
    while end < n and offs[end + 1] <= limit:
        end += 1
    cut = end
    while cut > start and _inside_word(snippet, cut):
        cut -= 1
    if cut > start:
        end = cut
    elif end == start and start < n:  # one character wider than the budget: keep it whole
        end = start + 1
    while end > start and snippet[end - 1].isspace():
        end -= 1
    return (offs[start], offs[end])

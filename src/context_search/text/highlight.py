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
from functools import lru_cache

from context_search.text.query import parse_query
from context_search.text.segment import _CJK_LETTERS, _CJK_RUN, is_cjk, tokenize

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


@lru_cache(maxsize=1 << 16)
def _word_key(word: str) -> str:
    """A word as terms are compared (cached: words repeat across chunks and searches, and
    normalising and folding each one was most of a response's highlighting time)."""
    return _fold(_norm(word))


#: Every CJK letter that NFKC changes lies in these ranges (a unit test keeps it so):
#: compatibility ideographs, half-width forms, compatibility jamo and a few kana marks.
_CJK_COMPAT = re.compile(
    "[\u309b\u309c\u309f\u30ff\u3131-\u318e\uf900-\ufaff\uff66-\uffdc\U0002f800-\U0002fa1f]"
)


def _cjk_matches(snippet: str, grams: tuple[str, ...], found: list[Span]) -> None:
    """Character spans of the CJK terms (grams of two, or one character) in ``snippet``.

    A gram made of CJK letters only occurs inside one run of them, and CJK letters outside
    :data:`_CJK_COMPAT` are their own NFKC, case-folded form, so the grams are searched for
    in the snippet as it is; a snippet holding a compatibility character is read run by
    run and gram by gram instead.
    """
    if _CJK_COMPAT.search(snippet) is None:
        for gram in grams:
            i = snippet.find(gram)
            while i != -1:
                found.append((i, i + len(gram)))
                i = snippet.find(gram, i + 1)
        return
    wanted = frozenset(grams)
    for m in _CJK_RUN.finditer(snippet):
        run, base = m.group(), m.start()
        for size in (1, 2):
            found.extend(
                (base + i, base + i + size)
                for i in range(len(run) - size + 1)
                if _norm(run[i : i + size]) in wanted
            )


_WORD_LETTER = re.compile(rf"[^\W{_CJK_LETTERS}]")
_WORD_RUN = re.compile(rf"[^\W{_CJK_LETTERS}]+")


@lru_cache(maxsize=256)
def _prefixes(terms: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """How the words that may fold to a term begin, and the CJK terms.

    A fold keeps a word's first three letters (``flies`` -> ``fly`` excepted, so a
    three-letter term ending in ``y`` also starts ``..i``). Only words beginning so are
    normalised and compared: most of a snippet's words do not, and normalising each one
    was most of the cost. (A word whose first letters NFKC changes, e.g. full-width Latin,
    is therefore not marked.)
    """
    starts = {t[:3] for t in terms if not is_cjk(t)}
    starts |= {t[:2] + "i" for t in terms if len(t) == 3 and t.endswith("y")}
    return tuple(sorted(starts)), tuple(sorted(t for t in terms if is_cjk(t)))


def _word_matches(snippet: str, terms: frozenset[str], found: list[Span]) -> None:
    """Character spans of the words of ``snippet`` that fold to one of ``terms``."""
    starts, _ = _prefixes(terms)
    low = snippet.lower()
    if len(low) != len(snippet):  # a rare character lowers to two: look at every word
        found.extend(
            (w.start(), w.end())
            for w in _WORD_RUN.finditer(snippet)
            if _word_key(w.group()) in terms
        )
        return
    for start in starts:
        i = low.find(start)
        while i != -1:
            if i and _WORD_LETTER.match(low, i - 1):  # inside a word
                i = low.find(start, i + 1)
                continue
            run = _WORD_RUN.match(low, i)
            end = run.end() if run is not None else i + len(start)
            if _word_key(snippet[i:end]) in terms:
                found.append((i, end))
            i = low.find(start, end)


def _to_bytes(text: str, spans: list[Span]) -> tuple[Span, ...]:
    """Character spans (sorted, disjoint) as UTF-8 byte spans, converted in one pass."""
    out: list[Span] = []
    char = byte = 0
    for a, b in spans:
        byte += len(text[char:a].encode())
        start = byte
        byte += len(text[a:b].encode())
        char = b
        out.append((start, byte))
    return tuple(out)


def highlight_spans(snippet: str, terms: frozenset[str]) -> tuple[Span, ...]:
    """Byte spans of ``snippet`` holding one of ``terms`` (from :func:`query_terms`).

    Every span starts and ends on a character boundary, so each decodes on its own.
    """
    if not terms or not snippet:
        return ()
    found: list[Span] = []  # character spans
    _word_matches(snippet, terms, found)
    grams = _prefixes(terms)[1]
    if grams and not snippet.isascii():
        _cjk_matches(snippet, grams, found)
    if not found:
        return ()
    spans = list(_merge(found))
    return tuple(spans) if snippet.isascii() else _to_bytes(snippet, spans)


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

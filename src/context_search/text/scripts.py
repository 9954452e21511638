"""Which writing systems a text uses, so fusion can tell when an embedder cannot read a query.

An English sentence-embedding model maps Chinese text to vectors close to noise; fused with
a good lexical ranking, that noise costs a third of the quality on Chinese queries. Knowing
the scripts of the query's letters (and the scripts an embedder declares it covers) lets
fusion leave the vector arm out instead of guessing.

Scripts are named as in Unicode (``Latin``, ``Han``, ``Hiragana``, ``Katakana``,
``Hangul``, ``Cyrillic``, ``Greek``, ``Arabic``, ...), read from each letter's Unicode
name after NFKC normalisation (so full-width Latin counts as Latin). Only letters count:
digits, punctuation and symbols belong to every script. Shares are measured in words, not
letters, or ``Aurora 服务重启`` would look mostly Latin: a run of letters of a script written
with spaces is one word, and in scripts written without them (Han, kana, Thai) and in
Hangul's syllable blocks every two characters count as one, about a word's worth of meaning.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["coverage", "normalise_scripts", "script_counts"]

# Unicode character names start with the script for almost every letter; these are the
# exceptions that matter for retrieval text.
_NAME_PREFIX = {
    "CJK": "Han",
    "KANGXI": "Han",
    "IDEOGRAPHIC": "Han",
    "HIRAGANA": "Hiragana",
    "KATAKANA": "Katakana",
    "HANGUL": "Hangul",
    "LATIN": "Latin",
    "CYRILLIC": "Cyrillic",
    "GREEK": "Greek",
    "ARABIC": "Arabic",
    "HEBREW": "Hebrew",
    "DEVANAGARI": "Devanagari",
    "THAI": "Thai",
}


@lru_cache(maxsize=8192)  # a query's every letter; Unicode names are a slow lookup
def _script(ch: str) -> str:
    name = unicodedata.name(ch, "")
    first = name.split(" ", 1)[0]
    return _NAME_PREFIX.get(first, first.title() or "Unknown")


#: Scripts where a character, not a space-delimited run, carries a word's worth of meaning
#: (two characters count as one word); Hangul syllable blocks behave the same way.
_DENSE = frozenset({"Han", "Hiragana", "Katakana", "Hangul", "Thai", "Lao", "Khmer", "Myanmar"})


def _runs(text: str) -> list[tuple[str, int]]:
    """Maximal runs of letters of one script, as (script, letters)."""
    runs: list[tuple[str, int]] = []
    for ch in unicodedata.normalize("NFKC", text):
        if not ch.isalpha():
            runs.append(("", 0))
            continue
        script = _script(ch)
        if runs and runs[-1][0] == script:
            runs[-1] = (script, runs[-1][1] + 1)
        else:
            runs.append((script, 1))
    return [r for r in runs if r[1]]


def script_counts(text: str) -> dict[str, float]:
    """How many words' worth of ``text`` is in each script (see the module docstring).

    In alphabets written with spaces, a run of one or two letters of a script other than
    Latin is notation, not a word (``IL-1β``, ``NF-κB``, ``αvβ8`` in English science), and
    does not count.
    """
    counts: dict[str, float] = {}
    for script, letters in _runs(text):
        if script in _DENSE:
            words = letters / 2
        elif letters <= 2 and script != "Latin":
            continue
        else:
            words = 1.0
        counts[script] = counts.get(script, 0.0) + words
    return counts


def normalise_scripts(scripts: Iterable[str]) -> frozenset[str]:
    """Script names as :func:`script_counts` spells them (``"latin"`` -> ``"Latin"``)."""
    return frozenset(s.strip().title() for s in scripts if s.strip())


def coverage(text: str, scripts: frozenset[str] | None) -> tuple[float, dict[str, float]]:
    """The share of ``text``'s words in ``scripts`` (``None``: every script), and the
    words per script. Text without letters counts as fully covered."""
    counts = script_counts(text)
    total = sum(counts.values())
    if scripts is None or total == 0:
        return 1.0, counts
    return sum(n for s, n in counts.items() if s in scripts) / total, counts

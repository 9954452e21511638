"""Web-search query syntax for the lexical arm: plain words, "quoted phrases", -negation.

Plain words are alternatives (a long natural-language question must not need every word to
match); a quoted phrase is required in order; a ``-word`` or ``-"phrase"`` excludes documents
containing it. Parsing only splits the text: PostgreSQL's own parsers turn each part into
lexemes, so nothing here has to quote tsquery syntax.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from context_search.text.segment import segment_for_query

__all__ = ["LexicalQuery", "parse_query"]

_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')


@dataclass(frozen=True, slots=True)
class LexicalQuery:
    """Segmented parts of a query, ready for ``plainto_tsquery``/``phraseto_tsquery``."""

    words: str
    phrases: tuple[str, ...]
    negated: tuple[str, ...]

    @property
    def positive_text(self) -> str:
        """Every positive word, phrases included: the terms BM25 scores."""
        return " ".join((self.words, *self.phrases)).strip()


def parse_query(text: str) -> LexicalQuery:
    words: list[str] = []
    phrases: list[str] = []
    negated: list[str] = []
    for m in _TOKEN.finditer(text):
        neg, phrase, word = m.group(1), m.group(2), m.group(3)
        if phrase is not None:
            segmented = segment_for_query(phrase).strip()
            if segmented:
                (negated if neg else phrases).append(segmented)
        elif word is not None:
            if word.startswith("-") and len(word) > 1:
                negated.append(segment_for_query(word[1:]))
            elif word != "OR":
                words.append(word)
    return LexicalQuery(
        words=segment_for_query(" ".join(words)), phrases=tuple(phrases), negated=tuple(negated)
    )

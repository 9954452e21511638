"""A chunk's postings: one row per lexeme of its ``tsv``, with the lexeme's term frequency and
its BM25 impact. Every path that writes chunks (a batch's INSERT, the COPY merge) cuts the
postings with this statement, so the impact that orders the lexical arm's first stage has
one definition.
"""

from __future__ import annotations

__all__ = ["insert_postings"]

_INSERT_POSTINGS = """\
    INSERT INTO postings (chunk_id, lexeme, tf, impact, permission_scope, lifecycle)
    SELECT c.chunk_id, u.lexeme, t.tf,
           -- BM25's term-frequency part against a 200-token reference length (k1=1.2,
           -- b=0.75): it only orders postings; scores are computed exactly at query time.
           t.tf * 2.2 / (t.tf + 1.2 * (0.25 + 0.75 * c.token_count / 200.0)),
           c.permission_scope, c.lifecycle
    FROM {chunks}, unnest(c.tsv) AS u,
         LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t
"""


def insert_postings(chunks: str) -> str:
    """The ``INSERT INTO postings`` of the chunk rows ``chunks`` (a fixed ``FROM`` item
    aliased ``c``: the table, or rows just inserted), as SQL text to end a statement."""
    return _INSERT_POSTINGS.format(chunks=chunks)

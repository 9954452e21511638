"""Consistency audit: do documents, chunks, postings, statistics and jobs agree?

Every write keeps these copies in step inside one transaction, and jobs finish what a write
queued. After a crash, a killed backend or a restart an operator (and the reliability suite)
wants proof rather than trust: ``audit(engine)`` counts every row that disagrees with its
document, so a clean index reports zero violations. Runs as the owning role (it must see
every scope) in one snapshot; it reads, never repairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.postings import BLOCK_SIZE, IMPACT, UNSORTED_GROUPS

__all__ = ["AuditReport", "audit"]

#: Live postings against the postings the chunks imply, matched by (chunk, lexeme, group).
_POSTINGS_VS_CHUNKS = "".join(
    (
        """
        SELECT count(*) FROM (
            SELECT chunk_id, lexeme, permission_scope, lifecycle, count(*) AS n,
                   min(impact) AS impact
            FROM postings GROUP BY 1, 2, 3, 4) p
        FULL JOIN (
            SELECT r.chunk_id, u.lexeme, r.permission_scope, r.lifecycle, """,
        IMPACT,
        """ AS impact
            FROM chunks r CROSS JOIN LATERAL unnest(r.tsv) AS u
            CROSS JOIN LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t
            WHERE r.lifecycle <> 'deleted') e
          USING (chunk_id, lexeme, permission_scope, lifecycle)
        WHERE {where}""",
    )
)

#: name -> SQL counting rows that break one invariant.
_CHECKS: dict[str, str] = {
    # A chunk's scope and lifecycle are copies of its document's.
    "chunk_copy_mismatch": """
        SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
        WHERE c.permission_scope <> d.permission_scope OR c.lifecycle <> d.lifecycle""",
    # Postings (the view of the live ones: in blocks, not in their group's tombstones) are what
    # the chunks' tsvectors say: one per lexeme of every chunk not deleted, in the chunk's
    # group, with its impact. Orphans and postings in the wrong group:
    "posting_without_chunk": _POSTINGS_VS_CHUNKS.format(where="e.chunk_id IS NULL"),
    # Duplicates, and impacts that differ from the chunk's:
    "posting_copy_mismatch": _POSTINGS_VS_CHUNKS.format(
        where="p.chunk_id IS NOT NULL AND e.chunk_id IS NOT NULL "
        "AND (p.n <> 1 OR p.impact IS DISTINCT FROM e.impact)"
    ),
    # Every chunk of an indexed document was cut from the version the document says.
    "chunk_wrong_version": """
        SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
        WHERE d.indexed_content_id IS NOT NULL AND c.content_id <> d.indexed_content_id""",
    # A document that says it is indexed has its chunks (an empty body has none).
    "indexed_without_chunks": """
        SELECT count(*) FROM documents d
        WHERE d.indexed_content_id IS NOT NULL AND d.lifecycle <> 'deleted'
          AND (d.body IS NULL OR length(d.body) > 0 OR length(d.title) > 0)
          AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.doc_id)""",
    # A body kept only by its chunks (``engine/bodies.py``) has them: no write may remove
    # the last copy of a document's text.
    "body_without_copy": """
        SELECT count(*) FROM documents d
        WHERE d.body IS NULL
          AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.doc_id)""",
    # Chunks of a document that is not marked indexed (half an index write).
    "chunks_of_unindexed": """
        SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
        WHERE d.indexed_content_id IS NULL""",
    # Every chunk has its postings (a chunk with no lexemes at all has none).
    "chunk_without_postings": _POSTINGS_VS_CHUNKS.format(where="p.chunk_id IS NULL"),
    # BM25 statistics kept by deltas equal a recount.
    "stats_drift": """
        SELECT count(*) FROM (
            SELECT permission_scope, lifecycle, count(*) AS chunks, sum(token_count) AS tokens
            FROM chunks GROUP BY 1, 2) r
        FULL JOIN (SELECT * FROM scope_stats WHERE chunks <> 0 OR tokens <> 0) s
          USING (permission_scope, lifecycle)
        WHERE r.chunks IS DISTINCT FROM s.chunks OR r.tokens IS DISTINCT FROM s.tokens""",
    # Document frequencies kept by triggers equal a recount of the chunks' lexemes.
    "term_stats_drift": """
        SELECT count(*) FROM (
            SELECT u.lexeme, c.permission_scope, c.lifecycle, count(*) AS df
            FROM chunks c CROSS JOIN LATERAL unnest(tsvector_to_array(c.tsv)) AS u(lexeme)
            GROUP BY 1, 2, 3) r
        FULL JOIN (SELECT * FROM term_stats WHERE df <> 0) s
          USING (lexeme, permission_scope, lifecycle)
        WHERE r.df IS DISTINCT FROM s.df""",
    # Each group's counts of blocks and of partial blocks (what merges are scheduled by)
    # equal a recount.
    "block_count_drift": f"""
        SELECT count(*) FROM (
            SELECT lexeme, permission_scope, lifecycle, count(*) AS blocks,
                   count(*) FILTER (WHERE cardinality(chunk_ids) < {BLOCK_SIZE}) AS partial
            FROM posting_blocks GROUP BY 1, 2, 3) r
        FULL JOIN (SELECT * FROM term_stats WHERE blocks <> 0 OR partial <> 0) s
          USING (lexeme, permission_scope, lifecycle)
        WHERE (r.blocks, r.partial) IS DISTINCT FROM (s.blocks, s.partial)""",  # noqa: S608
    # A group marked as one sorted run (``fresh`` 0), which searches read from its first
    # blocks, is one (``engine/postings.py``).
    "unsorted_run": f"""
        SELECT count(*) FROM ({UNSORTED_GROUPS}) u
        JOIN term_stats s USING (lexeme, permission_scope, lifecycle)
        WHERE s.fresh = 0""",  # noqa: S608
    # A tombstone names a chunk id that has left the chunks for good: a chunk leaves a group
    # only by removal or a new id (the trigger refuses anything else) and ids are never
    # reused, which is what lets a merge drop a tombstoned id from every group it rewrites
    # (``indexes/blocks.py``).
    "tombstoned_live_chunk": """
        SELECT count(*) FROM posting_tombstones t
        CROSS JOIN LATERAL unnest(t.chunk_ids) AS d(chunk_id)
        WHERE EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = d.chunk_id)""",
    # A deleted document whose purge is done still has searchable copies.
    "purged_but_present": """
        SELECT count(*) FROM documents d
        WHERE d.lifecycle = 'deleted'
          AND NOT EXISTS (SELECT 1 FROM index_jobs j WHERE j.doc_id = d.doc_id
                          AND j.kind = 'purge' AND j.status <> 'done')
          AND (EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.doc_id)
               OR length(d.body) > 0)""",
    # A running job whose lease ran out long ago: its worker died and nobody retook it.
    "abandoned_jobs": """
        SELECT count(*) FROM index_jobs
        WHERE status = 'running' AND lease_until < now() - interval '10 minutes'""",
}


@dataclass(frozen=True)
class AuditReport:
    documents: dict[str, int]
    chunks: int
    postings: int  # live postings
    jobs: dict[str, int]
    violations: dict[str, int] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        return not any(self.violations.values())


def audit(engine: Engine) -> AuditReport:
    """Count rows and invariant violations in one ``REPEATABLE READ`` snapshot."""
    with translate_errors("audit"), engine.begin() as conn:
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
        documents = {
            str(r[0]): int(r[1])
            for r in conn.execute(text("SELECT lifecycle, count(*) FROM documents GROUP BY 1"))
        }
        jobs = {
            str(r[0]): int(r[1])
            for r in conn.execute(text("SELECT status, count(*) FROM index_jobs GROUP BY 1"))
        }
        chunks = int(conn.execute(text("SELECT count(*) FROM chunks")).scalar_one())
        postings = int(conn.execute(text("SELECT count(*) FROM postings")).scalar_one())
        violations = {
            name: int(conn.execute(text(sql)).scalar_one()) for name, sql in _CHECKS.items()
        }
    return AuditReport(
        documents=documents, chunks=chunks, postings=postings, jobs=jobs, violations=violations
    )

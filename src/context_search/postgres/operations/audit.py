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

__all__ = ["AuditReport", "audit"]

#: name -> SQL counting rows that break one invariant.
_CHECKS: dict[str, str] = {
    # A chunk's scope and lifecycle are copies of its document's.
    "chunk_copy_mismatch": """
        SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
        WHERE c.permission_scope <> d.permission_scope OR c.lifecycle <> d.lifecycle""",
    # A posting's copies follow its chunk.
    "posting_copy_mismatch": """
        SELECT count(*) FROM postings p JOIN chunks c USING (chunk_id)
        WHERE p.permission_scope <> c.permission_scope OR p.lifecycle <> c.lifecycle""",
    # Postings have no foreign key: whatever removes a chunk removes its postings.
    "posting_without_chunk": """
        SELECT count(*) FROM postings p
        WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = p.chunk_id)""",
    # Every chunk of an indexed document was cut from the version the document says.
    "chunk_wrong_version": """
        SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
        WHERE d.indexed_content_id IS NOT NULL AND c.content_id <> d.indexed_content_id""",
    # A document that says it is indexed has its chunks (an empty body has none).
    "indexed_without_chunks": """
        SELECT count(*) FROM documents d
        WHERE d.indexed_content_id IS NOT NULL AND d.lifecycle <> 'deleted'
          AND (length(d.body) > 0 OR length(d.title) > 0)
          AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.doc_id)""",
    # Chunks of a document that is not marked indexed (half an index write).
    "chunks_of_unindexed": """
        SELECT count(*) FROM chunks c JOIN documents d USING (doc_id)
        WHERE d.indexed_content_id IS NULL""",
    # Every chunk has its postings (a chunk with no lexemes at all has none).
    "chunk_without_postings": """
        SELECT count(*) FROM chunks c
        WHERE c.tsv <> ''::tsvector
          AND NOT EXISTS (SELECT 1 FROM postings p WHERE p.chunk_id = c.chunk_id)""",
    # BM25 statistics kept by deltas equal a recount.
    "stats_drift": """
        SELECT count(*) FROM (
            SELECT permission_scope, lifecycle, count(*) AS chunks, sum(token_count) AS tokens
            FROM chunks GROUP BY 1, 2) r
        FULL JOIN (SELECT * FROM scope_stats WHERE chunks <> 0 OR tokens <> 0) s
          USING (permission_scope, lifecycle)
        WHERE r.chunks IS DISTINCT FROM s.chunks OR r.tokens IS DISTINCT FROM s.tokens""",
    # Document frequencies kept by triggers equal a recount of the postings.
    "term_stats_drift": """
        SELECT count(*) FROM (
            SELECT lexeme, permission_scope, lifecycle, count(*) AS df
            FROM postings GROUP BY 1, 2, 3) r
        FULL JOIN (SELECT * FROM term_stats WHERE df <> 0) s
          USING (lexeme, permission_scope, lifecycle)
        WHERE r.df IS DISTINCT FROM s.df""",
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
    postings: int
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

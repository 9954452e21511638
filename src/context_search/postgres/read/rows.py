"""Result rows to contract objects.

The search and evidence statements name their columns after the contract's fields; these
functions are the one place that knows both, so a renamed column breaks here and nowhere
else. Nothing here touches the database.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any

from sqlalchemy import Row

from context_search.contract import (
    ContextDocument,
    EvidenceHit,
    Lifecycle,
    Propagation,
    RankLogEntry,
)
from context_search.fusion import ArmEvidence, ArmPlan, FusionSettings
from context_search.responses import Candidate, IndexState, Ranking, make_hit

__all__ = [
    "SearchRows",
    "StatementRows",
    "context_document",
    "index_state",
    "optional_float",
    "result_columns",
]


def optional_float(value: Any) -> float | None:
    """NUMERIC and REAL columns as float; ``None`` (the document was not in that arm) kept."""
    return None if value is None else float(value)


def index_state(row: Any) -> IndexState:
    """A row naming a document's content and index columns (search hits, evidence rows)."""
    return IndexState(
        doc_id=row.doc_id,
        lifecycle=Lifecycle(row.lifecycle),
        content_id=row.content_id,
        source_revision=row.source_revision,
        indexed_content_id=row.indexed_content_id,
        indexed_config_revision=row.indexed_config_id,
        job_status=row.job_status,
    )


_CANDIDATE_COLUMNS = (
    "doc_id",
    "lexical_rank",
    "lexical_score",
    "vector_rank",
    "vector_similarity",
    "fused",
    "terms",
    "chunk_ordinal",
)


@dataclass(frozen=True, slots=True)
class StatementRows:
    """A statement's rows as plain tuples, and its column names.

    A search returns ~200 rows and reads a few columns of each by position; only the first
    row and the hits' are read by name (:meth:`named`), so only those become named tuples.
    """

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def named(self, row: tuple[Any, ...]) -> Any:
        return _row_type(self.columns)._make(row)


def result_columns(result: Any) -> tuple[str, ...]:
    """A psycopg result's column names (``cursor.description`` builds an object per column)."""
    if result is None:
        return ()
    return tuple(result.fname(i).decode() for i in range(result.nfields))


@lru_cache(maxsize=64)
def _row_type(columns: tuple[str, ...]) -> Any:
    return namedtuple("StatementRow", columns)


def _candidates(rows: Sequence[tuple[Any, ...]], fields: tuple[str, ...]) -> list[Candidate]:
    """Every row's candidate. A search returns ~200 of them, so the columns are read by
    position (looked up once) rather than by name per row: a third of the response's
    assembly time. The statement's scores are double precision, which arrive as floats."""
    if not rows:
        return []
    columns = itemgetter(*(fields.index(name) for name in _CANDIDATE_COLUMNS))
    out = []
    for row in rows:
        doc_id, lex_rank, lex_score, vec_rank, vec_sim, fused, terms, ordinal = columns(row)
        out.append(
            Candidate(
                RankLogEntry(
                    doc_id=doc_id,
                    lexical_rank=lex_rank,
                    lexical_score=lex_score,
                    vector_rank=vec_rank,
                    vector_similarity=vec_sim,
                    fused=fused,
                    final_rank=None,
                ),
                tuple(terms or ()),
                ordinal,
            )
        )
    return out


class SearchRows:
    """The rows of one hybrid search statement: the first carries the statement-wide
    counters, every row with a ``doc_id`` is a fused candidate in order, and the first
    ``detail_limit`` of those carry their document and chunk fields."""

    def __init__(self, result: StatementRows, fusion: FusionSettings, plan: ArmPlan) -> None:
        self._result = result
        first = result.named(result.rows[0])
        evidence = ArmEvidence(
            vector_pool=int(first.evidence_pool),
            agreement=int(first.evidence_agreement),
            excess=optional_float(first.evidence_excess),
            factor=float(first.evidence_factor),
        )
        doc_id = itemgetter(result.columns.index("doc_id"))
        self._rows = {d: r for r in result.rows if (d := doc_id(r)) is not None}
        self.ranking = Ranking(
            candidates=_candidates(list(self._rows.values()), result.columns),
            lexical_pool=int(first.lexical_pool),
            vector_pool=int(first.vector_pool),
            lexical_matches=int(first.lexical_matches),
            lifecycle_filtered=int(first.lifecycle_filtered),
            filter_filtered=int(first.filter_filtered),
            weights=fusion.weigh(plan, evidence),
        )
        self.active_config = str(first.active_config)
        self.pending_config = None if first.pending_config is None else str(first.pending_config)
        self.observed_at: datetime = first.observed_at
        self.propagation = Propagation(
            pending=int(first.jobs_pending),
            running=int(first.jobs_running),
            failed=int(first.jobs_failed),
            oldest_pending_seconds=optional_float(first.oldest_pending_seconds),
        )

    def index_states(self) -> dict[str, IndexState]:
        """Index state of the candidates that carry details (the possible hits)."""
        content_id = itemgetter(self._result.columns.index("content_id"))
        return {
            d: index_state(self._result.named(r))
            for d, r in self._rows.items()
            if content_id(r) is not None
        }

    def hit(self, candidate: Candidate) -> EvidenceHit:
        row = self._result.named(self._rows[candidate.doc_id])
        return make_hit(
            candidate,
            source_system=row.source_system,
            source_uri=row.source_uri,
            object_type=row.object_type,
            title=row.title,
            snippet=row.snippet,
            permission_scope=row.permission_scope,
            lifecycle=Lifecycle(row.lifecycle),
            updated_at=row.updated_at,
            metadata=row.metadata,
            chunk_ordinal=row.chunk_ordinal,
            start_byte=row.start_byte,
            end_byte=row.end_byte,
            # The version the cited chunk was cut from (older than the body while pending).
            content_id=row.chunk_content_id,
        )


def context_document(row: Row[Any]) -> ContextDocument:
    """A documents row; ``visible_successor`` (when selected) replaces ``superseded_by`` so
    a successor the caller cannot read is not named, and ``full_body`` (the body wherever
    it is kept: ``engine/bodies.py``) replaces ``body``."""
    m = row._mapping
    return ContextDocument(
        doc_id=m["doc_id"],
        title=m["title"],
        summary=m["summary"],
        body=m["full_body"],
        source_type=m["source_type"],
        source_system=m["source_system"],
        source_uri=m["source_uri"],
        object_type=m["object_type"],
        permission_scope=m["permission_scope"],
        lifecycle=Lifecycle(m["lifecycle"]),
        review_status=m["review_status"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        owner=m["owner"],
        department=m["department"],
        project=m["project"],
        tags=tuple(m["tags"]),
        entities=tuple(m["entities"]),
        content_id=m["content_id"],
        source_revision=m["source_revision"],
        superseded_by=m["visible_successor"] if "visible_successor" in m else m["superseded_by"],
        masked_fields=tuple(sorted(set(m["field_mask"]) | set(m["pii_flags"]))),
        metadata=dict(m["metadata"]),
    )

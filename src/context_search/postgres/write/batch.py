"""Writing prepared records (see :mod:`context_search.postgres.write.records`) in batches: document
rows, chunks, postings and statistics in the caller's transaction, or an index job when
indexing is deferred.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Connection, Row, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Boolean, Integer, Text

from context_search.contract import Lifecycle, RecordOutcome
from context_search.embedding import Embedder
from context_search.postgres.engine.bodies import held_by_chunks
from context_search.postgres.engine.postings import TOKEN_COUNT
from context_search.postgres.engine.vectors import halfvec_literal
from context_search.postgres.settings import IndexSettings
from context_search.postgres.write.copy import COPY_MIN_CHUNKS, add_counts, copy_chunks, counted
from context_search.postgres.write.gate import LOCK_DOCS, enter_write, lock_documents
from context_search.postgres.write.precomputed import embed_sources
from context_search.postgres.write.records import PreparedRecord
from context_search.text import Chunk
from context_search.validation import OverwritePlan, StoredState, plan_overwrites

__all__ = [
    "DELETE_CHUNKS",
    "ENQUEUE_INDEX",
    "STATS_DELTA",
    "SYNC_COPIES",
    "ChunkSource",
    "ProgressCallback",
    "Turn",
    "replace_chunks",
    "write_batch",
]

#: Called after each committed batch with (records done, records total).
ProgressCallback = Callable[[int, int], None]
#: A batch's turn among batches written side by side (``write/ordered.py``).
Turn = Callable[[Connection, Sequence[Row[Any]]], None]


_DOC_COLUMNS = (
    "doc_id",
    "raw_source_id",
    "source_type",
    "source_system",
    "source_uri",
    "source_hash",
    "object_type",
    "title",
    "summary",
    "body",
    "chunk_spans",
    "permission_scope",
    "review_status",
    "lifecycle",
    "created_at",
    "updated_at",
    "owner",
    "department",
    "project",
    "tags",
    "entities",
    "pii_flags",
    "field_mask",
    "supersedes",
    "embedding_model",
    "ingest_pipeline_version",
    "metadata",
    "content_id",
    "source_revision",
    "record_hash",
)

_UPSERT_DOCS = text(
    "INSERT INTO documents (" + ", ".join(_DOC_COLUMNS) + ", indexed_content_id, "
    "indexed_config_revision) "
    "SELECT " + ", ".join(f"r.{c}" for c in _DOC_COLUMNS) + ", r.content_id, :revision "
    "FROM jsonb_populate_recordset(NULL::documents, CAST(:rows AS jsonb)) AS r "
    "ON CONFLICT (doc_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _DOC_COLUMNS if c != "doc_id")
    + ", superseded_by = NULL, indexed_content_id = EXCLUDED.indexed_content_id, "
    "indexed_config_revision = EXCLUDED.indexed_config_revision, "
    "row_version = documents.row_version + 1, modified_at = now() "
    # xmax = 0: this statement inserted the row (no conflict), so it has no index entries.
    "RETURNING doc_id, (xmax = 0) AS inserted"
).bindparams(bindparam("rows", type_=Text), bindparam("revision", type_=Integer))

#: Deferred indexing: the document changes now, its index entries keep what they were built
#: from (NULL for a new document) until the index job rebuilds them.
_UPSERT_DOCS_DEFERRED = text(
    "INSERT INTO documents (" + ", ".join(_DOC_COLUMNS) + ") "
    "SELECT " + ", ".join(f"r.{c}" for c in _DOC_COLUMNS) + " "
    "FROM jsonb_populate_recordset(NULL::documents, CAST(:rows AS jsonb)) AS r "
    "ON CONFLICT (doc_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _DOC_COLUMNS if c != "doc_id")
    + ", superseded_by = NULL, row_version = documents.row_version + 1, modified_at = now()"
).bindparams(bindparam("rows", type_=Text))

#: What the new chunks were cut from, and where the body is kept now (``engine/bodies.py``):
#: ``held`` true drops the row's copy, false keeps it (``body`` restores it when the row had
#: none), NULL leaves it as the caller wrote it. Only rows it changes: an upsert's document
#: rows already say so, and an UPDATE that changes nothing still writes a new row version (a
#: fresh load's rows were written twice, half the table's pages left free).
_SET_INDEXED = text(
    """
    UPDATE documents
    SET indexed_content_id = u.content_id, indexed_config_revision = :revision,
        body = CASE WHEN u.held IS NULL THEN documents.body
                    WHEN u.held THEN NULL
                    ELSE COALESCE(documents.body, u.body) END
    FROM unnest(:ids, :content_ids, :held, :bodies) AS u(doc_id, content_id, held, body)
    WHERE documents.doc_id = u.doc_id
      AND ((documents.indexed_content_id, documents.indexed_config_revision)
               IS DISTINCT FROM (u.content_id, :revision)
           OR (documents.body IS NULL) <> u.held)
    """
).bindparams(
    bindparam("ids", type_=ARRAY(Text)),
    bindparam("content_ids", type_=ARRAY(Text)),
    bindparam("held", type_=ARRAY(Boolean)),
    bindparam("bodies", type_=ARRAY(Text)),
    bindparam("revision", type_=Integer),
)

#: Queue an index job per document (one pending job per document is enough: it reads the
#: document when it runs).
ENQUEUE_INDEX = text(
    """
    INSERT INTO index_jobs (kind, doc_id, config_revision, scopes)
    SELECT 'index', d.doc_id, :revision, ARRAY[d.permission_scope]
    FROM documents d WHERE d.doc_id = ANY(:ids) ORDER BY d.doc_id
    ON CONFLICT (doc_id) WHERE kind = 'index' AND status = 'pending' DO NOTHING
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)), bindparam("revision", type_=Integer))

#: A synchronous rebuild makes queued index jobs of the same documents redundant.
_SETTLE_INDEX_JOBS = text(
    "UPDATE index_jobs SET status = 'done', done_at = now(), visible_at = now(), "
    "last_error = COALESCE(last_error, 'indexed by a synchronous upsert') "
    "WHERE doc_id = ANY(:ids) AND kind = 'index' AND status = 'pending'"
).bindparams(bindparam("ids", type_=ARRAY(Text)))

#: Scope and lifecycle copies on chunks follow the document (same transaction). A chunk that
#: changes group takes a new id: the triggers on ``chunks`` mark its postings dead under the
#: old one and write them in the new group (``engine/postings.py``).
SYNC_COPIES = text(
    """
    UPDATE chunks SET chunk_id = DEFAULT,
                      permission_scope = d.permission_scope, lifecycle = d.lifecycle
    FROM documents d
    WHERE chunks.doc_id = d.doc_id AND d.doc_id = ANY(:ids)
      AND (chunks.permission_scope, chunks.lifecycle)
          IS DISTINCT FROM (d.permission_scope, d.lifecycle)
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)))

#: A document's chunks (their postings die with them, by trigger).
DELETE_CHUNKS = text("DELETE FROM chunks WHERE doc_id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(Text))
)

#: What a batch compares its records with, locked (see ``gate.lock_documents``).
_LOCK_STORED = lock_documents(
    "doc_id, record_hash, content_id, indexed_content_id, "
    "indexed_config_revision, field_mask, pii_flags, lifecycle, permission_scope"
)

_INSERT_CHUNKS = text(
    counted(f"""
    INSERT INTO chunks (doc_id, ordinal, start_byte, end_byte, text, token_count, tsv,
                        embedding, permission_scope, lifecycle, content_id, config_revision)
    SELECT v.doc_id, v.ordinal, v.start_byte, v.end_byte, v.text,
           {TOKEN_COUNT},
           v.tsv, CAST(v.embedding AS halfvec), v.scope, v.lifecycle, v.content_id, :revision
    FROM (
        SELECT u.*, to_tsvector(CAST(:ts_config AS regconfig), u.index_text) AS tsv
        FROM unnest(:doc_ids, :ordinals, :starts, :ends, :texts, :index_texts, :embeddings,
                    :scopes, :lifecycles, :content_ids)
             AS u(doc_id, ordinal, start_byte, end_byte, text, index_text, embedding, scope,
                  lifecycle, content_id)
        OFFSET 0  -- a fence: pulled up, the subquery's tsv would be computed twice per row
    ) AS v""")  # noqa: S608
).bindparams(
    bindparam("doc_ids", type_=ARRAY(Text)),
    bindparam("ordinals", type_=ARRAY(Integer)),
    bindparam("starts", type_=ARRAY(Integer)),
    bindparam("ends", type_=ARRAY(Integer)),
    bindparam("texts", type_=ARRAY(Text)),
    bindparam("index_texts", type_=ARRAY(Text)),
    bindparam("embeddings", type_=ARRAY(Text)),
    bindparam("scopes", type_=ARRAY(Text)),
    bindparam("lifecycles", type_=ARRAY(Text)),
    bindparam("content_ids", type_=ARRAY(Text)),
    bindparam("revision", type_=Integer),
    bindparam("ts_config", type_=Text),
)

STATS_DELTA = text(
    """
    INSERT INTO scope_stats (permission_scope, lifecycle, chunks, tokens)
    SELECT permission_scope, lifecycle, :sign * count(*), :sign * COALESCE(sum(token_count), 0)
    FROM chunks WHERE doc_id = ANY(:ids)
    GROUP BY permission_scope, lifecycle
    ORDER BY permission_scope, lifecycle
    ON CONFLICT (permission_scope, lifecycle) DO UPDATE
    SET chunks = scope_stats.chunks + EXCLUDED.chunks,
        tokens = scope_stats.tokens + EXCLUDED.tokens
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)), bindparam("sign", type_=Integer))

_SUPERSEDE_DOCS = text(
    """
    UPDATE documents AS d
    SET lifecycle = 'superseded', superseded_by = s.successor,
        row_version = d.row_version + 1, modified_at = now()
    FROM unnest(:old_ids, :successors) AS s(old_id, successor)
    WHERE d.doc_id = s.old_id AND d.lifecycle <> 'deleted'
    """
).bindparams(bindparam("old_ids", type_=ARRAY(Text)), bindparam("successors", type_=ARRAY(Text)))

#: The propagation record of supersedes named by a record, like ``delete_or_supersede``'s.
_RECORD_SUPERSEDES = text(
    """
    INSERT INTO index_jobs (kind, doc_id, config_revision, scopes, payload, visible_at)
    SELECT 'supersede', d.doc_id, :revision, ARRAY[d.permission_scope],
           jsonb_build_object('superseded_by', d.superseded_by), now()
    FROM documents d
    WHERE d.doc_id = ANY(:ids) AND d.lifecycle = 'superseded' AND d.modified_at = now()
    ORDER BY d.doc_id
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)), bindparam("revision", type_=Integer))

_SUPERSEDE_CHUNKS = text(
    "UPDATE chunks SET chunk_id = DEFAULT, lifecycle = 'superseded' "
    "WHERE doc_id = ANY(:old_ids) AND lifecycle <> 'deleted'"
).bindparams(bindparam("old_ids", type_=ARRAY(Text)))


@dataclass(frozen=True, slots=True)
class ChunkSource:
    """What one document's index entries are built from (current stored fields)."""

    doc_id: str
    content_id: str
    permission_scope: str
    lifecycle: str
    chunks: list[Chunk]
    index_texts: list[str]
    #: The (masked) body the chunks were cut from, when the documents row was not written
    #: with them (an index job, a switch); ``None`` when it was, body decided already.
    body: str | None = None


def write_batch(
    conn: Connection,
    batch: Sequence[PreparedRecord],
    embedder: Embedder,
    settings: IndexSettings,
    *,
    deferred: bool = False,
    allow_scope_change: bool = False,
    restore_deleted: bool = False,
    own: bool = True,
    turn: Turn | None = None,
) -> tuple[list[tuple[str, RecordOutcome]], int, int, OverwritePlan]:
    """Write one batch inside the caller's transaction: unchanged rows are skipped entirely.

    ``deferred``: documents change now (visibility included) and an index job is queued;
    their old index entries stay searchable, reported ``pending``, unless the new record
    masks different fields — then they are removed, since they may hold what is now masked.
    What may happen to stored documents (scope changes, deleted ones) is decided by the
    shared overwrite rule under the batch's row locks; a refusal raises before any write.
    Returns outcomes in input order, chunks written, embeddings computed and that decision.
    ``own``: false in a caller's transaction (see ``enter_write``); ``turn``: a batch written
    alongside others (indexed now; no supersedes, no deleted records): its chunks' postings
    are listed, and :func:`replace_chunks` takes its turn.
    """
    enter_write(conn, settings.revision, sorting=own, listing=turn is not None)
    ids = [p.record.document_id for p in batch]
    superseded = {old for p in batch for old in p.record.supersedes}
    if superseded:
        # Documents this batch supersedes are locked with the batch's own, in doc_id order,
        # before any counter is touched: the order every writer follows.
        conn.execute(LOCK_DOCS, {"ids": sorted(superseded | set(ids))})
    existing = {row.doc_id: row for row in conn.execute(_LOCK_STORED, {"ids": ids})}
    plan = plan_overwrites(
        [p.record for p in batch],
        {d: StoredState(r.permission_scope, Lifecycle(r.lifecycle)) for d, r in existing.items()},
        allow_scope_change=allow_scope_change,
        restore_deleted=restore_deleted,
    )
    outcomes: list[tuple[str, RecordOutcome]] = []
    changed: list[PreparedRecord] = []
    for p in batch:
        old = existing.get(p.record.document_id)
        if p.record.document_id in plan.skipped:
            outcomes.append((p.record.document_id, RecordOutcome.SKIPPED))
            continue
        if (
            old is not None
            and old.lifecycle != Lifecycle.DELETED  # restoring rewrites even an equal record
            and old.record_hash == p.hash
            and old.indexed_content_id == old.content_id
            and old.indexed_config_revision == settings.revision
        ):
            outcomes.append((p.record.document_id, RecordOutcome.UNCHANGED))
            continue
        outcomes.append(
            (
                p.record.document_id,
                RecordOutcome.UPDATED if old is not None else RecordOutcome.INSERTED,
            )
        )
        changed.append(p)
    if not changed:
        return outcomes, 0, 0, plan
    # Indexed now, a body its chunks hold is kept by them alone; a deferred one is kept in
    # the row until its index job writes the chunks.
    rows = json.dumps(
        [
            {**p.row, "record_hash": p.hash, **({"body": None} if p.held and not deferred else {})}
            for p in changed
        ],
        default=_json_default,
        ensure_ascii=False,
    )
    changed_ids = [p.record.document_id for p in changed]
    written = 0
    if deferred:
        conn.execute(_UPSERT_DOCS_DEFERRED, {"rows": rows})
        remask = [
            p.record.document_id
            for p in changed
            if (old := existing.get(p.record.document_id)) is not None
            and (
                old.lifecycle == "deleted"  # a deleted body must never come back
                or set(old.field_mask) | set(old.pii_flags) != p.record.masked_fields
            )
        ]
        if remask:
            conn.execute(STATS_DELTA, {"ids": remask, "sign": -1})
            conn.execute(DELETE_CHUNKS, {"ids": remask})
            conn.execute(
                text(
                    "UPDATE documents SET indexed_content_id = NULL, "
                    "indexed_config_revision = NULL WHERE doc_id = ANY(:ids)"
                ).bindparams(bindparam("ids", type_=ARRAY(Text))),
                {"ids": remask},
            )
        conn.execute(STATS_DELTA, {"ids": changed_ids, "sign": -1})
        conn.execute(SYNC_COPIES, {"ids": changed_ids})
        conn.execute(STATS_DELTA, {"ids": changed_ids, "sign": 1})
        conn.execute(ENQUEUE_INDEX, {"ids": changed_ids, "revision": settings.revision})
    else:
        sources = [
            ChunkSource(
                doc_id=p.record.document_id,
                content_id=p.record.content_id,
                permission_scope=p.record.permission_scope,
                lifecycle=p.record.lifecycle.value,
                chunks=p.chunks,
                index_texts=p.index_texts,
            )
            for p in changed
        ]
        vectors = embed_sources(sources, embedder, settings)
        new = {
            r.doc_id
            for r in conn.execute(_UPSERT_DOCS, {"rows": rows, "revision": settings.revision})
            if r.inserted
        }
        written = replace_chunks(
            conn, sources, vectors, settings, new=new, recorded=set(changed_ids), turn=turn
        )
    pairs = [(old, p.record.document_id) for p in changed for old in p.record.supersedes]
    if pairs:
        old_ids = [a for a, _ in pairs]
        conn.execute(STATS_DELTA, {"ids": old_ids, "sign": -1})
        conn.execute(_SUPERSEDE_DOCS, {"old_ids": old_ids, "successors": [b for _, b in pairs]})
        conn.execute(_SUPERSEDE_CHUNKS, {"old_ids": old_ids})
        conn.execute(STATS_DELTA, {"ids": old_ids, "sign": 1})
        conn.execute(_RECORD_SUPERSEDES, {"ids": old_ids, "revision": settings.revision})
    return outcomes, written, written, plan


def replace_chunks(
    conn: Connection,
    sources: Sequence[ChunkSource],
    vectors: np.ndarray[Any, Any],
    settings: IndexSettings,
    *,
    new: AbstractSet[str] = frozenset(),
    recorded: AbstractSet[str] = frozenset(),
    turn: Turn | None = None,
) -> int:
    """Swap the index entries of ``sources`` for new ones, statistics and postings included
    (the new chunks' scope counters from what the statement writing them returns), and
    record what they were built from. Returns the number of chunks written.

    ``recorded``: documents whose rows this transaction wrote saying so, body decided (an
    upsert's); probing them again to change nothing cost a fresh load ~5 % of its time.
    ``turn`` is called before the first statement that locks the counters (write/ordered.py):
    with no counts before stored chunks are taken away, with the new chunks' once written.

    A batch of at least ``COPY_MIN_CHUNKS`` chunks is streamed with binary COPY and merged
    set-based (:mod:`context_search.postgres.write.copy`); a smaller one is one INSERT."""
    ids = [s.doc_id for s in sources]
    replaced = [i for i in ids if i not in new]
    if replaced:  # ``new``: documents known to have no entries yet (nothing to look up)
        if turn is not None:
            turn(conn, ())
        conn.execute(STATS_DELTA, {"ids": replaced, "sign": -1})
        conn.execute(DELETE_CHUNKS, {"ids": replaced})
    if sum(len(s.chunks) for s in sources) >= COPY_MIN_CHUNKS:
        i, counts = copy_chunks(
            conn, sources, vectors, settings.revision, settings.text_search_config
        )
    else:
        i, counts = _insert_chunks(conn, sources, vectors, settings)
    if turn is not None:
        turn(conn, counts)
    add_counts(conn, counts)
    unrecorded = [s for s in sources if s.doc_id not in recorded]
    if unrecorded:
        held = [None if s.body is None else held_by_chunks(s.body, s.chunks) for s in unrecorded]
        conn.execute(
            _SET_INDEXED,
            {
                "ids": [s.doc_id for s in unrecorded],
                "content_ids": [s.content_id for s in unrecorded],
                "held": held,
                # The text only where the row may have lost it: chunks that no longer hold it.
                "bodies": [
                    s.body if h is False else None for s, h in zip(unrecorded, held, strict=True)
                ],
                "revision": settings.revision,
            },
        )
    conn.execute(_SETTLE_INDEX_JOBS, {"ids": ids})
    return i


def _insert_chunks(
    conn: Connection,
    sources: Sequence[ChunkSource],
    vectors: np.ndarray[Any, Any],
    settings: IndexSettings,
) -> tuple[int, Sequence[Row[Any]]]:
    """A small batch: chunks as parameter arrays in one INSERT (postings by trigger), and the
    scope counters' delta it returns."""
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "doc_ids",
            "ordinals",
            "starts",
            "ends",
            "texts",
            "index_texts",
            "embeddings",
            "scopes",
            "lifecycles",
            "content_ids",
        )
    }
    i = 0
    for s in sources:
        for chunk, index_text in zip(s.chunks, s.index_texts, strict=True):
            cols["doc_ids"].append(s.doc_id)
            cols["ordinals"].append(chunk.ordinal)
            cols["starts"].append(chunk.start_byte)
            cols["ends"].append(chunk.end_byte)
            cols["texts"].append(chunk.text)
            cols["index_texts"].append(index_text)
            cols["embeddings"].append(halfvec_literal(vectors[i]))
            cols["scopes"].append(s.permission_scope)
            cols["lifecycles"].append(s.lifecycle)
            cols["content_ids"].append(s.content_id)
            i += 1
    counts = conn.execute(
        _INSERT_CHUNKS,
        {**cols, "revision": settings.revision, "ts_config": settings.text_search_config},
    ).all()
    return i, counts


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

"""Visibility changes made in a write transaction: delete, supersede, and the job that
records each (and any rescope) for the workers that finish or verify it.

Every denormalised copy (chunks, postings, statistics) follows the document in the same
transaction, so no reader ever sees a stale permission or lifecycle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.contract import Lifecycle
from context_search.errors import NotFoundError
from context_search.postgres.write.batch import STATS_DELTA
from context_search.postgres.write.gate import enter_write, lock_documents

__all__ = ["change_visibility", "record_change"]

_LOCK_LIFECYCLES = lock_documents("doc_id, lifecycle")


def change_visibility(
    conn: Connection, doc_id: str, superseded_by: str | None, revision: int
) -> bool:
    """Delete or supersede ``doc_id`` in ``conn``'s transaction; ``False`` when it is
    already gone."""
    enter_write(conn, None)
    # Both documents at once, in doc_id order like every writer (no deadlock
    # between two supersedes pointing at each other's documents).
    locked = {
        str(r.doc_id): str(r.lifecycle)
        for r in conn.execute(
            _LOCK_LIFECYCLES,
            {"ids": sorted({doc_id, superseded_by or doc_id})},
        )
    }
    state = locked.get(doc_id)
    if state is None or state == Lifecycle.DELETED:
        return False
    if superseded_by is not None:
        successor = locked.get(superseded_by)
        if successor is None or successor == Lifecycle.DELETED:
            raise NotFoundError("successor document not found", details={"field": "superseded_by"})
        new_state, kind = Lifecycle.SUPERSEDED.value, "supersede"
    else:
        new_state, kind = Lifecycle.DELETED.value, "purge"
    conn.execute(
        text(
            "UPDATE documents SET lifecycle = :state, superseded_by = :succ, "
            "row_version = row_version + 1, modified_at = now() WHERE doc_id = :id"
        ),
        {"state": new_state, "succ": superseded_by, "id": doc_id},
    )
    conn.execute(STATS_DELTA, {"ids": [doc_id], "sign": -1})
    conn.execute(
        text("UPDATE chunks SET chunk_id = DEFAULT, lifecycle = :state WHERE doc_id = :id"),
        {"state": new_state, "id": doc_id},
    )
    conn.execute(STATS_DELTA, {"ids": [doc_id], "sign": 1})
    record_change(conn, kind, doc_id, revision)
    return True


def record_change(
    conn: Connection,
    kind: str,
    doc_id: str,
    revision: int,
    *,
    scopes: Sequence[str] | None = None,
    payload: Mapping[str, Any] | None = None,
) -> None:
    """Queue the job that finishes (or verifies) a visibility change made in this
    transaction; the change itself is visible at commit, hence ``visible_at = now()``."""
    conn.execute(
        text(
            "INSERT INTO index_jobs (kind, doc_id, config_revision, scopes, payload, visible_at) "
            "SELECT :kind, d.doc_id, :rev, COALESCE(CAST(:scopes AS text[]), "
            "ARRAY[d.permission_scope]), CAST(:payload AS jsonb), now() "
            "FROM documents d WHERE d.doc_id = :id"
        ).bindparams(bindparam("scopes", type_=ARRAY(Text))),
        {
            "kind": kind,
            "id": doc_id,
            "rev": revision,
            "scopes": list(scopes) if scopes is not None else None,
            "payload": json.dumps(dict(payload or {})),
        },
    )

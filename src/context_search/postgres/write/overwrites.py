"""The overwrite rule (see :mod:`context_search.validation.overwrites`) against PostgreSQL.

Each batch decides under its row locks (:func:`~context_search.postgres.write.batch.write_batch`);
a call of several batches first checks all of its records here, so a refused scope change
is refused before the first batch commits instead of after some of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.contract import ContextDocumentRecord, Lifecycle
from context_search.postgres.engine.errors import translate_errors
from context_search.validation import OverwritePlan, StoredState, plan_overwrites

__all__ = ["check_overwrites", "stored_states"]

_STATES = text(
    "SELECT doc_id, permission_scope, lifecycle FROM documents WHERE doc_id = ANY(:ids)"
).bindparams(bindparam("ids", type_=ARRAY(Text)))

#: Ids looked up per statement: bounded parameters for a call of any size.
_LOOKUP = 10_000


def stored_states(conn: Connection, doc_ids: Sequence[str]) -> dict[str, StoredState]:
    """The scope and lifecycle stored for those of ``doc_ids`` that exist."""
    out: dict[str, StoredState] = {}
    for start in range(0, len(doc_ids), _LOOKUP):
        for row in conn.execute(_STATES, {"ids": list(doc_ids[start : start + _LOOKUP])}):
            out[row.doc_id] = StoredState(row.permission_scope, Lifecycle(row.lifecycle))
    return out


def check_overwrites(
    engine: Engine,
    records: Sequence[ContextDocumentRecord],
    *,
    allow_scope_change: bool,
    restore_deleted: bool,
) -> OverwritePlan:
    """Raise ``SCOPE_CHANGE_REFUSED`` now when ``records`` would move stored documents.

    A snapshot read, no locks: the batches decide again under theirs, so a document moved
    by a concurrent writer in between is still caught (in its batch)."""
    ids = [r.document_id for r in records]
    with translate_errors("upsert"), engine.connect() as conn:
        states = stored_states(conn, ids)
    return plan_overwrites(
        records,
        states,
        allow_scope_change=allow_scope_change,
        restore_deleted=restore_deleted,
    )

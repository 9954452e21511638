"""What a write may do to documents that already exist: the one rule every backend applies.

A write must never widen who can see a document because of a default, a re-run or a
missing flag. Re-ingesting a folder under another (or the default) scope, or replaying a
JSONL export after a ``rescope``, would otherwise move stored documents silently; replaying
it after a ``delete`` would bring deleted content back. So, for each record whose document
already exists:

- stored ``deleted`` and not ``restore_deleted``: skipped, the tombstone stays;
- another ``permission_scope`` than the stored one: a scope change, refused for the whole
  call (nothing written) unless ``allow_scope_change``, and reported when allowed.

Every connector reads the stored scope and lifecycle of the records' ids inside its write
transaction and asks :func:`plan_overwrites`; nothing here touches storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from context_search.contract import ContextDocumentRecord, Lifecycle, ScopeChange
from context_search.errors import ScopeChangeRefusedError

__all__ = ["OverwritePlan", "StoredState", "plan_overwrites"]

#: Scope changes listed in a refusal's details (``count`` says how many there were).
_LISTED = 20


@dataclass(frozen=True, slots=True)
class StoredState:
    """What decides an overwrite: the stored document's scope and lifecycle."""

    scope: str
    lifecycle: Lifecycle


@dataclass(frozen=True, slots=True)
class OverwritePlan:
    """The verdict for one write: ids to leave alone, scope changes and restores it makes."""

    skipped: frozenset[str] = frozenset()
    scope_changes: tuple[ScopeChange, ...] = ()
    restored: tuple[str, ...] = ()


def plan_overwrites(
    records: Sequence[ContextDocumentRecord],
    stored: Mapping[str, StoredState],
    *,
    allow_scope_change: bool = False,
    restore_deleted: bool = False,
) -> OverwritePlan:
    """Decide what a write of ``records`` over ``stored`` (their ids' current state; absent
    ids are new documents) may do. Raises ``SCOPE_CHANGE_REFUSED`` before anything is
    written when a record would move a document and ``allow_scope_change`` is not set."""
    skipped: set[str] = set()
    changes: list[ScopeChange] = []
    restored: list[str] = []
    for rec in records:
        old = stored.get(rec.document_id)
        if old is None:
            continue
        deleted = Lifecycle(old.lifecycle) is Lifecycle.DELETED
        if deleted and not restore_deleted:
            skipped.add(rec.document_id)
            continue
        if deleted:
            restored.append(rec.document_id)
        if old.scope != rec.permission_scope:
            changes.append(ScopeChange(rec.document_id, old.scope, rec.permission_scope))
    if changes and not allow_scope_change:
        raise ScopeChangeRefusedError(
            f"{len(changes)} existing document(s) would move to another permission scope "
            f"(first: {changes[0].doc_id!r} from {changes[0].old_scope!r} to "
            f"{changes[0].new_scope!r}); nothing was written",
            details={
                "count": len(changes),
                "changes": [
                    {"doc_id": c.doc_id, "old_scope": c.old_scope, "new_scope": c.new_scope}
                    for c in changes[:_LISTED]
                ],
            },
        )
    return OverwritePlan(frozenset(skipped), tuple(changes), tuple(restored))

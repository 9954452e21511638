"""What a write or a drain of the index job queue reports back."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IngestReport", "RecordOutcome", "ReindexReport", "ScopeChange"]


class RecordOutcome(enum.StrEnum):
    INSERTED = "inserted"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    #: The stored document is deleted and stays deleted: a write of the same id (a re-run
    #: of an ingest, say) never brings deleted content back unless ``restore_deleted``.
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class ScopeChange:
    """A write that moved an existing document to another permission scope: who could see
    it before (``old_scope``) and who can now (``new_scope``). Only a write that was allowed
    to change scopes (``allow_scope_change=True``) makes one."""

    doc_id: str
    old_scope: str
    new_scope: str


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestReport:
    """Per-record outcome of an upsert, in input order.

    ``committed_batches``: the transactions the upsert committed. A connector that writes
    all or nothing commits one; one that commits per batch (PostgreSQL's ``batch_size``)
    reports each. A report means every record committed; an upsert that fails part-way
    raises instead, with ``details["committed"]`` records already committed.
    """

    outcomes: tuple[tuple[str, RecordOutcome], ...]
    chunks_written: int
    embeddings_computed: int
    committed_batches: int = 1
    #: The write's commit token: pass it as ``search(..., consistent_with=token)`` to read
    #: what this call wrote from a replica (``None``: the connector issues none).
    commit_token: str | None = None
    #: Existing documents this write moved to another scope, in input order. A write never
    #: changes a stored scope unless the caller allowed it, and then it says so here.
    scope_changes: tuple[ScopeChange, ...] = ()
    #: Deleted documents this write brought back (``restore_deleted=True``), in input order.
    restored: tuple[str, ...] = ()

    def count(self, outcome: RecordOutcome) -> int:
        return sum(1 for _, o in self.outcomes if o is outcome)

    @property
    def inserted(self) -> int:
        return self.count(RecordOutcome.INSERTED)

    @property
    def updated(self) -> int:
        return self.count(RecordOutcome.UPDATED)

    @property
    def unchanged(self) -> int:
        return self.count(RecordOutcome.UNCHANGED)

    @property
    def skipped(self) -> int:
        return self.count(RecordOutcome.SKIPPED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReindexReport:
    """What one drain of the job queue did; ``retried`` jobs failed and went back to wait."""

    done: int
    retried: int
    failed: int
    remaining: int

"""What a write or a drain of the index job queue reports back."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IngestReport", "RecordOutcome", "ReindexReport"]


class RecordOutcome(enum.StrEnum):
    INSERTED = "inserted"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ReindexReport:
    """What one drain of the job queue did; ``retried`` jobs failed and went back to wait."""

    done: int
    retried: int
    failed: int
    remaining: int

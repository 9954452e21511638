"""How large a write is relative to the index, how many records a transaction takes, and
the state of a streamed load.

A write that replaces a large share of the index is cheaper with the search indexes built
once afterwards than maintained row by row; records whose stored hash already matches are
rewritten by nothing and do not count.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from sqlalchemy import Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.contract import ContextDocumentRecord
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.settings import IndexSettings
from context_search.postgres.write.records import record_hash

__all__ = ["BATCH_RECORDS", "FRESH", "BulkLoad", "incoming_chunks"]

#: Records per transaction of an ``upsert`` unless the caller says otherwise. Each
#: transaction appends a partial posting block to every group it touches and pays a commit,
#: a statement trigger and the counters' updates once; at 256 records a streamed 5,000 took
#: 20 transactions, and its groups' partial blocks passed the count that makes a tail merge
#: due. 5,000 records into a 100k index, four rounds alternated: 7.9 s at 1,024 against
#: 11.4 s at 256 (medians, benchmarks/results/HISTORY.md#footprint). A batch's documents stay
#: locked for its transaction, so the batch is not larger still: at 5,000 (one transaction)
#: nothing is left to prepare while the server writes, and it measured no faster.
BATCH_RECORDS = 1024

#: Documents whose stored record is indexed under this configuration (hash to compare).
FRESH = text(
    "SELECT doc_id, record_hash FROM documents WHERE doc_id = ANY(:ids) "
    "AND indexed_content_id IS NOT DISTINCT FROM content_id "
    "AND indexed_config_revision = :revision"
).bindparams(bindparam("ids", type_=ARRAY(Text)))


@dataclass
class BulkLoad:
    """One ``bulk_load``: what it expects, and whether its first window deferred the search
    index builds to its end (``builds`` holds them until then)."""

    expected_chunks: int
    decided: bool = False
    deferred: bool = False
    builds: ExitStack = field(default_factory=ExitStack, repr=False)


def incoming_chunks(
    engine: Engine, settings: IndexSettings, records: Sequence[ContextDocumentRecord]
) -> tuple[int, int, int]:
    """Estimated chunks of ``records`` that will be (re)written (stored hash differs),
    chunks of all of them, and chunks in the index."""
    sizes = {r.document_id: settings.estimate_chunks(r) for r in records}
    stored: dict[str, str] = {}
    ids = list(sizes)
    with translate_errors("upsert"), engine.connect() as conn:
        for start in range(0, len(ids), 10_000):
            stored.update(
                (row.doc_id, row.record_hash)
                for row in conn.execute(
                    FRESH,
                    {"ids": ids[start : start + 10_000], "revision": settings.revision},
                )
            )
        total = int(conn.execute(text("SELECT count(*) FROM chunks")).scalar_one())
    # Only a stored record is hashed: in a first load, hashing every record would cost as
    # much as a tenth of writing them.
    incoming = sum(
        sizes[r.document_id]
        for r in records
        if r.document_id not in stored or stored[r.document_id] != record_hash(r)
    )
    return incoming, sum(sizes.values()), total

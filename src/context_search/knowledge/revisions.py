"""Identities that say which view of the knowledge an answer was built from.

The mapping revision is fixed by Core before the backend runs and must be echoed only by
an index that covers the mapping; a source revision names the documents of one source as
read; the freshness order says which state is the least recoverable. The canonical
encoding the mapping revision hashes is defined in :mod:`context_search.knowledge.budgets`,
where the same bytes are budgeted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

from context_search.contract import Freshness
from context_search.knowledge.budgets import _canonical_mapping, _checked_targets, _final_targets
from context_search.knowledge.types import KnowledgeTarget

#: From harmless to hopeless: ``pending`` fixes itself, ``failed`` never will.
_FRESHNESS_ORDER = (
    Freshness.FRESH,
    Freshness.PENDING,
    Freshness.STALE_CONTENT,
    Freshness.STALE_CONFIG,
    Freshness.FAILED,
)


def mapping_revision_for(targets: Sequence[KnowledgeTarget]) -> str:
    """Stable identity of a knowledge mapping: SHA-256 of the canonical JSON of the
    validated, de-duplicated targets sorted by ``doc_id``.

    Input order and exact repeats do not change it; any change of a target's identity,
    name, declared source or pins does. Raises ``INVALID_QUERY`` for targets that
    :func:`retrieve_knowledge` would reject (budgets aside).
    """
    final = _final_targets(_checked_targets(targets, max_bytes=None))
    return _mapping_revision(_canonical_mapping(final))


def source_revision_for(pairs: Iterable[tuple[str, str | None]]) -> str:
    """Revision of one source as read: SHA-256 of its targets' sorted ``(doc_id,
    source_revision)`` pairs (``None`` for a target that could not be read).

    It changes whenever any of that source's documents moves to another revision, so it
    says which view of the source an answer was built from.
    """
    rows = sorted(([d, r] for d, r in pairs), key=lambda row: str(row[0]))
    blob = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
    return "src:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


def worst_freshness(values: Iterable[Freshness]) -> Freshness:
    """``fresh`` when every value is, else the least recoverable one."""
    return max(values, key=_FRESHNESS_ORDER.index, default=Freshness.FRESH)


def _mapping_revision(canonical: bytes) -> str:
    return "map:" + hashlib.sha256(canonical).hexdigest()

"""The values of a knowledge search: the request, its targets, and the hits and evidence a
retriever answers with.

They live apart from the code that builds or checks them so that Core, any backend and the
connector-backed retriever share one vocabulary without depending on one another. The
request's bounds are here too, because :class:`KnowledgeRequest`'s defaults are made of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from context_search.contract import Freshness
from context_search.validation import MAX_TARGETS, MAX_TOP_K

#: Upper bound of ``limit``; equal to the connectors' ``top_k`` bound so a
#: :class:`ConnectorKnowledgeRetriever` can always honour it in one search.
MAX_KNOWLEDGE_LIMIT = MAX_TOP_K

#: Upper bound of ``max_targets``: the most targets a connector accepts in one search, so
#: one request is always one search transaction.
MAX_KNOWLEDGE_TARGETS = MAX_TARGETS

DEFAULT_MAX_KNOWLEDGE_TARGETS = 100

#: Upper bound (and default) of ``max_target_bytes``.
MAX_KNOWLEDGE_TARGET_BYTES = 16 * 1024 * 1024

#: Hard bound on the raw target array, checked before a single item is looked at: it caps
#: the work of validating and de-duplicating whatever a caller sends, whatever budget the
#: request claims. Duplicates are tolerated up to it; only de-duplicated targets are
#: budgeted by ``max_targets``.
MAX_RAW_KNOWLEDGE_TARGETS = 10 * MAX_KNOWLEDGE_TARGETS


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeTarget:
    """One document the caller's formal mapping selected for this search.

    ``source`` is the provider/source system the mapping says the document comes from; an
    index whose record disagrees does not cover this mapping. ``knowledge_id`` is the
    mapping's name for the document (defaults to ``doc_id``); a retriever may read by
    either. ``expected_content_id`` pins the content the mapping was made from (a content
    change then makes the mapping old); ``source_revision`` pins the source revision the
    caller relies on (``REVISION_MISMATCH`` when it is not the readable one).
    """

    doc_id: str
    source: str
    knowledge_id: str = ""
    expected_content_id: str | None = None
    source_revision: str | None = None

    def __post_init__(self) -> None:
        if self.knowledge_id == "" and isinstance(self.doc_id, str):
            object.__setattr__(self, "knowledge_id", self.doc_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeRequest:
    """A knowledge search: ``text`` within ``targets``, at most ``limit`` hits.

    ``max_targets`` budgets the de-duplicated targets (1..:data:`MAX_KNOWLEDGE_TARGETS`);
    ``max_target_bytes`` budgets the UTF-8 size of the target declarations, both the raw
    array and the canonical encoding of the final targets (the bytes the mapping revision
    is computed over). Both are checked before any backend work. A retriever receives the
    final targets: validated, de-duplicated, in first-seen order.
    """

    text: str
    targets: Sequence[KnowledgeTarget]
    limit: int = 10
    max_targets: int = DEFAULT_MAX_KNOWLEDGE_TARGETS
    max_target_bytes: int = MAX_KNOWLEDGE_TARGET_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeHit:
    """A traceable passage of a selected document.

    ``start_byte``/``end_byte`` are UTF-8 byte offsets into the stored body, end exclusive,
    and ``snippet == body.encode()[start_byte:end_byte].decode()``. ``title``,
    ``source_system`` and ``source_uri`` in a checked result come from the caller's mapping
    and a read of the document, never from the backend: routing data from an untrusted
    backend could point a reader at anything.
    """

    doc_id: str
    knowledge_id: str
    chunk_ordinal: int
    start_byte: int
    end_byte: int
    snippet: str
    score: float
    title: str = ""
    source_system: str = ""
    source_uri: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeDocument:
    """What the index holds for one target next to what the document is now.

    ``source`` is the source system the index has on record for the document (compared
    with the target's declared ``source``); ``content_id`` the current content identity;
    ``indexed_content_id`` / ``indexed_config_revision`` what its index entries were built
    from (``None``: never indexed).
    """

    doc_id: str
    knowledge_id: str
    source: str
    content_id: str
    indexed_content_id: str | None
    indexed_config_revision: str | None
    source_revision: str
    freshness: Freshness


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeEvidence:
    """Proof of what was searched, complete even when nothing matched.

    ``revision_by_source`` covers exactly the final targets' declared sources; each value
    is :func:`source_revision_for` over that source's targets as read. ``mapping_revision``
    echoes the request's mapping revision only if the index covers every target (empty
    otherwise). ``source_config_revision`` is the active index/retrieval configuration,
    ``indexed_config_revision`` the one the targets were indexed under (``None`` when mixed
    or never indexed). ``documents`` has one entry per target, in target order.
    ``observed_at`` is the store's clock at the search, not the time the query was made;
    ``freshness`` is ``fresh`` or the worst document freshness.
    """

    revision_by_source: Mapping[str, str]
    mapping_revision: str
    source_config_revision: str
    indexed_config_revision: str | None
    documents: tuple[KnowledgeDocument, ...]
    observed_at: datetime
    freshness: Freshness


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeResult:
    """Hits in backend order plus the evidence; ``index_status`` is the overall freshness.

    A result from :func:`retrieve_knowledge` is always ``searched`` and ``fresh``: anything
    else is an error, never a result.
    """

    hits: tuple[KnowledgeHit, ...]
    evidence: KnowledgeEvidence
    index_status: Freshness
    knowledge_state: Literal["searched"] = "searched"

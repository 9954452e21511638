"""Knowledge search over an explicit target set, answered with evidence that proves coverage.

Two halves, deliberately separate, as in :mod:`context_search.capability`. A
:class:`KnowledgeRetriever` is an untrusted backend: it searches only the targets it is
given, reads original text only through the query-scoped :class:`KnowledgeAccess` it is
handed, and answers with hits plus evidence. :func:`retrieve_knowledge` is the checking
side (seed 000's "Core"): it validates and budgets the request before any backend work,
fixes the mapping identity (:func:`mapping_revision_for`) the backend must echo, and only
after the access object is dead does it check the evidence and every hit against a read
of the documents made with the caller's own scopes.

Why the evidence: zero hits mean either "nothing matched" or "the index does not cover the
latest knowledge". Only the evidence (every target's content identity, the mapping, config
revisions, the store's observation time, freshness) tells them apart, so Core refuses to
answer (``INDEX_STALE``) rather than let the second pass as the first, and never falls back
to reading bodies itself and scanning them: a degraded answer that looks like a real one is
worse than an error.

:class:`ConnectorKnowledgeRetriever` is a retriever on any
:class:`~context_search.contract.SearchConnector`, so knowledge search uses the same hybrid
ranking, scope enforcement, targets and pins as document search.

Byte offsets are UTF-8 byte offsets into the stored body (end exclusive) everywhere; a
character offset would cite different text as soon as a body holds one non-ASCII character.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Literal, Protocol, runtime_checkable

from context_search.contract import (
    ContextDocument,
    DocumentEvidence,
    EvidenceHit,
    Freshness,
    Lifecycle,
    SearchQuery,
    SearchResponse,
)
from context_search.errors import (
    BackendError,
    ContextSearchError,
    IndexStaleError,
    InvalidQueryError,
    InvalidResultError,
    NotFoundError,
    RetrieverUnconfiguredError,
    RevisionMismatchError,
    UnauthorizedError,
)
from context_search.validation import (
    MAX_ID_CHARS,
    MAX_QUERY_BYTES,
    MAX_TARGETS,
    MAX_TOP_K,
    check_text,
    validate_scopes,
)

__all__ = [
    "DEFAULT_MAX_KNOWLEDGE_TARGETS",
    "MAX_KNOWLEDGE_LIMIT",
    "MAX_KNOWLEDGE_TARGETS",
    "MAX_KNOWLEDGE_TARGET_BYTES",
    "MAX_RAW_KNOWLEDGE_TARGETS",
    "ConnectorKnowledgeRetriever",
    "KnowledgeAccess",
    "KnowledgeDocument",
    "KnowledgeEvidence",
    "KnowledgeHit",
    "KnowledgeIndex",
    "KnowledgeReader",
    "KnowledgeRequest",
    "KnowledgeResult",
    "KnowledgeRetriever",
    "KnowledgeTarget",
    "mapping_revision_for",
    "retrieve_knowledge",
    "source_revision_for",
    "worst_freshness",
]

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

_MAX_REVISION_BYTES = 1024
_MAPPING_VERSION = 1

#: From harmless to hopeless: ``pending`` fixes itself, ``failed`` never will.
_FRESHNESS_ORDER = (
    Freshness.FRESH,
    Freshness.PENDING,
    Freshness.STALE_CONTENT,
    Freshness.STALE_CONFIG,
    Freshness.FAILED,
)

_NOT_A_TARGET = "knowledge access is limited to the targets of this request"
_EXPIRED = "this knowledge access has expired: it is only valid during retrieve()"
_NOT_READABLE = "knowledge target is not readable"


# -- data ---------------------------------------------------------------------------------


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


# -- backend interfaces -------------------------------------------------------------------


class KnowledgeReader(Protocol):
    """Where knowledge is read from. Every ``SearchConnector`` satisfies it."""

    def get_document(
        self, doc_id: str, allowed_scopes: Sequence[str]
    ) -> ContextDocument | None: ...


class KnowledgeIndex(KnowledgeReader, Protocol):
    """The part of a ``SearchConnector`` a :class:`ConnectorKnowledgeRetriever` needs."""

    def search(self, query: SearchQuery) -> SearchResponse: ...


class KnowledgeAccess:
    """Query-scoped read access to the original text of this request's targets only.

    Names are the targets' ``doc_id`` or ``knowledge_id``; nothing else is readable, and a
    denied name gets the same answer whether or not a document of that name exists, so the
    access cannot be used to probe. A listed target that is missing, deleted or outside the
    caller's scopes reads as ``NOT_FOUND``, identically. The access is closed as soon as
    ``retrieve()`` settles; a retriever that kept it for later gets ``UNAUTHORIZED``
    (``reason: expired``), also for a read that was in flight when it closed, so no bytes
    escape into background work. Denied reads are counted: Core fails the request even if
    the retriever swallowed the error, because trying is already a bug.
    """

    __slots__ = ("_denied", "_lock", "_names", "_open", "_reader", "_scopes")

    def __init__(
        self,
        reader: KnowledgeReader,
        targets: Iterable[KnowledgeTarget],
        allowed_scopes: Sequence[str],
    ) -> None:
        self._reader = reader
        self._scopes: tuple[str, ...] = tuple(sorted(validate_scopes(allowed_scopes)))
        listed = tuple(targets)
        names: dict[str, str] = {t.doc_id: t.doc_id for t in listed}
        for target in listed:
            # A doc id always names its own document, even if another target's
            # knowledge_id collides with it (Core rejects such requests anyway).
            names.setdefault(target.knowledge_id, target.doc_id)
        self._names = MappingProxyType(names)
        self._lock = threading.Lock()
        self._open = True
        self._denied = 0

    @property
    def closed(self) -> bool:
        with self._lock:
            return not self._open

    @property
    def denied_reads(self) -> int:
        """How many reads of names outside the request were attempted."""
        with self._lock:
            return self._denied

    def close(self) -> None:
        with self._lock:
            self._open = False

    def read(self, doc_id: str) -> tuple[bytes, str]:
        """The target's body as UTF-8 bytes and its content id (a masked body reads empty)."""
        self._ensure_open()
        target = self._names.get(doc_id) if isinstance(doc_id, str) else None
        if target is None:
            with self._lock:
                self._denied += 1
            raise UnauthorizedError(_NOT_A_TARGET, details={"reason": "not_a_target"})
        document = self._reader.get_document(target, self._scopes)
        self._ensure_open()
        if document is None:
            raise NotFoundError(_NOT_READABLE, details={"reason": "not_readable"})
        return document.body.encode("utf-8"), document.content_id

    def _ensure_open(self) -> None:
        with self._lock:
            if not self._open:
                raise UnauthorizedError(_EXPIRED, details={"reason": "expired"})


@runtime_checkable
class KnowledgeRetriever(Protocol):
    """A knowledge search backend.

    ``retrieve`` searches only ``request.targets``, reads original text only through
    ``access`` (never by keeping it), checks every target's index entries against the
    source's content identity, config revision and the mapping *before* answering, echoes
    ``mapping_revision`` only when its index covers every target, and raises on failure
    rather than return nothing.
    """

    @property
    def id(self) -> str:
        """Stable name of the backend, for errors and audit logs."""
        ...

    def retrieve(
        self, request: KnowledgeRequest, access: KnowledgeAccess, mapping_revision: str
    ) -> KnowledgeResult: ...


# -- revisions ----------------------------------------------------------------------------


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


def _canonical_mapping(final: Sequence[KnowledgeTarget]) -> bytes:
    rows = sorted(
        (
            {
                "doc_id": t.doc_id,
                "expected_content_id": t.expected_content_id,
                "knowledge_id": t.knowledge_id,
                "source": t.source,
                "source_revision": t.source_revision,
            }
            for t in final
        ),
        key=lambda row: str(row["doc_id"]),
    )
    return json.dumps(
        {"targets": rows, "v": _MAPPING_VERSION},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")


def _mapping_revision(canonical: bytes) -> str:
    return "map:" + hashlib.sha256(canonical).hexdigest()


# -- the checking side --------------------------------------------------------------------


def retrieve_knowledge(
    retriever: KnowledgeRetriever | None,
    request: KnowledgeRequest,
    *,
    reader: KnowledgeReader,
    allowed_scopes: Sequence[str],
) -> KnowledgeResult:
    """Search ``request.targets`` for ``request.text`` as the caller and check the answer.

    ``reader`` is the source of truth for the targets (normally the same connector the
    retriever indexes) and ``allowed_scopes`` the caller's authority: the retriever's
    access reads with them, and Core re-reads every target with them after the retriever
    returned, so a retriever configured with wider scopes still cannot reveal a document
    the caller may not see (it looks exactly like a missing target). That re-read is one
    ``get_document`` per target (bodies are kept only for documents with hits); it is what
    lets a zero hit be believed, since it checks the evidence against the source itself.

    Order: unconfigured -> request and budgets -> mapping revision -> access -> retriever
    -> access closed -> evidence -> hits. Backend failures raise (``ContextSearchError``
    unchanged, anything else as ``BACKEND_ERROR``); stale evidence raises
    ``INDEX_STALE``; a pin that is not readable raises ``REVISION_MISMATCH``; a result
    breaking the retriever contract raises ``INVALID_RESULT`` as a whole.
    """
    if retriever is None:
        raise RetrieverUnconfiguredError("no knowledge retriever is configured")
    scopes = validate_scopes(allowed_scopes)
    checked, final, canonical = _validate_request(request)
    mapping_revision = _mapping_revision(canonical)
    retriever_id = _retriever_id(retriever)
    access = KnowledgeAccess(reader, final, tuple(scopes))
    try:
        raw = retriever.retrieve(checked, access, mapping_revision)
    except ContextSearchError:
        raise
    except Exception as exc:
        # The backend's own message may quote data of any scope; keep only its type.
        raise BackendError(
            f"knowledge retriever {retriever_id!r} failed",
            details={"retriever": retriever_id, "cause": type(exc).__name__},
        ) from exc
    finally:
        access.close()
    if access.denied_reads:
        raise UnauthorizedError(
            f"knowledge retriever {retriever_id!r} tried to read knowledge outside the request",
            details={
                "retriever": retriever_id,
                "reason": "not_a_target",
                "attempts": access.denied_reads,
            },
        )
    return _check(raw, checked, final, mapping_revision, reader, scopes, retriever_id)


def _validate_request(
    request: object,
) -> tuple[KnowledgeRequest, tuple[KnowledgeTarget, ...], bytes]:
    if not isinstance(request, KnowledgeRequest):
        raise InvalidQueryError("expected a KnowledgeRequest", details={"field": "request"})
    text = check_text(request.text, name="text", max_bytes=MAX_QUERY_BYTES, allow_empty=False)
    limit = _bounded_int(request.limit, "limit", MAX_KNOWLEDGE_LIMIT)
    max_targets = _bounded_int(request.max_targets, "max_targets", MAX_KNOWLEDGE_TARGETS)
    max_bytes = _bounded_int(
        request.max_target_bytes, "max_target_bytes", MAX_KNOWLEDGE_TARGET_BYTES
    )
    final = _final_targets(_checked_targets(request.targets, max_bytes=max_bytes))
    if len(final) > max_targets:
        raise _budget_error("count", max_targets, len(final))
    canonical = _canonical_mapping(final)
    if len(canonical) > max_bytes:
        raise _budget_error("bytes", max_bytes, len(canonical))
    checked = KnowledgeRequest(
        text=text,
        targets=final,
        limit=limit,
        max_targets=max_targets,
        max_target_bytes=max_bytes,
    )
    return checked, final, canonical


def _bounded_int(value: object, name: str, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQueryError(f"{name} must be an integer", details={"field": name})
    if not 1 <= value <= upper:
        raise InvalidQueryError(
            f"{name} must be between 1 and {upper}", details={"field": name, "limit": upper}
        )
    return value


def _budget_error(budget: str, limit: int, actual: int) -> InvalidQueryError:
    what = {
        "raw_count": "raw target array has",
        "raw_bytes": "raw target array declares",
        "count": "de-duplicated targets are",
        "bytes": "de-duplicated targets encode to",
    }[budget]
    unit = "bytes" if budget.endswith("bytes") else "entries"
    return InvalidQueryError(
        f"targets over budget: the {what} more than {limit} {unit}",
        details={"field": "targets", "budget": budget, "limit": limit, "actual": actual},
    )


def _checked_targets(raw: object, *, max_bytes: int | None) -> list[KnowledgeTarget]:
    """Every raw item, validated; the raw array's size is budgeted before items are read."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise InvalidQueryError(
            "targets must be a sequence of KnowledgeTarget", details={"field": "targets"}
        )
    if not raw:
        raise InvalidQueryError("targets must not be empty", details={"field": "targets"})
    if len(raw) > MAX_RAW_KNOWLEDGE_TARGETS:
        raise _budget_error("raw_count", MAX_RAW_KNOWLEDGE_TARGETS, len(raw))
    items: list[KnowledgeTarget] = []
    total = 0
    for index, item in enumerate(raw):
        items.append(_check_target(index, item))
        total += _declared_bytes(item)
        if max_bytes is not None and total > max_bytes:
            # Stop at once: the rest of an oversized array is never even validated.
            raise _budget_error("raw_bytes", max_bytes, total)
    return items


def _check_target(index: int, item: object) -> KnowledgeTarget:
    if not isinstance(item, KnowledgeTarget):
        raise InvalidQueryError(
            f"targets[{index}] must be a KnowledgeTarget",
            details={"field": "targets", "index": index},
        )
    for part in ("doc_id", "knowledge_id", "source"):
        _check_part(index, part, getattr(item, part), max_chars=MAX_ID_CHARS)
    for part in ("expected_content_id", "source_revision"):
        value = getattr(item, part)
        if value is not None:
            # Empty would be a pin nobody can satisfy on purpose: ``None`` means "no pin".
            _check_part(index, part, value, max_chars=_MAX_REVISION_BYTES)
    return item


def _check_part(index: int, part: str, value: object, *, max_chars: int) -> None:
    try:
        check_text(value, name=part, allow_empty=False)
    except InvalidQueryError as exc:
        raise InvalidQueryError(
            f"targets[{index}].{exc.message}",
            details={"field": "targets", "index": index, "part": part},
        ) from None
    if isinstance(value, str) and len(value) > max_chars:
        raise InvalidQueryError(
            f"targets[{index}].{part} is longer than {max_chars} characters",
            details={"field": "targets", "index": index, "part": part, "limit": max_chars},
        )


def _declared_bytes(item: KnowledgeTarget) -> int:
    parts = (
        item.doc_id,
        item.knowledge_id,
        item.source,
        item.expected_content_id or "",
        item.source_revision or "",
    )
    return sum(len(p.encode("utf-8")) for p in parts)


def _final_targets(items: Sequence[KnowledgeTarget]) -> tuple[KnowledgeTarget, ...]:
    """De-duplicate in first-seen order; a repeat that disagrees, or a name that would let
    one read resolve to two documents, is ambiguous and rejected."""
    by_doc: dict[str, tuple[int, KnowledgeTarget]] = {}
    for index, item in enumerate(items):
        prior = by_doc.get(item.doc_id)
        if prior is None:
            by_doc[item.doc_id] = (index, item)
        elif prior[1] != item:
            raise InvalidQueryError(
                f"targets[{index}] repeats doc_id of targets[{prior[0]}] with another declaration",
                details={"field": "targets", "index": index, "reason": "conflicting_duplicate"},
            )
    owners: dict[str, str] = {}
    for index, item in by_doc.values():
        for name in dict.fromkeys((item.doc_id, item.knowledge_id)):
            if owners.setdefault(name, item.doc_id) != item.doc_id:
                raise InvalidQueryError(
                    f"targets[{index}] uses a name that already names another target",
                    details={"field": "targets", "index": index, "reason": "ambiguous_name"},
                )
    return tuple(item for _, item in by_doc.values())


def _retriever_id(retriever: KnowledgeRetriever) -> str:
    try:
        value = retriever.id
    except Exception:
        return "<unnamed>"
    return value if isinstance(value, str) and value else "<unnamed>"


@dataclass(frozen=True, slots=True)
class _Current:
    """Core's own read of a target (body kept only for documents that have hits)."""

    source_system: str
    lifecycle: Lifecycle
    content_id: str
    source_revision: str
    title: str
    source_uri: str
    body: bytes | None


def _read_current(
    reader: KnowledgeReader,
    doc_id: str,
    scopes: frozenset[str],
    keep_body: bool,
    retriever_id: str,
) -> _Current | None:
    try:
        document = reader.get_document(doc_id, tuple(sorted(scopes)))
    except ContextSearchError:
        raise
    except Exception as exc:
        raise BackendError(
            "reading a knowledge target failed",
            details={"retriever": retriever_id, "cause": type(exc).__name__},
        ) from exc
    if document is None:
        return None
    return _Current(
        source_system=document.source_system,
        lifecycle=document.lifecycle,
        content_id=document.content_id,
        source_revision=document.source_revision,
        title=document.title,
        source_uri=document.source_uri,
        body=document.body.encode("utf-8") if keep_body else None,
    )


def _invalid(retriever_id: str, problem: str, **details: object) -> InvalidResultError:
    return InvalidResultError(
        f"knowledge retriever {retriever_id!r} broke the contract: {problem}",
        details={"retriever": retriever_id, **details},
    )


def _check(
    raw: object,
    request: KnowledgeRequest,
    final: tuple[KnowledgeTarget, ...],
    mapping_revision: str,
    reader: KnowledgeReader,
    scopes: frozenset[str],
    retriever_id: str,
) -> KnowledgeResult:
    result = _check_shape(raw, retriever_id)
    evidence = result.evidence
    by_id = {t.doc_id: t for t in final}
    sources = {t.source for t in final}
    keys = set(evidence.revision_by_source)
    if keys != sources:
        # Extra names are the backend's, possibly about other providers: count, never echo.
        raise _invalid(
            retriever_id,
            "revision_by_source must cover exactly the targets' sources",
            reason="revision_by_source_keys",
            missing=sorted(sources - keys),
            extra=len(keys - sources),
        )
    documents = _index_documents(evidence.documents, by_id, retriever_id)

    hit_ids = {h.doc_id for h in result.hits if isinstance(h.doc_id, str) and h.doc_id in by_id}
    current = {
        t.doc_id: _read_current(reader, t.doc_id, scopes, t.doc_id in hit_ids, retriever_id)
        for t in final
    }
    _check_pins(final, current)
    _check_mapping(final, current, evidence.mapping_revision, mapping_revision)
    missing = [t.doc_id for t in final if t.doc_id not in documents]
    if missing:
        raise _invalid(
            retriever_id, "evidence lacks documents of some targets", missing=sorted(missing)
        )
    _check_freshness(final, documents, current, evidence)
    if evidence.indexed_config_revision != evidence.source_config_revision:
        raise _invalid(
            retriever_id,
            "indexed_config_revision disagrees with the documents",
            reason="indexed_config_revision",
        )
    if result.index_status is not Freshness.FRESH:
        raise _invalid(
            retriever_id, "index_status disagrees with the evidence", reason="index_status"
        )
    expected_revisions = {
        source: source_revision_for(
            (t.doc_id, _source_revision(current[t.doc_id])) for t in final if t.source == source
        )
        for source in sorted(sources)
    }
    wrong = sorted(s for s in sources if evidence.revision_by_source[s] != expected_revisions[s])
    if wrong:
        raise _invalid(
            retriever_id,
            "revision_by_source does not match the sources as read",
            reason="revision_by_source_values",
            sources=wrong,
        )
    hits = _check_hits(result.hits, request.limit, by_id, current, retriever_id)
    return KnowledgeResult(
        hits=hits,
        evidence=KnowledgeEvidence(
            revision_by_source=MappingProxyType(expected_revisions),
            mapping_revision=mapping_revision,
            source_config_revision=evidence.source_config_revision,
            indexed_config_revision=evidence.indexed_config_revision,
            documents=tuple(documents[t.doc_id] for t in final),
            observed_at=evidence.observed_at,
            freshness=Freshness.FRESH,
        ),
        index_status=Freshness.FRESH,
    )


def _source_revision(current: _Current | None) -> str | None:
    return None if current is None else current.source_revision


def _check_shape(raw: object, retriever_id: str) -> KnowledgeResult:
    if not isinstance(raw, KnowledgeResult):
        raise _invalid(
            retriever_id, "expected a KnowledgeResult", type=type(raw).__name__, reason="type"
        )
    if raw.knowledge_state != "searched":
        raise _invalid(retriever_id, "knowledge_state must be 'searched'", reason="state")
    if not isinstance(raw.index_status, Freshness):
        raise _invalid(retriever_id, "index_status must be a Freshness", reason="index_status")
    hits = raw.hits
    if not isinstance(hits, tuple) or not all(isinstance(h, KnowledgeHit) for h in hits):
        raise _invalid(retriever_id, "hits must be a tuple of KnowledgeHit", reason="hits")
    evidence = raw.evidence
    if not isinstance(evidence, KnowledgeEvidence):
        raise _invalid(retriever_id, "evidence must be a KnowledgeEvidence", reason="evidence")
    revisions = evidence.revision_by_source
    if not isinstance(revisions, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in revisions.items()
    ):
        raise _invalid(
            retriever_id,
            "revision_by_source must map source to a non-empty revision",
            reason="revision_by_source",
        )
    if not isinstance(evidence.mapping_revision, str):
        raise _invalid(retriever_id, "mapping_revision must be a string", reason="mapping")
    if not isinstance(evidence.source_config_revision, str) or not evidence.source_config_revision:
        raise _invalid(
            retriever_id, "source_config_revision must be a non-empty string", reason="config"
        )
    if evidence.indexed_config_revision is not None and not isinstance(
        evidence.indexed_config_revision, str
    ):
        raise _invalid(retriever_id, "indexed_config_revision must be a string", reason="config")
    observed = evidence.observed_at
    if not isinstance(observed, datetime) or observed.utcoffset() is None:
        # A naive time cannot be compared with anything: it proves nothing.
        raise _invalid(
            retriever_id, "observed_at must be a timezone-aware datetime", reason="observed_at"
        )
    if not isinstance(evidence.freshness, Freshness):
        raise _invalid(retriever_id, "freshness must be a Freshness", reason="freshness")
    if not isinstance(evidence.documents, tuple):
        raise _invalid(retriever_id, "documents must be a tuple", reason="documents")
    return raw


def _index_documents(
    documents: tuple[object, ...],
    by_id: Mapping[str, KnowledgeTarget],
    retriever_id: str,
) -> dict[str, KnowledgeDocument]:
    out: dict[str, KnowledgeDocument] = {}
    for position, doc in enumerate(documents):
        if not isinstance(doc, KnowledgeDocument) or not _document_well_formed(doc):
            raise _invalid(retriever_id, f"document #{position} is malformed", reason="documents")
        target = by_id.get(doc.doc_id)
        if target is None:
            # Do not echo the id: it may name a document the caller cannot see.
            raise _invalid(
                retriever_id,
                f"document #{position} is not one of the request's targets",
                reason="documents",
            )
        if doc.doc_id in out:
            raise _invalid(
                retriever_id, f"document #{position} repeats a target", reason="documents"
            )
        if doc.knowledge_id != target.knowledge_id:
            raise _invalid(
                retriever_id,
                f"document #{position} has another knowledge_id than its target",
                reason="documents",
            )
        out[doc.doc_id] = doc
    return out


def _document_well_formed(doc: KnowledgeDocument) -> bool:
    texts = (doc.doc_id, doc.knowledge_id, doc.source, doc.content_id, doc.source_revision)
    optional = (doc.indexed_content_id, doc.indexed_config_revision)
    return (
        all(isinstance(v, str) for v in texts)
        and all(v is None or isinstance(v, str) for v in optional)
        and isinstance(doc.freshness, Freshness)
    )


def _check_pins(final: Sequence[KnowledgeTarget], current: Mapping[str, _Current | None]) -> None:
    for target in final:
        if target.source_revision is None:
            continue
        now = current[target.doc_id]
        if now is None or now.source_revision != target.source_revision:
            # Same words as the connectors: unreadable and other-revision are one answer.
            raise RevisionMismatchError(
                "a pinned source revision is not the readable one",
                details={"doc_id": target.doc_id, "pinned": target.source_revision},
            )


class _Uncovered(enum.StrEnum):
    UNAVAILABLE = "unavailable"
    SUPERSEDED = "superseded"
    SOURCE_MISMATCH = "source_mismatch"
    CONTENT_MISMATCH = "content_mismatch"


def _check_mapping(
    final: Sequence[KnowledgeTarget],
    current: Mapping[str, _Current | None],
    echoed: str,
    mapping_revision: str,
) -> None:
    """The mapping must describe the sources as they are *and* the index must say it covers
    it. Core's own read decides the first, so a target outside the caller's scopes reads
    exactly like a missing one, whatever the retriever saw."""
    problems: dict[str, str] = {}
    for target in final:
        now = current[target.doc_id]
        if now is None:
            problems[target.doc_id] = _Uncovered.UNAVAILABLE
        elif now.lifecycle is not Lifecycle.ACTIVE:
            problems[target.doc_id] = _Uncovered.SUPERSEDED
        elif now.source_system != target.source:
            problems[target.doc_id] = _Uncovered.SOURCE_MISMATCH
        elif target.expected_content_id not in (None, now.content_id):
            problems[target.doc_id] = _Uncovered.CONTENT_MISMATCH
    if problems or echoed != mapping_revision:
        raise IndexStaleError(
            "the index does not cover this knowledge mapping",
            details={
                "reason": "mapping_not_covered",
                "mapping_revision": mapping_revision,
                "targets": {k: str(v) for k, v in sorted(problems.items())},
            },
        )


def _check_freshness(
    final: Sequence[KnowledgeTarget],
    documents: Mapping[str, KnowledgeDocument],
    current: Mapping[str, _Current | None],
    evidence: KnowledgeEvidence,
) -> None:
    """A freshness label is not trusted on its own: identities and config revisions are
    compared too, and so is Core's later read (``changed``: the source moved on after the
    index was searched, so the hits may cite bytes that no longer exist)."""
    states: dict[str, str] = {}
    for target in final:
        doc = documents[target.doc_id]
        now = current[target.doc_id]
        if doc.freshness is not Freshness.FRESH:
            states[doc.doc_id] = doc.freshness.value
        elif now is None or (doc.content_id, doc.source_revision, doc.source) != (
            now.content_id,
            now.source_revision,
            now.source_system,
        ):
            states[doc.doc_id] = "changed"
        elif doc.indexed_content_id != doc.content_id:
            states[doc.doc_id] = Freshness.STALE_CONTENT.value
        elif doc.indexed_config_revision != evidence.source_config_revision:
            states[doc.doc_id] = Freshness.STALE_CONFIG.value
    if states or evidence.freshness is not Freshness.FRESH:
        raise IndexStaleError(
            "the index does not cover the latest content of every target",
            details={
                "reason": "not_fresh",
                "freshness": evidence.freshness.value,
                "documents": dict(sorted(states.items())),
            },
        )


def _check_hits(
    hits: tuple[KnowledgeHit, ...],
    limit: int,
    by_id: Mapping[str, KnowledgeTarget],
    current: Mapping[str, _Current | None],
    retriever_id: str,
) -> tuple[KnowledgeHit, ...]:
    if len(hits) > limit:
        raise _invalid(retriever_id, f"more than {limit} hits", reason="limit")
    accepted: list[KnowledgeHit] = []
    seen: set[tuple[str, int, int]] = set()
    for rank, hit in enumerate(hits, start=1):

        def bad(problem: str, rank: int = rank) -> InvalidResultError:
            return _invalid(retriever_id, f"hit at rank {rank} {problem}", rank=rank)

        target = by_id.get(hit.doc_id) if isinstance(hit.doc_id, str) else None
        if target is None:
            raise bad("is not one of the request's targets")
        if hit.knowledge_id != target.knowledge_id:
            raise bad("has another knowledge_id than its target")
        now = current[hit.doc_id]
        if now is None or now.body is None:  # pragma: no cover - mapping check ran first
            raise bad("cites a target that is not readable")
        body = now.body
        start, end = hit.start_byte, hit.end_byte
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            raise bad("has non-integer offsets")
        if not 0 <= start <= end <= len(body):
            raise bad("has offsets outside the body")
        if not (_on_boundary(body, start) and _on_boundary(body, end)):
            raise bad("has offsets that split a UTF-8 character")
        if not isinstance(hit.snippet, str) or hit.snippet != body[start:end].decode("utf-8"):
            raise bad("has a snippet that is not the body's bytes at its offsets")
        ordinal = hit.chunk_ordinal
        if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
            raise bad("has an invalid chunk_ordinal")
        score = hit.score
        if (
            isinstance(score, bool)
            or not isinstance(score, (int, float))
            or not math.isfinite(score)
        ):
            raise bad("has a score that is not a finite number")
        if (hit.doc_id, start, end) in seen:
            raise bad("repeats an earlier hit")
        seen.add((hit.doc_id, start, end))
        accepted.append(
            KnowledgeHit(
                doc_id=hit.doc_id,
                knowledge_id=target.knowledge_id,
                chunk_ordinal=ordinal,
                start_byte=start,
                end_byte=end,
                snippet=hit.snippet,
                score=float(score),
                title=now.title,
                source_system=now.source_system,
                source_uri=now.source_uri,
            )
        )
    return tuple(accepted)


def _on_boundary(body: bytes, offset: int) -> bool:
    """True unless ``offset`` points at a UTF-8 continuation byte (``10xxxxxx``)."""
    return offset == len(body) or (body[offset] & 0xC0) != 0x80


# -- a retriever on the hybrid search machinery -------------------------------------------


class ConnectorKnowledgeRetriever:
    """A :class:`KnowledgeRetriever` whose index is a ``SearchConnector``.

    One ``search`` restricted to the targets (with their pins) returns hits and evidence
    for every readable target in one transaction; each target's record is then read to
    compare its source system and content with the mapping, and hit bytes come from the
    request's :class:`KnowledgeAccess`. Only when every target is covered and fresh are
    hits returned; otherwise the evidence alone goes back, and ``mapping_revision`` is
    echoed only when every target is covered, so Core can say which case it is.

    ``allowed_scopes`` is fixed at construction (server-side configuration, not something a
    request can widen); give it the caller's scopes. ``min_similarity``: a candidate found
    by the vector arm alone is a hit only if its cosine similarity reaches it. With the
    default ``None`` every candidate the connector ranks is a hit, and since the vector arm
    ranks every target that has vectors, a zero hit then only happens for targets without
    index entries; set it (the right value depends on the embedding model) when "no
    passage is relevant" must be a possible answer. The search asks for up to
    ``max(limit, len(targets))`` documents (at most :data:`MAX_KNOWLEDGE_LIMIT`) so
    filtering rarely loses a lexical match; beyond that many targets it can.
    """

    def __init__(
        self,
        connector: KnowledgeIndex,
        *,
        allowed_scopes: Sequence[str],
        min_similarity: float | None = None,
        id: str = "context-search-knowledge-index",
    ) -> None:
        scopes = validate_scopes(allowed_scopes)
        if not scopes:
            raise InvalidQueryError(
                "a knowledge index reading with no scopes would never find anything",
                details={"field": "allowed_scopes"},
            )
        if min_similarity is not None and (
            isinstance(min_similarity, bool)
            or not isinstance(min_similarity, (int, float))
            or not -1.0 <= min_similarity <= 1.0
        ):
            raise InvalidQueryError(
                "min_similarity must be a number between -1 and 1",
                details={"field": "min_similarity"},
            )
        check_text(id, name="id", max_bytes=MAX_ID_CHARS, allow_empty=False)
        self._connector = connector
        self._scopes: tuple[str, ...] = tuple(sorted(scopes))
        self._min_similarity = None if min_similarity is None else float(min_similarity)
        self._id = id

    @property
    def id(self) -> str:
        return self._id

    def retrieve(
        self, request: KnowledgeRequest, access: KnowledgeAccess, mapping_revision: str
    ) -> KnowledgeResult:
        targets = tuple(request.targets)
        ids = [t.doc_id for t in targets]
        response = self._connector.search(
            SearchQuery(
                query=request.text,
                allowed_scopes=self._scopes,
                top_k=min(MAX_KNOWLEDGE_LIMIT, max(request.limit, len(ids))),
                targets=ids,
                pinned_revisions={
                    t.doc_id: t.source_revision for t in targets if t.source_revision is not None
                },
            )
        )
        config = response.evidence.config_revision
        indexed = {d.doc_id: d for d in response.evidence.documents}
        documents: dict[str, KnowledgeDocument] = {}
        covered = True
        for target in targets:
            entry = indexed.get(target.doc_id)
            record = (
                None if entry is None else self._connector.get_document(target.doc_id, self._scopes)
            )
            if entry is None or record is None:
                covered = False
                continue
            if (
                record.lifecycle is not Lifecycle.ACTIVE
                or record.source_system != target.source
                or target.expected_content_id not in (None, entry.content_id)
            ):
                covered = False
            documents[target.doc_id] = KnowledgeDocument(
                doc_id=target.doc_id,
                knowledge_id=target.knowledge_id,
                source=record.source_system,
                content_id=entry.content_id,
                indexed_content_id=entry.indexed_content_id,
                indexed_config_revision=entry.indexed_config_revision,
                source_revision=entry.source_revision,
                freshness=_entry_freshness(entry, record, config),
            )
        hits: tuple[KnowledgeHit, ...] = ()
        if covered and all(d.freshness is Freshness.FRESH for d in documents.values()):
            hits, changed = self._hits(response.hits, targets, documents, access, request.limit)
            for doc_id in changed:
                documents[doc_id] = replace(documents[doc_id], freshness=Freshness.STALE_CONTENT)
            if changed:
                hits = ()
        configs = {d.indexed_config_revision for d in documents.values()}
        return KnowledgeResult(
            hits=hits,
            evidence=KnowledgeEvidence(
                revision_by_source={
                    source: source_revision_for(
                        (
                            t.doc_id,
                            documents[t.doc_id].source_revision if t.doc_id in documents else None,
                        )
                        for t in targets
                        if t.source == source
                    )
                    for source in dict.fromkeys(t.source for t in targets)
                },
                mapping_revision=mapping_revision if covered else "",
                source_config_revision=config,
                indexed_config_revision=next(iter(configs)) if len(configs) == 1 else None,
                documents=tuple(documents[t.doc_id] for t in targets if t.doc_id in documents),
                observed_at=response.evidence.observed_at,
                freshness=worst_freshness(d.freshness for d in documents.values()),
            ),
            index_status=worst_freshness(d.freshness for d in documents.values()),
        )

    def _hits(
        self,
        found: Sequence[EvidenceHit],
        targets: Sequence[KnowledgeTarget],
        documents: Mapping[str, KnowledgeDocument],
        access: KnowledgeAccess,
        limit: int,
    ) -> tuple[tuple[KnowledgeHit, ...], set[str]]:
        """Hits with snippets cut from the real bytes, plus the documents whose bytes turned
        out to differ from what was searched (changed since the search)."""
        by_id = {t.doc_id: t for t in targets}
        bodies: dict[str, bytes | None] = {}
        changed: set[str] = set()
        hits: list[KnowledgeHit] = []
        for hit in found:
            target = by_id.get(hit.doc_id)
            if target is None or not self._relevant(hit) or len(hits) >= limit:
                continue
            if hit.doc_id not in bodies:
                bodies[hit.doc_id] = self._body(access, hit.doc_id, documents[hit.doc_id])
            body = bodies[hit.doc_id]
            if body is None or hit.content_id != documents[hit.doc_id].content_id:
                changed.add(hit.doc_id)
                continue
            try:
                snippet = body[hit.start_byte : hit.end_byte].decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidResultError(
                    "the connector returned offsets that split a UTF-8 character",
                    details={"retriever": self._id},
                ) from None
            if snippet != hit.snippet:
                # The indexed chunk is not these bytes: its entries were built from others.
                changed.add(hit.doc_id)
                continue
            hits.append(
                KnowledgeHit(
                    doc_id=hit.doc_id,
                    knowledge_id=target.knowledge_id,
                    chunk_ordinal=hit.chunk_ordinal,
                    start_byte=hit.start_byte,
                    end_byte=hit.end_byte,
                    snippet=snippet,
                    score=hit.score,
                    title=hit.title,
                    source_system=hit.source_system,
                    source_uri=hit.source_uri,
                )
            )
        return tuple(hits), changed

    @staticmethod
    def _body(access: KnowledgeAccess, doc_id: str, document: KnowledgeDocument) -> bytes | None:
        """The bytes that were searched, or ``None`` when the document moved on since."""
        try:
            body, content_id = access.read(doc_id)
        except NotFoundError:
            return None
        return body if content_id == document.content_id else None

    def _relevant(self, hit: EvidenceHit) -> bool:
        if self._min_similarity is None or hit.score_parts.lexical_rank is not None:
            return True
        similarity = hit.score_parts.vector_similarity
        return similarity is not None and similarity >= self._min_similarity


def _entry_freshness(entry: DocumentEvidence, record: ContextDocument, config: str) -> Freshness:
    if entry.freshness is not Freshness.FRESH:
        return entry.freshness
    if record.content_id != entry.content_id:
        return Freshness.STALE_CONTENT  # changed between the search and this read
    if entry.indexed_content_id != entry.content_id:
        return Freshness.STALE_CONTENT
    if entry.indexed_config_revision != config:
        return Freshness.STALE_CONFIG
    return Freshness.FRESH

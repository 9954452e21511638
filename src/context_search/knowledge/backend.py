"""The boundary with an untrusted backend: what a knowledge retriever must be, what it reads
from, and the one query-scoped door through which it may read original text.

A retriever is handed a :class:`KnowledgeAccess`, never a reader or a knowledge root, so
its reads are limited to the knowledge selected for this request and end when
``retrieve()`` does. Keeping these interfaces in one place keeps that boundary visible.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from context_search.contract import ContextDocument, SearchQuery, SearchResponse
from context_search.errors import NotFoundError, UnauthorizedError
from context_search.knowledge.types import KnowledgeRequest, KnowledgeResult, KnowledgeTarget
from context_search.validation import validate_scopes

_NOT_A_TARGET = "knowledge access is limited to the targets of this request"
_EXPIRED = "this knowledge access has expired: it is only valid during retrieve()"
_NOT_READABLE = "knowledge target is not readable"


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

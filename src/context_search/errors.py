"""The error hierarchy: one base class, one subclass per failure kind, one stable code each.

Callers branch on ``error.code`` (a string that never changes meaning) or on the class;
the message is for humans and may change. Messages never name documents, owners, titles
or paths the caller cannot see, so an error cannot be used to probe for existence.

=========================  =====================================================
code                       meaning
=========================  =====================================================
``INVALID_INPUT``          base of the four input codes below (never raised itself)
``INVALID_QUERY``          query text, top_k, scopes or min_score are malformed
``INVALID_FILTER``         unknown filter key/operator or a value of the wrong type
``INVALID_RECORD``         an ingestion record is malformed (names the record)
``INVALID_CONFIG``         a connector or index setting is malformed (names the setting)
``NOT_FOUND``              no visible document with that id (missing == out of scope)
``INDEX_STALE``            the index does not cover the latest content of a target
``REVISION_MISMATCH``      a pinned revision is not the readable one
``RETRIEVER_UNCONFIGURED`` no retrieval backend is configured for the request
``SCHEMA_NOT_READY``       a read-only open found the schema missing or not at the head
``BACKEND_UNAVAILABLE``    the database could not be started or reached
``BACKEND_ERROR``          the database failed while serving a request
``CANCELLED``              the call was cancelled or ran past its time limit
``EMBEDDING_FAILED``       the embedder raised while embedding; nothing was written
``DUPLICATE_QUERY``        the same retrieval key was already attempted in this request
``EFFECT_FAILED``          a retrieval effect failed after the retrieval succeeded
``QUOTA_EXCEEDED``         the caller's retrieval quota is used up
``UNAUTHORIZED``           the caller may not perform this operation
``NOT_INSTALLED``          an optional part the call needs is not installed (an extra)
``SCOPE_CHANGE_REFUSED``   a write would move stored documents to another scope
``INVALID_RESULT``         a backend returned a result violating the contract
=========================  =====================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "ContextSearchError",
    "DuplicateQueryError",
    "EmbeddingFailedError",
    "IndexStaleError",
    "InvalidConfigError",
    "InvalidFilterError",
    "InvalidInputError",
    "InvalidQueryError",
    "InvalidRecordError",
    "InvalidResultError",
    "NotFoundError",
    "NotInstalledError",
    "OperationCancelledError",
    "QuotaExceededError",
    "RetrievalEffectError",
    "RetrieverUnconfiguredError",
    "RevisionMismatchError",
    "SchemaNotReadyError",
    "ScopeChangeRefusedError",
    "UnauthorizedError",
    "error_class_for",
]

_REGISTRY: dict[str, type[ContextSearchError]] = {}


class ContextSearchError(Exception):
    """Base of every error this library raises on purpose.

    ``details`` carries machine-readable context (field names, limits) that is safe to show
    the caller; it never contains data from documents outside the caller's scopes.
    """

    code: ClassVar[str] = "CONTEXT_SEARCH_ERROR"
    #: One line telling a person what to do about it (shown by the CLI and the gateway). It
    #: may only point at what every surface shows — the code and the message — because a
    #: terminal shows ``details`` only with ``--json``. A raiser that knows better than the
    #: class (an admin command that takes no scopes) passes its own.
    hint: str = ""

    def __init__(
        self, message: str, *, details: Mapping[str, Any] | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        if hint is not None:
            self.hint = hint

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Only a class that declares a code owns it; a subclass keeping its parent's code
        # (a more specific failure of the same kind) is looked up as the parent.
        if "code" not in cls.__dict__:
            return
        if cls.code in _REGISTRY:
            raise TypeError(f"duplicate error code {cls.code}")
        _REGISTRY[cls.code] = cls

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable across process pools despite keyword-only details.
        return (_rebuild, (self.code, self.message, self.details, self.hint))

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe shape used by the CLI and the tool gateway."""
        return {"code": self.code, "message": self.message, "details": dict(self.details)}


def _rebuild(code: str, message: str, details: dict[str, Any], hint: str) -> ContextSearchError:
    return error_class_for(code)(message, details=details, hint=hint)


def error_class_for(code: str) -> type[ContextSearchError]:
    """Look an error class up by its stable code (the base class for unknown codes)."""
    return _REGISTRY.get(code, ContextSearchError)


class InvalidInputError(ContextSearchError, ValueError):
    """Base of every rejection of the caller's input; nothing was read or written."""

    code = "INVALID_INPUT"
    hint = "fix the input the message names and try again"


class InvalidQueryError(InvalidInputError):
    code = "INVALID_QUERY"
    hint = "fix what the message names (the query text, top_k, the scopes or a limit) and retry"


class InvalidFilterError(InvalidInputError):
    code = "INVALID_FILTER"
    hint = "filter on a documented field (see the README's filters) with a value of its type"


class InvalidRecordError(InvalidInputError):
    code = "INVALID_RECORD"
    hint = "fix the record the message names (its line, number or id) and ingest again"


class InvalidConfigError(InvalidInputError):
    """A setting given to a connector, a worker or the CLI is malformed (not a query)."""

    code = "INVALID_CONFIG"
    hint = "fix the setting the message names and try again"


class NotFoundError(ContextSearchError, LookupError):
    code = "NOT_FOUND"
    hint = "check the id and the scopes you read with: a document you may not see looks missing"
    #: For callers that read without scopes (administration): only the id can be wrong.
    unscoped_hint: ClassVar[str] = "check the id: no live document has it"


class NotInstalledError(ContextSearchError, ImportError):
    """An optional part the call needs is not installed: a pip extra (``details["extra"]``)
    or the benchmark suites, which live in a source checkout. The message says what to
    install; nothing was read or written."""

    code = "NOT_INSTALLED"
    hint = "install what the message names, then run the command again"


class IndexStaleError(ContextSearchError):
    code = "INDEX_STALE"
    hint = "run `context-search reindex` (or wait for the workers), then ask again"


class RevisionMismatchError(ContextSearchError):
    code = "REVISION_MISMATCH"
    hint = "re-read the document for its current source_revision, or drop the pin"


class RetrieverUnconfiguredError(ContextSearchError):
    code = "RETRIEVER_UNCONFIGURED"
    hint = "open the index with its configured embedder and settings, or configure a retriever"


class SchemaNotReadyError(ContextSearchError):
    """A read-only connector found no index schema, or one at another migration revision
    than this package's head; ``details``: ``schema``, ``current`` (``None``: missing),
    ``head``, ``reason`` (``missing`` / ``behind`` / ``unknown``). Nothing was created or
    migrated: a read-only open never writes."""

    code = "SCHEMA_NOT_READY"
    hint = "run `context-search migrate` (or open a writer) against the primary, then retry"


class BackendUnavailableError(ContextSearchError, ConnectionError):
    code = "BACKEND_UNAVAILABLE"
    hint = "start PostgreSQL or set CONTEXT_SEARCH_DSN / --dsn to a reachable server"


class BackendError(ContextSearchError, RuntimeError):
    code = "BACKEND_ERROR"
    hint = "see the server log; the request was rolled back and can be retried"


class OperationCancelledError(ContextSearchError):
    """A statement timeout or an explicit cancel stopped the call; ``details["reason"]`` is
    ``"timeout"`` or ``"cancelled"``. Reads return nothing partial; writes rolled back."""

    code = "CANCELLED"
    hint = "the call hit its time limit or was cancelled; retry, or raise the timeout"


class EmbeddingFailedError(ContextSearchError):
    code = "EMBEDDING_FAILED"
    hint = "the embedder raised (--verbose shows why); nothing of the batch was written"


class DuplicateQueryError(ContextSearchError):
    code = "DUPLICATE_QUERY"
    hint = "this exact request already ran in this context; change it or start a new context"


class QuotaExceededError(ContextSearchError):
    code = "QUOTA_EXCEEDED"
    hint = "the per-request retrieval quota is used up; start a new request"


class UnauthorizedError(ContextSearchError, PermissionError):
    code = "UNAUTHORIZED"
    hint = "the caller may not do this; check its scopes and the listed targets"


class ScopeChangeRefusedError(ContextSearchError):
    """A write would change who may see documents that already exist; nothing was written.

    ``details["changes"]`` lists them (``doc_id``, ``old_scope``, ``new_scope``; the first
    few, ``details["count"]`` all of them). Raised to the writer, who owns the documents.
    """

    code = "SCOPE_CHANGE_REFUSED"
    hint = (
        "give the records their stored scope, move documents with rescope, or allow the "
        "move explicitly: upsert(..., allow_scope_change=True) / ingest --allow-rescope"
    )


class InvalidResultError(ContextSearchError):
    code = "INVALID_RESULT"
    hint = "the backend broke the contract; report it to the backend's owner"


class RetrievalEffectError(ContextSearchError):
    """An effect failed after the retrieval itself succeeded.

    The success is already counted and its sources recorded, and earlier effects already
    ran; none of that is undone. ``receipt`` is the real receipt (with the extensions the
    earlier effects wrote), so the caller can still use the result. ``details`` names the
    failed effect, the ones that completed and the ones skipped. After pickling only code,
    message and details survive (``receipt`` becomes ``None``).
    """

    code = "EFFECT_FAILED"
    hint = "the retrieval's result is in error.receipt; earlier effects were not undone"

    def __init__(
        self,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        hint: str | None = None,
        receipt: Any = None,
    ) -> None:
        super().__init__(message, details=details, hint=hint)
        self.receipt = receipt

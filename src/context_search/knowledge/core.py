"""Core's entry point, :func:`retrieve_knowledge`.

It is the one place that fixes the order of a knowledge search, so no step runs before the
checks it relies on: the request is validated and budgeted before any backend work, the
mapping revision is fixed before the retriever sees the request, and the answer is checked
only after the retriever's access has closed.
"""

from __future__ import annotations

from collections.abc import Sequence

from context_search.errors import (
    BackendError,
    ContextSearchError,
    RetrieverUnconfiguredError,
    UnauthorizedError,
)
from context_search.knowledge.backend import KnowledgeAccess, KnowledgeReader, KnowledgeRetriever
from context_search.knowledge.budgets import _validate_request
from context_search.knowledge.revisions import _mapping_revision
from context_search.knowledge.types import KnowledgeRequest, KnowledgeResult
from context_search.knowledge.verification import _check
from context_search.validation import validate_scopes


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


def _retriever_id(retriever: KnowledgeRetriever) -> str:
    try:
        value = retriever.id
    except Exception:
        return "<unnamed>"
    return value if isinstance(value, str) and value else "<unnamed>"

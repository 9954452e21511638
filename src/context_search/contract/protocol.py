"""The ``SearchConnector`` protocol: the operations every retrieval backend offers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from context_search.contract.gaps import GapReceipt, GapReport
from context_search.contract.records import ContextDocument, ContextDocumentRecord
from context_search.contract.reports import IngestReport, ReindexReport
from context_search.contract.search import RankExplanation, SearchQuery, SearchResponse

__all__ = ["SearchConnector"]


@runtime_checkable
class SearchConnector(Protocol):
    """A retrieval backend seen through the contract.

    Every method treats a document outside ``allowed_scopes`` exactly like one that does not
    exist. Bad input raises a :class:`~context_search.errors.ContextSearchError` subclass
    (``INVALID_QUERY``, ``INVALID_FILTER``, ``INVALID_RECORD``); backend failure raises
    ``BACKEND_ERROR`` / ``BACKEND_UNAVAILABLE`` and never returns an empty success.
    """

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        """Insert or replace records atomically (all or nothing); raises ``INVALID_RECORD``.

        A write never widens who may see an existing document by default: a record whose
        ``permission_scope`` differs from the stored document's refuses the whole call with
        ``SCOPE_CHANGE_REFUSED`` (nothing written) unless ``allow_scope_change=True``; then
        the move is listed in ``IngestReport.scope_changes``. A record for a deleted document
        is ``skipped`` (deleted stays deleted) unless ``restore_deleted=True``; then it is
        written and listed in ``IngestReport.restored``. ``rescope`` is the operation for
        moving one document.

        A connector that takes a ``batch_size`` is atomic per batch instead and says so: a
        failure then leaves earlier batches committed and names how many records
        (``details["committed"]``); see ``IngestReport.committed_batches``.

        ``defer_indexing=True`` stores the documents (visibility and metadata change at
        once) and queues the chunking and embedding; until :meth:`reindex` has run, their
        evidence says ``pending``.
        """
        ...

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        """Move a live document to another permission scope; effective at commit, for every
        reader. ``False`` when no such live document exists."""
        ...

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        """Work queued index jobs (deferred ingestion, purges, config changes) until the
        queue is empty or ``max_jobs`` were taken."""
        ...

    def search(self, query: SearchQuery) -> SearchResponse:
        """Ranked evidence visible to ``query.allowed_scopes``; raises on bad input."""
        ...

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        """The masked document, or ``None`` when missing, deleted or out of scope (identical)."""
        ...

    def report_gap(self, report: GapReport) -> GapReceipt:
        """Record a gap; the same report always gets the same ``gap_id``."""
        ...

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        """Explain ranking of a visible document; ``NOT_FOUND`` when invisible (identical)."""
        ...

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        """Delete (no successor) or supersede; ``False`` when no such live document exists."""
        ...

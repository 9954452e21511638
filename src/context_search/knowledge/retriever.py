"""A knowledge retriever on any :class:`~context_search.contract.SearchConnector`.

Knowledge search then uses the same hybrid ranking, scope enforcement, targets and pins as
document search. It is a backend like any other: it sees Core only through the
:class:`~context_search.knowledge.backend.KnowledgeRetriever` interface, and Core checks
its answers exactly as it checks anyone else's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from context_search.contract import (
    ContextDocument,
    DocumentEvidence,
    EvidenceHit,
    Freshness,
    Lifecycle,
    SearchQuery,
)
from context_search.errors import InvalidQueryError, InvalidResultError, NotFoundError
from context_search.knowledge.backend import KnowledgeAccess, KnowledgeIndex
from context_search.knowledge.revisions import source_revision_for, worst_freshness
from context_search.knowledge.types import (
    MAX_KNOWLEDGE_LIMIT,
    KnowledgeDocument,
    KnowledgeEvidence,
    KnowledgeHit,
    KnowledgeRequest,
    KnowledgeResult,
    KnowledgeTarget,
)
from context_search.responses import IndexState, freshness
from context_search.validation import MAX_ID_CHARS, check_text, validate_scopes


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
    """The search's label, re-decided against the body read afterwards: content that moved
    on between the search and this read makes the entry stale like any other."""
    if entry.freshness is not Freshness.FRESH:
        return entry.freshness
    return freshness(
        IndexState(
            doc_id=entry.doc_id,
            lifecycle=entry.lifecycle,
            content_id=record.content_id,
            source_revision=record.source_revision,
            indexed_content_id=entry.indexed_content_id,
            indexed_config_revision=entry.indexed_config_revision,
        ),
        config,
    )

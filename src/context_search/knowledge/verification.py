"""Checking a retriever's answer once its access has closed.

Every claim of the evidence and every hit is compared with Core's own read of the targets,
made with the caller's scopes, so the untrusted side never decides what is true: evidence
that does not prove coverage of the latest content is ``INDEX_STALE``, a pin that is not
readable ``REVISION_MISMATCH``, an answer breaking the retriever contract
``INVALID_RESULT`` as a whole. A checked hit's routing data (title, source) comes from that
read, never from the backend.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from context_search.contract import Freshness, Lifecycle
from context_search.errors import (
    BackendError,
    ContextSearchError,
    IndexStaleError,
    InvalidResultError,
    RevisionMismatchError,
)
from context_search.knowledge.backend import KnowledgeReader
from context_search.knowledge.revisions import source_revision_for
from context_search.knowledge.types import (
    KnowledgeDocument,
    KnowledgeEvidence,
    KnowledgeHit,
    KnowledgeRequest,
    KnowledgeResult,
    KnowledgeTarget,
)


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

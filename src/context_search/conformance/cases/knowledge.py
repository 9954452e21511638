"""Knowledge-search cases (seed 000) run through any connector: zero hits with complete
evidence, byte offsets in multi-byte text, and the query-scoped access object."""

from __future__ import annotations

import contextlib

from context_search.conformance._registry import ConformanceFailure, case, check
from context_search.conformance.corpus import TEAM, standard_corpus
from context_search.contract import Freshness, SearchConnector
from context_search.errors import ContextSearchError, NotFoundError, UnauthorizedError
from context_search.knowledge import (
    ConnectorKnowledgeRetriever,
    KnowledgeAccess,
    KnowledgeRequest,
    KnowledgeResult,
    KnowledgeTarget,
    retrieve_knowledge,
)

_AURORA = KnowledgeTarget(doc_id="doc-team-aurora", source="wiki")
_CHINESE = KnowledgeTarget(doc_id="doc-team-chinese", source="wiki")
_BASALT = KnowledgeTarget(doc_id="doc-team-basalt", source="git")


def _search(c: SearchConnector, text: str, targets: list[KnowledgeTarget]) -> KnowledgeResult:
    try:
        return retrieve_knowledge(
            _retriever(c),
            KnowledgeRequest(text=text, targets=targets),
            reader=c,
            allowed_scopes=[TEAM],
        )
    except ContextSearchError as exc:
        raise ConformanceFailure(f"knowledge search over fresh targets failed: {exc}") from exc


def _retriever(c: SearchConnector) -> ConnectorKnowledgeRetriever:
    # A similarity floor lets "nothing related" be a true zero hit (the hashing and MiniLM
    # embedders both put unrelated text well below 0.5).
    return ConnectorKnowledgeRetriever(c, allowed_scopes=[TEAM], min_similarity=0.5)


@case("knowledge")
def knowledge_zero_hit_has_complete_evidence(c: SearchConnector) -> None:
    """A true zero hit still lists every target, its sources, mapping and freshness."""
    c.upsert(standard_corpus())
    targets = [_AURORA, _BASALT]
    result = _search(c, "xylophone quetzal", targets)
    ev = result.evidence
    check(result.hits == (), f"unrelated text returned hits: {result.hits}")
    check(
        [d.doc_id for d in ev.documents] == [t.doc_id for t in targets],
        f"zero-hit evidence does not cover every target: {ev.documents}",
    )
    check(
        set(ev.revision_by_source) == {"wiki", "git"},
        f"revision_by_source does not cover exactly the targets' sources: {ev.revision_by_source}",
    )
    check(bool(ev.mapping_revision), "mapping revision not echoed for a covered mapping")
    check(ev.freshness is Freshness.FRESH, f"freshly indexed targets reported {ev.freshness}")
    check(
        ev.indexed_config_revision == ev.source_config_revision,
        "indexed and source config revisions differ right after indexing",
    )


@case("knowledge")
def knowledge_hit_offsets_are_utf8_bytes(c: SearchConnector) -> None:
    """Hits in Chinese text carry UTF-8 byte offsets whose slice is exactly the snippet."""
    c.upsert(standard_corpus())
    result = _search(c, "极光服务 重启", [_CHINESE, _BASALT])
    hits = [h for h in result.hits if h.doc_id == "doc-team-chinese"]
    check(len(hits) == 1, f"the Chinese target was not hit: {result.hits}")
    doc = c.get_document("doc-team-chinese", [TEAM])
    assert doc is not None
    raw = doc.body.encode("utf-8")
    hit = hits[0]
    check(
        raw[hit.start_byte : hit.end_byte].decode("utf-8") == hit.snippet,
        "snippet is not the byte slice of the body",
    )
    check(hit.end_byte > len(hit.snippet), "offsets look like character offsets")


class _Nosy:
    """A retriever that tries to read past its targets and to keep its access object."""

    id = "nosy"

    def __init__(self, inner: ConnectorKnowledgeRetriever, probe: str) -> None:
        self.inner = inner
        self.probe = probe
        self.kept: KnowledgeAccess | None = None
        self.outcomes: dict[str, str] = {}

    def retrieve(
        self, request: KnowledgeRequest, access: KnowledgeAccess, mapping_revision: str
    ) -> KnowledgeResult:
        self.kept = access
        body, _ = access.read(request.targets[0].doc_id)
        self.outcomes["listed"] = "read" if body else "empty"
        try:
            access.read(self.probe)
            self.outcomes["probe"] = "read"
        except ContextSearchError as exc:
            self.outcomes["probe"] = exc.code
        return self.inner.retrieve(request, access, mapping_revision)


@case("knowledge")
def knowledge_access_is_limited_to_targets_and_dies(c: SearchConnector) -> None:
    """The access object reads only listed targets, and nothing once the call returned."""
    c.upsert(standard_corpus())
    for probe in ("doc-team-basalt", "doc-restricted-aurora", "doc-nowhere"):
        nosy = _Nosy(_retriever(c), probe)
        try:
            retrieve_knowledge(
                nosy,
                KnowledgeRequest(text="aurora", targets=[_AURORA]),
                reader=c,
                allowed_scopes=[TEAM],
            )
            raise ConformanceFailure(f"reading unlisted {probe} did not fail the request")
        except UnauthorizedError:
            pass
        check(nosy.outcomes == {"listed": "read", "probe": "UNAUTHORIZED"}, f"{nosy.outcomes}")
        assert nosy.kept is not None
        try:
            nosy.kept.read("doc-team-aurora")
        except UnauthorizedError:
            pass
        else:
            raise ConformanceFailure("the access object still reads after the call returned")
    # A listed target the caller may not see reads exactly like a missing one.
    answers = []
    for hidden in ("doc-restricted-aurora", "doc-nowhere"):
        target = KnowledgeTarget(doc_id=hidden, source="vault")
        seen: list[str] = []

        class _Reader:
            id = "reader"

            def retrieve(
                self,
                request: KnowledgeRequest,
                access: KnowledgeAccess,
                mapping_revision: str,
                seen: list[str] = seen,
                hidden: str = hidden,
            ) -> KnowledgeResult:
                try:
                    access.read(hidden)
                except NotFoundError as exc:
                    seen.append(f"{exc.code}:{exc.message}")
                raise NotFoundError("stop")

        with contextlib.suppress(ContextSearchError):
            retrieve_knowledge(
                _Reader(),
                KnowledgeRequest(text="aurora", targets=[target]),
                reader=c,
                allowed_scopes=[TEAM],
            )
        answers.append(seen)
    check(
        answers[0] == answers[1] and len(answers[0]) == 1,
        f"an out-of-scope target reads differently from a missing one: {answers}",
    )

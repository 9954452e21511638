"""Knowledge search: every check of the core side, then the seed's six cases end to end.

The ``check_*`` scenarios at the bottom take any connector; the PostgreSQL integration test
runs the same ones, so both backends are held to one behaviour. The fake retrievers here
are retrievers (untrusted backends), built by editing an honest answer, not stand-ins for
a database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from context_search import (
    BackendError,
    ContextDocument,
    ContextDocumentRecord,
    Freshness,
    HashingEmbedder,
    IndexStaleError,
    InMemorySearchConnector,
    InvalidQueryError,
    InvalidResultError,
    NotFoundError,
    RetrieverUnconfiguredError,
    RevisionMismatchError,
    SearchConnector,
    SearchQuery,
    SearchResponse,
    UnauthorizedError,
    content_id_for,
)
from context_search.knowledge import (
    MAX_RAW_KNOWLEDGE_TARGETS,
    ConnectorKnowledgeRetriever,
    KnowledgeAccess,
    KnowledgeDocument,
    KnowledgeEvidence,
    KnowledgeHit,
    KnowledgeRequest,
    KnowledgeResult,
    KnowledgeRetriever,
    KnowledgeTarget,
    mapping_revision_for,
    retrieve_knowledge,
    source_revision_for,
    worst_freshness,
)

pytestmark = pytest.mark.unit

SCOPES = ("team",)
#: Vector-only candidates below this are not hits (HashingEmbedder: unrelated text < 0.2).
MIN_SIMILARITY = 0.5

ZH_FILLER = "今天天气很好，我们一起去公园散步。" * 40
ZH_TAIL = "检索结果必须给出准确的字节偏移，而不是字符偏移。"

RESTART = ContextDocumentRecord(
    document_id="kb-restart",
    title="Restarting the payment service",
    body=(
        "To restart the payment service, drain the payment queue first, "
        "then restart the workers one at a time."
    ),
    permission_scope="team",
    source_system="wiki",
    source_uri="https://wiki.example/payments/restart",
    source_revision="wiki-r1",
)
MENU = ContextDocumentRecord(
    document_id="kb-menu",
    title="Cafeteria",
    body="The cafeteria menu changes every Tuesday with seasonal vegetables and soup.",
    permission_scope="team",
    source_system="wiki",
    source_uri="https://wiki.example/cafeteria",
    source_revision="wiki-r1",
)
ZH = ContextDocumentRecord(
    document_id="kb-zh",
    title="字节偏移说明",
    body=ZH_FILLER + ZH_TAIL,
    permission_scope="team",
    source_system="notes",
    source_uri="notes://offsets",
    source_revision="notes-r7",
)
OTHER = ContextDocumentRecord(
    document_id="kb-other",
    title="Gateway",
    body="Restart the payment gateway after a certificate rotation.",
    permission_scope="team",
    source_system="wiki",
    source_revision="wiki-r1",
)
SECRET = ContextDocumentRecord(
    document_id="kb-secret",
    title="Secret",
    body="Restart payment secrets with the break-glass procedure.",
    permission_scope="secret",
    source_system="wiki",
    source_revision="wiki-r1",
)
CORPUS = (RESTART, MENU, ZH, OTHER, SECRET)


def target(doc_id: str, source: str, **fields: Any) -> KnowledgeTarget:
    return KnowledgeTarget(doc_id=doc_id, source=source, **fields)


TARGETS = (target("kb-restart", "wiki"), target("kb-menu", "wiki"), target("kb-zh", "notes"))


def seed(store: SearchConnector) -> None:
    report = store.upsert(CORPUS)
    assert report.inserted == len(CORPUS)


def honest(store: SearchConnector, scopes: Sequence[str] = SCOPES) -> ConnectorKnowledgeRetriever:
    return ConnectorKnowledgeRetriever(store, allowed_scopes=scopes, min_similarity=MIN_SIMILARITY)


def search(
    store: SearchConnector,
    text: str,
    targets: Sequence[KnowledgeTarget] = TARGETS,
    *,
    retriever: KnowledgeRetriever | None = None,
    scopes: Sequence[str] = SCOPES,
    limit: int = 10,
) -> KnowledgeResult:
    return retrieve_knowledge(
        retriever or honest(store, scopes),
        KnowledgeRequest(text=text, targets=targets, limit=limit),
        reader=store,
        allowed_scopes=scopes,
    )


def check_complete_evidence(
    store: SearchConnector,
    result: KnowledgeResult,
    targets: Sequence[KnowledgeTarget],
    records: Sequence[ContextDocumentRecord] = CORPUS,
) -> None:
    """Everything seed 000 asks of the evidence, whether or not anything matched."""
    by_id = {r.document_id: r for r in records}
    evidence = result.evidence
    assert result.knowledge_state == "searched"
    assert result.index_status is Freshness.FRESH
    assert evidence.freshness is Freshness.FRESH
    assert evidence.mapping_revision == mapping_revision_for(targets)
    active = store.search(SearchQuery(query="anything", allowed_scopes=SCOPES)).evidence
    assert evidence.source_config_revision == active.config_revision
    assert evidence.indexed_config_revision == evidence.source_config_revision
    assert [d.doc_id for d in evidence.documents] == [t.doc_id for t in targets]
    for doc, tgt in zip(evidence.documents, targets, strict=True):
        record = by_id[tgt.doc_id]
        assert doc.knowledge_id == tgt.knowledge_id
        assert doc.source == tgt.source == record.source_system
        assert doc.content_id == doc.indexed_content_id == content_id_for(record.body)
        assert doc.indexed_config_revision == evidence.source_config_revision
        assert doc.source_revision == record.source_revision
        assert doc.freshness is Freshness.FRESH
    sources = {t.source for t in targets}
    assert dict(evidence.revision_by_source) == {
        s: source_revision_for(
            (t.doc_id, by_id[t.doc_id].source_revision) for t in targets if t.source == s
        )
        for s in sources
    }
    assert evidence.observed_at.utcoffset() is not None
    assert abs(datetime.now(UTC) - evidence.observed_at) < timedelta(minutes=5)


# -- the six verification cases (shared with the PostgreSQL test) --------------------------


def check_hit(store: SearchConnector) -> None:
    """A hit: byte offsets into the stored body, the exact slice, and complete evidence."""
    seed(store)
    result = search(store, "restart payment service")
    assert [h.doc_id for h in result.hits] == ["kb-restart"]
    (hit,) = result.hits
    body = RESTART.body.encode("utf-8")
    assert 0 <= hit.start_byte < hit.end_byte <= len(body)
    assert hit.snippet == body[hit.start_byte : hit.end_byte].decode("utf-8")
    assert "restart the payment service" in hit.snippet
    assert hit.knowledge_id == "kb-restart"
    assert (hit.title, hit.source_system, hit.source_uri) == (
        RESTART.title,
        "wiki",
        RESTART.source_uri,
    )
    assert hit.score > 0
    check_complete_evidence(store, result, TARGETS)


def check_true_zero_hit(store: SearchConnector) -> None:
    """Nothing matches: no hits, yet the evidence proves every target was searched fresh."""
    seed(store)
    result = search(store, "quantum entanglement photons")
    assert result.hits == ()
    check_complete_evidence(store, result, TARGETS)


def check_old_mapping(store: SearchConnector) -> None:
    """A mapping made from another source, older content or a superseded document."""
    seed(store)
    moved = (target("kb-restart", "confluence"), target("kb-menu", "wiki"))
    with pytest.raises(IndexStaleError) as info:
        search(store, "restart payment service", moved)
    assert info.value.details == {
        "reason": "mapping_not_covered",
        "mapping_revision": mapping_revision_for(moved),
        "targets": {"kb-restart": "source_mismatch"},
    }

    pinned = (target("kb-restart", "wiki", expected_content_id=content_id_for(RESTART.body)),)
    assert search(store, "restart payment service", pinned).hits
    # The content changes and is indexed at once: the index is fresh, the mapping is old.
    store.upsert([replace(RESTART, body=RESTART.body + " Then check the ledger.")])
    with pytest.raises(IndexStaleError) as info:
        search(store, "restart payment service", pinned)
    assert info.value.details["targets"] == {"kb-restart": "content_mismatch"}

    assert store.delete_or_supersede("kb-menu", superseded_by="kb-other")
    with pytest.raises(IndexStaleError) as info:
        search(store, "cafeteria menu", (target("kb-menu", "wiki"),))
    assert info.value.details["targets"] == {"kb-menu": "superseded"}


def check_body_updated(store: SearchConnector) -> None:
    """The body changed after indexing: stale until reindexed, then the new text is cited."""
    seed(store)
    only = (target("kb-restart", "wiki"),)
    before = search(store, "restart payment service", only)
    assert before.hits
    new = replace(
        RESTART,
        body="To roll back the payment service, redeploy the previous release and drain it.",
        source_revision="wiki-r2",
    )
    store.upsert([new], defer_indexing=True)
    with pytest.raises(IndexStaleError) as info:
        search(store, "roll back payment service", only)
    assert info.value.details["reason"] == "not_fresh"
    assert info.value.details["documents"] == {"kb-restart": "pending"}
    # Neither a zero hit nor the old text: the query for the *old* words is refused too.
    with pytest.raises(IndexStaleError):
        search(store, "restart payment service", only)

    report = store.reindex()
    assert report.remaining == 0
    after = search(store, "roll back payment service", only)
    (hit,) = after.hits
    body = new.body.encode("utf-8")
    assert hit.snippet == body[hit.start_byte : hit.end_byte].decode("utf-8")
    assert "roll back" in hit.snippet
    check_complete_evidence(store, after, only, records=[new])
    assert after.evidence.revision_by_source != before.evidence.revision_by_source


def check_chinese_offsets(store: SearchConnector) -> None:
    """A hit deep inside a Chinese body: offsets count UTF-8 bytes, not characters."""
    seed(store)
    only = (target("kb-zh", "notes"),)
    result = search(store, "字节偏移", only)
    (hit,) = result.hits
    raw = ZH.body.encode("utf-8")
    assert hit.start_byte > 0
    assert hit.snippet == raw[hit.start_byte : hit.end_byte].decode("utf-8")
    assert "字节偏移" in hit.snippet
    assert len(hit.snippet.encode("utf-8")) == hit.end_byte - hit.start_byte
    assert len(hit.snippet) < hit.end_byte - hit.start_byte
    # Read as character offsets the same numbers would cite other text.
    assert ZH.body[hit.start_byte : hit.end_byte] != hit.snippet
    assert hit.title == "字节偏移说明"
    check_complete_evidence(store, result, only)


class _Snooper:
    """Tries names outside the request, keeps the access, then answers honestly."""

    id = "snooper"

    def __init__(self, inner: KnowledgeRetriever, names: Sequence[str]) -> None:
        self.inner = inner
        self.names = names
        self.errors: dict[str, dict[str, Any]] = {}
        self.kept: KnowledgeAccess | None = None

    def retrieve(
        self, request: KnowledgeRequest, access: KnowledgeAccess, mapping_revision: str
    ) -> KnowledgeResult:
        self.kept = access
        for name in self.names:
            try:
                access.read(name)
            except (UnauthorizedError, NotFoundError) as exc:
                self.errors[name] = exc.to_dict()
        return self.inner.retrieve(request, access, mapping_revision)


def check_unselected_read(store: SearchConnector) -> None:
    """Unselected knowledge cannot be read, probed, or read later through a kept access."""
    seed(store)
    # kb-other exists in the caller's scope, kb-never does not, kb-secret is out of scope.
    snooper = _Snooper(honest(store), ["kb-other", "kb-never", "kb-secret"])
    with pytest.raises(UnauthorizedError) as denied:
        search(store, "restart payment service", retriever=snooper)
    assert denied.value.details["reason"] == "not_a_target"
    assert denied.value.details["attempts"] == 3
    answers = list(snooper.errors.values())
    assert len(answers) == 3
    assert all(a == answers[0] for a in answers)
    assert answers[0]["code"] == "UNAUTHORIZED"
    assert snooper.kept is not None
    assert snooper.kept.closed
    with pytest.raises(UnauthorizedError) as expired:
        snooper.kept.read("kb-restart")  # a target, but the call is over
    assert expired.value.details == {"reason": "expired"}

    # A listed target outside the caller's scopes reads exactly like a missing one...
    listed = (target("kb-restart", "wiki"), target("kb-secret", "wiki"), target("kb-ghost", "wiki"))
    reader = _Snooper(honest(store), ["kb-secret", "kb-ghost"])
    with pytest.raises(IndexStaleError) as stale:
        search(store, "restart payment service", listed, retriever=reader)
    assert reader.errors["kb-secret"] == reader.errors["kb-ghost"]
    assert reader.errors["kb-ghost"]["code"] == "NOT_FOUND"
    assert stale.value.details["targets"] == {"kb-ghost": "unavailable", "kb-secret": "unavailable"}

    # ...and the answer is the same once it really is gone, even to a retriever that
    # (misconfigured) reads with wider scopes than the caller's.
    secret_only = (target("kb-secret", "wiki"),)
    wide = honest(store, ["team", "secret"])
    answers_before = []
    for retriever in (honest(store), wide):
        with pytest.raises(IndexStaleError) as stale:
            search(store, "restart payment secrets", secret_only, retriever=retriever)
        answers_before.append(stale.value.to_dict())
    assert store.delete_or_supersede("kb-secret")
    for retriever in (honest(store), wide):
        with pytest.raises(IndexStaleError) as stale:
            search(store, "restart payment secrets", secret_only, retriever=retriever)
        assert stale.value.to_dict() == answers_before[0]
    assert answers_before[1] == answers_before[0]


# -- the six cases on the reference connector ---------------------------------------------


@pytest.fixture
def store() -> InMemorySearchConnector:
    return InMemorySearchConnector(embedder=HashingEmbedder())


def test_memory_hit(store: InMemorySearchConnector) -> None:
    check_hit(store)


def test_memory_true_zero_hit(store: InMemorySearchConnector) -> None:
    check_true_zero_hit(store)


def test_memory_old_mapping(store: InMemorySearchConnector) -> None:
    check_old_mapping(store)


def test_memory_body_updated(store: InMemorySearchConnector) -> None:
    check_body_updated(store)


def test_memory_chinese_offsets(store: InMemorySearchConnector) -> None:
    check_chinese_offsets(store)


def test_memory_unselected_read(store: InMemorySearchConnector) -> None:
    check_unselected_read(store)


# -- hand-written retrievers and a counting store -----------------------------------------


class CountingStore:
    """The reference connector, counting every read a retriever or Core makes."""

    def __init__(self, inner: InMemorySearchConnector) -> None:
        self.inner = inner
        self.searches = 0
        self.reads = 0
        self.fail_reads: BaseException | None = None

    def search(self, query: SearchQuery) -> SearchResponse:
        self.searches += 1
        return self.inner.search(query)

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        self.reads += 1
        if self.fail_reads is not None:
            raise self.fail_reads
        return self.inner.get_document(doc_id, allowed_scopes)


Edit = Callable[[KnowledgeResult], KnowledgeResult]


class Tampering:
    """Runs an honest retriever, then edits its answer (or fails, or returns junk)."""

    def __init__(
        self,
        inner: KnowledgeRetriever | None = None,
        edit: Edit | None = None,
        *,
        raises: BaseException | None = None,
        returns: Any = None,
    ) -> None:
        self.id = "tampering"
        self.inner = inner
        self.edit = edit
        self.raises = raises
        self.returns = returns
        self.calls = 0
        self.requests: list[tuple[KnowledgeRequest, str]] = []
        self.kept: KnowledgeAccess | None = None

    def retrieve(
        self, request: KnowledgeRequest, access: KnowledgeAccess, mapping_revision: str
    ) -> KnowledgeResult:
        self.calls += 1
        self.kept = access
        self.requests.append((request, mapping_revision))
        if self.raises is not None:
            raise self.raises
        if self.returns is not None:
            returned: KnowledgeResult = self.returns
            return returned
        assert self.inner is not None
        result = self.inner.retrieve(request, access, mapping_revision)
        return self.edit(result) if self.edit else result


@pytest.fixture
def counted() -> CountingStore:
    inner = InMemorySearchConnector(embedder=HashingEmbedder())
    seed(inner)
    return CountingStore(inner)


def run(
    counted: CountingStore,
    retriever: KnowledgeRetriever | None,
    text: str = "restart payment service",
    targets: Sequence[KnowledgeTarget] = TARGETS,
    **request: Any,
) -> KnowledgeResult:
    return retrieve_knowledge(
        retriever,
        KnowledgeRequest(text=text, targets=targets, **request),
        reader=counted,
        allowed_scopes=SCOPES,
    )


def tampered(counted: CountingStore, edit: Edit) -> Tampering:
    return Tampering(
        ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES, min_similarity=MIN_SIMILARITY),
        edit,
    )


def with_evidence(result: KnowledgeResult, **changes: Any) -> KnowledgeResult:
    return replace(result, evidence=replace(result.evidence, **changes))


def with_hit(result: KnowledgeResult, index: int = 0, **changes: Any) -> KnowledgeResult:
    hits = list(result.hits)
    hits[index] = replace(hits[index], **changes)
    return replace(result, hits=tuple(hits))


def with_document(result: KnowledgeResult, doc_id: str, **changes: Any) -> KnowledgeResult:
    docs = tuple(
        replace(d, **changes) if d.doc_id == doc_id else d for d in result.evidence.documents
    )
    return with_evidence(result, documents=docs)


# -- configuration, request and budgets ---------------------------------------------------


def test_unconfigured_retriever_is_an_error_not_an_empty_result(counted: CountingStore) -> None:
    with pytest.raises(RetrieverUnconfiguredError) as info:
        run(counted, None)
    assert info.value.code == "RETRIEVER_UNCONFIGURED"
    assert counted.reads == counted.searches == 0


def _many(n: int, prefix: str = "d") -> list[KnowledgeTarget]:
    return [target(f"{prefix}{i}", "wiki") for i in range(n)]


@pytest.mark.parametrize(
    ("targets", "request_fields", "budget"),
    [
        ([target("a", "s")] * (MAX_RAW_KNOWLEDGE_TARGETS + 1), {}, "raw_count"),
        ([target("a" * 60, "s"), target("b" * 60, "s")], {"max_target_bytes": 200}, "raw_bytes"),
        (_many(3), {"max_targets": 2}, "count"),
        ([target("a", "s")], {"max_target_bytes": 50}, "bytes"),
    ],
    ids=["raw_count", "raw_bytes", "count", "bytes"],
)
def test_budgets_are_checked_before_any_backend_work(
    counted: CountingStore,
    targets: list[KnowledgeTarget],
    request_fields: dict[str, Any],
    budget: str,
) -> None:
    retriever = tampered(counted, lambda r: r)
    with pytest.raises(InvalidQueryError) as info:
        run(counted, retriever, targets=targets, **request_fields)
    assert info.value.details["field"] == "targets"
    assert info.value.details["budget"] == budget
    assert info.value.details["actual"] > info.value.details["limit"]
    assert retriever.calls == 0
    assert counted.reads == counted.searches == 0


def test_duplicates_within_budget_collapse_and_reach_the_backend_once(
    counted: CountingStore,
) -> None:
    retriever = tampered(counted, lambda r: r)
    raw = [TARGETS[1], TARGETS[0], TARGETS[1], TARGETS[2], TARGETS[0]]
    result = run(counted, retriever, targets=raw, max_targets=3)
    ((request, mapping_revision),) = retriever.requests
    assert tuple(request.targets) == (TARGETS[1], TARGETS[0], TARGETS[2])
    assert mapping_revision == mapping_revision_for(TARGETS)
    assert result.evidence.mapping_revision == mapping_revision
    assert [d.doc_id for d in result.evidence.documents] == ["kb-menu", "kb-restart", "kb-zh"]


@pytest.mark.parametrize(
    "fields",
    [
        {"text": ""},
        {"text": "   "},
        {"text": "nul\x00byte"},
        {"text": 42},
        {"limit": 0},
        {"limit": 201},
        {"limit": True},
        {"max_targets": 0},
        {"max_targets": 1001},
        {"max_target_bytes": 0},
        {"max_target_bytes": 16 * 1024 * 1024 + 1},
        {"targets": "kb-restart"},
        {"targets": []},
        {"targets": ["kb-restart"]},
        {"targets": [target("", "wiki")]},
        {"targets": [target("kb-restart", "")]},
        {"targets": [target("kb-restart", "wiki", expected_content_id="")]},
        {"targets": [target("kb-restart", "wiki", source_revision="")]},
        {"targets": [target("kb-restart", "wiki", source_revision="r\x00")]},
        {"targets": [target("x" * 513, "wiki")]},
        {"targets": [target("kb-restart", 7)]},  # type: ignore[arg-type]
        # the same document declared twice in two ways is ambiguous
        {"targets": [target("kb-restart", "wiki"), target("kb-restart", "confluence")]},
        # one read name would resolve to two documents
        {
            "targets": [
                target("kb-restart", "wiki"),
                target("kb-menu", "wiki", knowledge_id="kb-restart"),
            ]
        },
    ],
    ids=repr,
)
def test_invalid_request_is_rejected_before_the_backend(
    counted: CountingStore, fields: dict[str, Any]
) -> None:
    retriever = tampered(counted, lambda r: r)
    args: dict[str, Any] = {"text": "restart", "targets": TARGETS, **fields}
    with pytest.raises(InvalidQueryError):
        retrieve_knowledge(
            retriever, KnowledgeRequest(**args), reader=counted, allowed_scopes=SCOPES
        )
    assert retriever.calls == 0
    assert counted.reads == counted.searches == 0


def test_target_errors_have_stable_details() -> None:
    with pytest.raises(InvalidQueryError) as info:
        mapping_revision_for([TARGETS[0], target("kb-menu", "")])
    assert info.value.details == {"field": "targets", "index": 1, "part": "source"}
    with pytest.raises(InvalidQueryError) as info:
        mapping_revision_for([TARGETS[0], target("kb-restart", "notes")])
    assert info.value.details == {
        "field": "targets",
        "index": 1,
        "reason": "conflicting_duplicate",
    }


def test_mapping_revision_is_canonical() -> None:
    base = mapping_revision_for(TARGETS)
    assert base.startswith("map:")
    assert mapping_revision_for(list(reversed(TARGETS))) == base
    assert mapping_revision_for([*TARGETS, TARGETS[0]]) == base
    assert mapping_revision_for([target("kb-restart", "wiki", knowledge_id="kb-restart")]) == (
        mapping_revision_for([target("kb-restart", "wiki")])
    )
    variants = [
        replace(TARGETS[0], source="confluence"),
        replace(TARGETS[0], knowledge_id="restart-guide"),
        replace(TARGETS[0], expected_content_id="sha256:x"),
        replace(TARGETS[0], source_revision="wiki-r1"),
    ]
    revisions = {mapping_revision_for([v, *TARGETS[1:]]) for v in variants}
    assert len(revisions) == len(variants)
    assert base not in revisions
    assert mapping_revision_for(TARGETS[:2]) != base


def test_source_revision_and_freshness_helpers() -> None:
    a = source_revision_for([("x", "1"), ("y", "2")])
    assert a == source_revision_for([("y", "2"), ("x", "1")])
    assert a != source_revision_for([("x", "1"), ("y", "3")])
    assert a != source_revision_for([("x", "1"), ("y", None)])
    assert worst_freshness([]) is Freshness.FRESH
    assert worst_freshness([Freshness.FRESH, Freshness.PENDING]) is Freshness.PENDING
    assert worst_freshness([Freshness.FAILED, Freshness.STALE_CONTENT]) is Freshness.FAILED


def test_knowledge_id_defaults_to_doc_id_and_is_readable(counted: CountingStore) -> None:
    assert target("kb-zh", "notes").knowledge_id == "kb-zh"
    named = (target("kb-restart", "wiki", knowledge_id="payments/restart"),)
    seen: list[tuple[bytes, str]] = []

    def read_by_name(result: KnowledgeResult) -> KnowledgeResult:
        assert tamper.kept is not None
        seen.append(tamper.kept.read("payments/restart"))
        return result

    tamper = tampered(counted, read_by_name)
    result = run(counted, tamper, targets=named)
    assert seen == [(RESTART.body.encode("utf-8"), content_id_for(RESTART.body))]
    assert result.hits[0].knowledge_id == "payments/restart"
    assert result.evidence.documents[0].knowledge_id == "payments/restart"


# -- backend failures ---------------------------------------------------------------------


def test_backend_exception_becomes_backend_error_and_access_dies(counted: CountingStore) -> None:
    cause = RuntimeError("connection to db-7 lost while reading kb-secret")
    retriever = Tampering(raises=cause)
    with pytest.raises(BackendError) as info:
        run(counted, retriever)
    assert info.value.__cause__ is cause
    assert info.value.details == {"retriever": "tampering", "cause": "RuntimeError"}
    assert "kb-secret" not in str(info.value)
    assert retriever.kept is not None
    with pytest.raises(UnauthorizedError) as expired:
        retriever.kept.read("kb-restart")
    assert expired.value.details == {"reason": "expired"}


def test_context_search_error_from_backend_propagates_unchanged(counted: CountingStore) -> None:
    error = IndexStaleError("index rebuilding")
    with pytest.raises(IndexStaleError) as info:
        run(counted, Tampering(raises=error))
    assert info.value is error


def test_failing_core_read_is_a_backend_error(counted: CountingStore) -> None:
    def break_reads(result: KnowledgeResult) -> KnowledgeResult:
        counted.fail_reads = OSError("disk")
        return result

    with pytest.raises(BackendError) as info:
        run(counted, tampered(counted, break_reads))
    assert info.value.details["cause"] == "OSError"


@pytest.mark.parametrize("junk", [[None], "ok", {"hits": []}], ids=repr)
def test_a_result_of_the_wrong_type_is_invalid(counted: CountingStore, junk: object) -> None:
    with pytest.raises(InvalidResultError):
        run(counted, Tampering(returns=junk))


def test_swallowed_unauthorized_read_still_fails_the_request(counted: CountingStore) -> None:
    def peek(result: KnowledgeResult) -> KnowledgeResult:
        assert tamper.kept is not None
        with pytest.raises(UnauthorizedError):
            tamper.kept.read("kb-other")
        return result

    tamper = tampered(counted, peek)
    with pytest.raises(UnauthorizedError) as info:
        run(counted, tamper)
    assert info.value.details["attempts"] == 1


# -- evidence -----------------------------------------------------------------------------


def test_extra_provider_in_revision_by_source_is_rejected(counted: CountingStore) -> None:
    def add_provider(result: KnowledgeResult) -> KnowledgeResult:
        revisions = {**result.evidence.revision_by_source, "hr-system": "src:whatever"}
        return with_evidence(result, revision_by_source=revisions)

    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, add_provider))
    assert info.value.details["reason"] == "revision_by_source_keys"
    assert info.value.details["extra"] == 1
    assert "hr-system" not in str(info.value.to_dict())


def test_missing_provider_in_revision_by_source_is_rejected(counted: CountingStore) -> None:
    def drop_notes(result: KnowledgeResult) -> KnowledgeResult:
        revisions = {k: v for k, v in result.evidence.revision_by_source.items() if k != "notes"}
        return with_evidence(result, revision_by_source=revisions)

    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, drop_notes))
    assert info.value.details["missing"] == ["notes"]


def test_forged_source_revision_value_is_rejected(counted: CountingStore) -> None:
    def forge(result: KnowledgeResult) -> KnowledgeResult:
        return with_evidence(
            result, revision_by_source={**result.evidence.revision_by_source, "wiki": "src:new"}
        )

    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, forge))
    assert info.value.details["sources"] == ["wiki"]


def test_mapping_echo_mismatch_is_stale(counted: CountingStore) -> None:
    old = mapping_revision_for(TARGETS[:2])
    with pytest.raises(IndexStaleError) as info:
        run(counted, tampered(counted, lambda r: with_evidence(r, mapping_revision=old)))
    assert info.value.details == {
        "reason": "mapping_not_covered",
        "mapping_revision": mapping_revision_for(TARGETS),
        "targets": {},
    }


def test_documents_must_cover_every_target(counted: CountingStore) -> None:
    def drop_zero_hit_target(result: KnowledgeResult) -> KnowledgeResult:
        docs = tuple(d for d in result.evidence.documents if d.doc_id != "kb-menu")
        return with_evidence(result, documents=docs)

    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, drop_zero_hit_target))
    assert info.value.details["missing"] == ["kb-menu"]


def test_document_outside_the_targets_is_rejected_without_naming_it(
    counted: CountingStore,
) -> None:
    def add_secret(result: KnowledgeResult) -> KnowledgeResult:
        extra = replace(result.evidence.documents[0], doc_id="kb-secret", knowledge_id="x")
        return with_evidence(result, documents=(*result.evidence.documents, extra))

    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, add_secret))
    assert "kb-secret" not in str(info.value.to_dict())


def test_a_fresh_label_is_not_trusted(counted: CountingStore) -> None:
    def lie(result: KnowledgeResult) -> KnowledgeResult:
        return with_document(result, "kb-menu", indexed_content_id="sha256:older")

    with pytest.raises(IndexStaleError) as info:
        run(counted, tampered(counted, lie))
    assert info.value.details["documents"] == {"kb-menu": "stale_content"}


def test_other_config_revision_is_stale(counted: CountingStore) -> None:
    def new_config(result: KnowledgeResult) -> KnowledgeResult:
        return with_evidence(result, source_config_revision="cfg:next")

    with pytest.raises(IndexStaleError) as info:
        run(counted, tampered(counted, new_config))
    every = sorted(t.doc_id for t in TARGETS)
    assert info.value.details["documents"] == dict.fromkeys(every, "stale_config")


def test_evidence_that_disagrees_with_the_source_is_stale(counted: CountingStore) -> None:
    def old_revision(result: KnowledgeResult) -> KnowledgeResult:
        return with_document(result, "kb-zh", source_revision="notes-r6")

    with pytest.raises(IndexStaleError) as info:
        run(counted, tampered(counted, old_revision))
    assert info.value.details["documents"] == {"kb-zh": "changed"}


def test_overall_staleness_is_not_ignored(counted: CountingStore) -> None:
    def stale(result: KnowledgeResult) -> KnowledgeResult:
        return with_evidence(result, freshness=Freshness.PENDING)

    with pytest.raises(IndexStaleError) as info:
        run(counted, tampered(counted, stale))
    assert info.value.details["freshness"] == "pending"


def test_stale_zero_hit_is_not_a_zero_hit(counted: CountingStore) -> None:
    def stale_empty(result: KnowledgeResult) -> KnowledgeResult:
        stale = with_document(result, "kb-restart", freshness=Freshness.FAILED)
        return replace(stale, hits=())

    with pytest.raises(IndexStaleError) as info:
        run(counted, tampered(counted, stale_empty))
    assert info.value.details["documents"] == {"kb-restart": "failed"}


def test_naive_observation_time_is_invalid(counted: CountingStore) -> None:
    def naive(result: KnowledgeResult) -> KnowledgeResult:
        return with_evidence(result, observed_at=datetime(2024, 1, 1))

    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, naive))
    assert info.value.details["reason"] == "observed_at"


def test_pinned_revision_not_readable(counted: CountingStore) -> None:
    good = (target("kb-restart", "wiki", source_revision="wiki-r1"),)
    assert run(counted, tampered(counted, lambda r: r), targets=good).hits
    bad = (target("kb-restart", "wiki", source_revision="wiki-r0"),)
    with pytest.raises(RevisionMismatchError):  # from the connector, passed through
        run(counted, tampered(counted, lambda r: r), targets=bad)

    class IgnoresPins:
        """Searches as if nothing were pinned: Core must still notice."""

        id = "ignores-pins"

        def retrieve(
            self, request: KnowledgeRequest, access: KnowledgeAccess, mapping_revision: str
        ) -> KnowledgeResult:
            unpinned = replace(
                request, targets=tuple(replace(t, source_revision=None) for t in request.targets)
            )
            inner = ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES)
            # The unpinned mapping has another revision; echo the real one as if covered.
            answer = inner.retrieve(unpinned, access, mapping_revision)
            return with_evidence(answer, mapping_revision=mapping_revision)

    with pytest.raises(RevisionMismatchError) as info:
        run(counted, IgnoresPins(), targets=bad)
    assert info.value.details == {"doc_id": "kb-restart", "pinned": "wiki-r0"}


def test_indexed_config_and_index_status_must_agree(counted: CountingStore) -> None:
    with pytest.raises(InvalidResultError):
        run(counted, tampered(counted, lambda r: with_evidence(r, indexed_config_revision=None)))
    with pytest.raises(InvalidResultError):
        run(counted, tampered(counted, lambda r: replace(r, index_status=Freshness.PENDING)))


# -- hits ---------------------------------------------------------------------------------


def test_hit_outside_the_targets_is_rejected_without_naming_it(counted: CountingStore) -> None:
    with pytest.raises(InvalidResultError) as info:
        run(counted, tampered(counted, lambda r: with_hit(r, doc_id="kb-secret")))
    assert info.value.details == {"retriever": "tampering", "rank": 1}
    assert "kb-secret" not in str(info.value)


def test_snippet_must_be_the_byte_slice(counted: CountingStore) -> None:
    def paraphrase(result: KnowledgeResult) -> KnowledgeResult:
        return with_hit(result, snippet=result.hits[0].snippet.upper())

    with pytest.raises(InvalidResultError, match="snippet"):
        run(counted, tampered(counted, paraphrase))


def test_offsets_may_not_split_a_multibyte_character(counted: CountingStore) -> None:
    raw = ZH.body.encode("utf-8")

    def split(result: KnowledgeResult) -> KnowledgeResult:
        hit = result.hits[0]
        start = hit.start_byte + 1
        # The snippet is made to agree as far as it can, so only the boundary is wrong.
        snippet = raw[start : hit.end_byte].decode("utf-8", errors="ignore")
        return with_hit(result, start_byte=start, snippet=snippet)

    only = (target("kb-zh", "notes"),)
    assert run(counted, tampered(counted, lambda r: r), text="字节偏移", targets=only).hits
    with pytest.raises(InvalidResultError, match="split"):
        run(counted, tampered(counted, split), text="字节偏移", targets=only)


@pytest.mark.parametrize(
    "changes",
    [
        {"start_byte": -1},
        {"end_byte": len(RESTART.body.encode()) + 1},
        {"start_byte": 10, "end_byte": 5},
        {"start_byte": 1.0},
        {"chunk_ordinal": -1},
        {"score": float("nan")},
        {"score": True},
        {"knowledge_id": "kb-menu"},
    ],
    ids=repr,
)
def test_malformed_hits_are_rejected(counted: CountingStore, changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidResultError):
        run(counted, tampered(counted, lambda r: with_hit(r, **changes)))


def test_too_many_or_repeated_hits_are_rejected(counted: CountingStore) -> None:
    with pytest.raises(InvalidResultError, match="repeats"):
        run(counted, tampered(counted, lambda r: replace(r, hits=(*r.hits, r.hits[0]))))
    with pytest.raises(InvalidResultError, match="more than 1"):
        run(counted, tampered(counted, lambda r: replace(r, hits=(*r.hits, r.hits[0]))), limit=1)


def test_routing_fields_come_from_the_document_not_the_backend(counted: CountingStore) -> None:
    def forge(result: KnowledgeResult) -> KnowledgeResult:
        return with_hit(
            result, title="Click me", source_system="evil", source_uri="https://evil.example"
        )

    (hit,) = run(counted, tampered(counted, forge)).hits
    assert (hit.title, hit.source_system, hit.source_uri) == (
        RESTART.title,
        "wiki",
        RESTART.source_uri,
    )


def test_backend_order_and_limit_are_kept(counted: CountingStore) -> None:
    result = run(counted, tampered(counted, lambda r: r), text="restart payment", limit=1)
    assert len(result.hits) == 1
    wider = (*TARGETS, target("kb-other", "wiki"))
    both = run(counted, tampered(counted, lambda r: r), text="restart payment", targets=wider)
    assert {h.doc_id for h in both.hits} == {"kb-restart", "kb-other"}
    assert [h.score for h in both.hits] == sorted((h.score for h in both.hits), reverse=True)


# -- the connector retriever itself -------------------------------------------------------


def test_connector_retriever_validates_its_configuration(counted: CountingStore) -> None:
    with pytest.raises(InvalidQueryError):
        ConnectorKnowledgeRetriever(counted, allowed_scopes=[])
    with pytest.raises(InvalidQueryError):
        ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES, min_similarity=2.0)
    with pytest.raises(InvalidQueryError):
        ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES, id="")
    assert isinstance(
        ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES), KnowledgeRetriever
    )


def test_connector_retriever_uses_one_search(counted: CountingStore) -> None:
    run(counted, tampered(counted, lambda r: r))
    assert counted.searches == 1


def test_connector_retriever_without_threshold_ranks_every_target(counted: CountingStore) -> None:
    """Documented behaviour: with no similarity floor, the vector arm makes everything a hit."""
    plain = Tampering(ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES))
    result = run(counted, plain, text="quantum entanglement photons")
    assert {h.doc_id for h in result.hits} == {t.doc_id for t in TARGETS}


def test_connector_retriever_reports_uncovered_targets_without_hits(
    counted: CountingStore,
) -> None:
    """Verification comes first: no hits go back alongside evidence that fails it."""
    access = KnowledgeAccess(counted, TARGETS, SCOPES)
    moved = (replace(TARGETS[0], source="confluence"), *TARGETS[1:])
    retriever = ConnectorKnowledgeRetriever(counted, allowed_scopes=SCOPES)
    raw = retriever.retrieve(
        KnowledgeRequest(text="restart payment service", targets=moved),
        access,
        mapping_revision_for(moved),
    )
    assert raw.hits == ()
    assert raw.evidence.mapping_revision == ""
    assert [d.source for d in raw.evidence.documents] == ["wiki", "wiki", "notes"]


def test_access_reads_only_targets_and_dies_on_close(counted: CountingStore) -> None:
    access = KnowledgeAccess(counted, TARGETS, SCOPES)
    body, cid = access.read("kb-zh")
    assert body == ZH.body.encode("utf-8")
    assert cid == content_id_for(ZH.body)
    denied = []
    for name in ("kb-other", "kb-secret", "nope", 7):
        with pytest.raises(UnauthorizedError) as info:
            access.read(name)  # type: ignore[arg-type]
        denied.append(info.value.to_dict())
    assert all(d == denied[0] for d in denied)
    assert access.denied_reads == 4
    access.close()
    assert access.closed
    with pytest.raises(UnauthorizedError) as info:
        access.read("kb-zh")
    assert info.value.details == {"reason": "expired"}


def test_result_types_are_frozen() -> None:
    hit = KnowledgeHit(
        doc_id="a", knowledge_id="a", chunk_ordinal=0, start_byte=0, end_byte=0, snippet="", score=0
    )
    with pytest.raises(AttributeError):
        hit.snippet = "x"  # type: ignore[misc]
    doc = KnowledgeDocument(
        doc_id="a",
        knowledge_id="a",
        source="s",
        content_id="c",
        indexed_content_id="c",
        indexed_config_revision="cfg",
        source_revision="",
        freshness=Freshness.FRESH,
    )
    evidence = KnowledgeEvidence(
        revision_by_source={},
        mapping_revision="",
        source_config_revision="cfg",
        indexed_config_revision="cfg",
        documents=(doc,),
        observed_at=datetime.now(UTC),
        freshness=Freshness.FRESH,
    )
    assert KnowledgeResult(hits=(hit,), evidence=evidence, index_status=Freshness.FRESH)

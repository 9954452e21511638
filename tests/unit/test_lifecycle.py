"""The seed-003 retrieval lifecycle: order, dedupe, quota, authorisation, effects, key.

Every rule has its own test built so that it fails if the order or the rule changes:
ports append their name to a list, and the state is inspected from inside the ports.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from context_search import (
    BackendError,
    ContextSearchError,
    DuplicateQueryError,
    IndexStaleError,
    InvalidQueryError,
    InvalidResultError,
    QuotaExceededError,
    UnauthorizedError,
)
from context_search.errors import error_class_for
from context_search.lifecycle import (
    Retrieval,
    RetrievalEffect,
    RetrievalEffectError,
    RetrievalReceipt,
    RetrievalState,
    SourcedResult,
    define_retrieval,
    request_source_id,
    retrieval_query_key,
)

pytestmark = pytest.mark.unit

# -- a tiny corpus and a real execute -----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Doc:
    source_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    sources: tuple[Doc, ...]
    scanned: int


DOCS = (
    Doc(source_id="manual", text="Agent Core 使用指南"),
    Doc(source_id="faq", text="Agent FAQ"),
    Doc(source_id="billing", text="Billing rules"),
)


def search(query: str, _ctx: Ctx) -> Found:
    needle = query.casefold()
    return Found(sources=tuple(d for d in DOCS if needle in d.text.casefold()), scanned=len(DOCS))


@dataclass(slots=True, kw_only=True)
class Ctx:
    """The application's request context: its state plus whatever the ports look at."""

    state: RetrievalState = field(default_factory=RetrievalState)
    can_read: bool = True
    quota: int | None = None


def state_of(ctx: Ctx) -> RetrievalState:
    return ctx.state


def quota_of(ctx: Ctx) -> int | None:
    return ctx.quota


def simple(execute: Any = search, **overrides: Any) -> Retrieval[str, Ctx, Doc]:
    """``manual-search`` over ``DOCS`` with the request's state and quota; ports replaceable."""
    options: dict[str, Any] = {"state": state_of, "limit": quota_of}
    options.update(overrides)
    return define_retrieval("manual-search", "reads the local manual", execute, **options)


# -- a retrieval whose every port records itself ------------------------------------------


class Recorder:
    """Builds a retrieval with all ports, each appending its name (and what it saw)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.saw: dict[str, Any] = {}
        self.fail_execute = False
        self.reject_result = False

    def retrieval(self, *effects: RetrievalEffect[str, Ctx, Doc]) -> Retrieval[str, Ctx, Doc]:
        def prepare(query: str, _ctx: Ctx) -> str:
            self.calls.append("prepare")
            return query.strip()

        def assert_input(query: str, _ctx: Ctx) -> None:
            self.calls.append("assert_input")
            self.saw["assert_input"] = query
            if not query:
                raise ValueError("查询为空")

        def key(query: str, _ctx: Ctx) -> str:
            self.calls.append("key")
            self.saw["key"] = query
            return retrieval_query_key(query)

        def state(ctx: Ctx) -> RetrievalState:
            self.calls.append("state")
            return ctx.state

        def limit(ctx: Ctx) -> int | None:
            self.calls.append("limit")
            return ctx.quota

        def authorize(query: str, ctx: Ctx) -> bool:
            self.calls.append("authorize")
            self.saw["authorize"] = query
            self.saw["seen_at_authorize"] = ctx.state.seen
            return ctx.can_read

        def execute(query: str, ctx: Ctx) -> Found:
            self.calls.append("execute")
            self.saw["execute"] = query
            self.saw["seen_at_execute"] = ctx.state.seen
            self.saw["count_at_execute"] = ctx.state.query_count
            self.saw["pending_at_execute"] = ctx.state.pending
            if self.fail_execute:
                raise RuntimeError("backend down")
            return search(query, ctx)

        def assert_result(raw: SourcedResult[Doc], ctx: Ctx) -> bool:
            self.calls.append("assert_result")
            self.saw["count_at_assert_result"] = ctx.state.query_count
            return not self.reject_result

        return define_retrieval(
            "manual-search",
            "reads the local manual",
            execute,
            prepare=prepare,
            assert_input=assert_input,
            key=key,
            state=state,
            limit=limit,
            authorize=authorize,
            assert_result=assert_result,
            effects=effects,
        )

    def effect(self, name: str, *, fails: bool = False) -> RetrievalEffect[str, Ctx, Doc]:
        def handle(receipt: RetrievalReceipt[str, Doc], ctx: Ctx) -> None:
            self.calls.append(f"effect:{name}")
            self.saw[f"count_at_{name}"] = ctx.state.query_count
            self.saw[f"sources_at_{name}"] = len(ctx.state.sources)
            if fails:
                raise OSError("audit log unavailable")
            receipt.extensions[name] = len(receipt.result.sources)

        return RetrievalEffect(id=name, description=f"effect {name}", handle=handle)


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


# -- order --------------------------------------------------------------------------------

SEED_ORDER = [
    "prepare",
    "assert_input",
    "key",
    "state",
    "limit",
    "authorize",
    "execute",
    "assert_result",
    "effect:first",
    "effect:second",
]


def test_run_calls_ports_in_the_seed_order(rec: Recorder) -> None:
    retrieval = rec.retrieval(rec.effect("first"), rec.effect("second"))
    retrieval.run(" Agent ", Ctx(quota=2))
    assert rec.calls == SEED_ORDER


def test_authorize_runs_before_the_key_is_reserved_and_execute_after(rec: Recorder) -> None:
    rec.retrieval().run("Agent", Ctx())
    assert rec.saw["seen_at_authorize"] == frozenset()
    assert rec.saw["seen_at_execute"] == {("manual-search", "agent")}
    assert rec.saw["pending_at_execute"] == 1


def test_success_is_counted_after_assert_result_and_before_effects(rec: Recorder) -> None:
    ctx = Ctx()
    rec.retrieval(rec.effect("first")).run("Agent", ctx)
    assert rec.saw["count_at_execute"] == 0
    assert rec.saw["count_at_assert_result"] == 0
    assert rec.saw["count_at_first"] == 1
    assert rec.saw["sources_at_first"] == 2
    assert ctx.state.pending == 0


def test_prepare_output_is_what_every_later_port_sees(rec: Recorder) -> None:
    receipt = rec.retrieval().run("  Agent  ", Ctx())
    assert rec.saw["assert_input"] == "Agent"
    assert rec.saw["key"] == "Agent"
    assert rec.saw["authorize"] == "Agent"
    assert rec.saw["execute"] == "Agent"
    assert receipt.query == "  Agent  "  # the receipt keeps the caller's original


# -- the receipt --------------------------------------------------------------------------


def test_receipt_carries_key_sequence_time_raw_result_and_local_source_ids() -> None:
    ctx = Ctx()
    before = datetime.now(UTC)
    receipt = simple().run("Agent", ctx)
    after = datetime.now(UTC)
    assert receipt.retrieval_id == "manual-search"
    assert receipt.key == "agent"
    assert receipt.sequence == 1
    assert before <= receipt.started_at <= after
    assert receipt.started_at.tzinfo is UTC
    assert isinstance(receipt.raw_result, Found)
    assert receipt.raw_result.scanned == 3  # the raw result is kept untouched
    assert [s.source_id for s in receipt.result.sources] == [
        "manual-search:1:manual",
        "manual-search:1:faq",
    ]
    assert [s.origin_id for s in receipt.result.sources] == ["manual", "faq"]
    assert receipt.result.sources[0].source is DOCS[0]
    assert receipt.extensions == {}
    assert ctx.state.sources == receipt.result.sources


def test_sequence_numbers_successes_only_and_local_ids_follow_it() -> None:
    ctx = Ctx()
    retrieval = simple()
    with pytest.raises(InvalidQueryError):
        retrieval.run("   ", ctx)
    assert retrieval.run("Agent", ctx).sequence == 1
    second = retrieval.run("Billing", ctx)
    assert second.sequence == 2
    assert [s.source_id for s in second.result.sources] == ["manual-search:2:billing"]
    assert request_source_id("manual-search", 2, "billing") == "manual-search:2:billing"
    assert [s.sequence for s in ctx.state.sources] == [1, 1, 2]


# -- a failed attempt keeps its key -------------------------------------------------------


def test_failed_execute_keeps_its_key_and_is_never_retried(rec: Recorder) -> None:
    ctx = Ctx()
    retrieval = rec.retrieval()
    rec.fail_execute = True
    with pytest.raises(BackendError) as failed:
        retrieval.run("Agent", ctx)
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert "backend down" not in failed.value.message  # the cause's text is not copied
    assert failed.value.details["cause"] == "RuntimeError"
    rec.fail_execute = False
    rec.calls.clear()
    with pytest.raises(DuplicateQueryError) as duplicate:
        retrieval.run("  AGENT ", ctx)  # same key after prepare + normalisation
    assert duplicate.value.code == "DUPLICATE_QUERY"
    assert "execute" not in rec.calls
    assert ctx.state.has_seen("manual-search", "agent")
    assert ctx.state.query_count == 0
    assert ctx.state.pending == 0


def test_failed_assert_result_keeps_its_key_and_frees_its_quota(rec: Recorder) -> None:
    ctx = Ctx(quota=1)
    retrieval = rec.retrieval()
    rec.reject_result = True
    with pytest.raises(InvalidResultError):
        retrieval.run("Agent", ctx)
    rec.reject_result = False
    with pytest.raises(DuplicateQueryError):
        retrieval.run("Agent", ctx)
    assert retrieval.run("Billing", ctx).sequence == 1  # the quota slot was freed


def test_a_failed_attempt_leaves_no_sources() -> None:
    ctx = Ctx()

    def broken(_query: str, _ctx: Ctx) -> Found:
        raise RuntimeError("boom")

    with pytest.raises(BackendError):
        define_retrieval("broken", "always fails", broken, state=state_of).run("Agent", ctx)
    assert ctx.state.sources == ()
    assert ctx.state.seen == {("broken", "agent")}


# -- quota --------------------------------------------------------------------------------


def test_quota_counts_successes_only(rec: Recorder) -> None:
    ctx = Ctx(quota=1)
    retrieval = rec.retrieval()
    rec.fail_execute = True
    with pytest.raises(BackendError):
        retrieval.run("Agent", ctx)
    rec.fail_execute = False
    assert retrieval.run("Billing", ctx).sequence == 1  # the failure did not use the quota
    rec.calls.clear()
    with pytest.raises(QuotaExceededError) as exceeded:
        retrieval.run("FAQ", ctx)
    assert exceeded.value.code == "QUOTA_EXCEEDED"
    assert exceeded.value.details["limit"] == 1
    assert exceeded.value.details["used"] == 1
    assert rec.calls == ["prepare", "assert_input", "key", "state", "limit"]
    assert not ctx.state.has_seen("manual-search", "faq")  # a refused query burns nothing


def test_zero_quota_refuses_before_authorize(rec: Recorder) -> None:
    with pytest.raises(QuotaExceededError):
        rec.retrieval().run("Agent", Ctx(quota=0))
    assert "authorize" not in rec.calls


def test_duplicate_is_checked_before_authorize(rec: Recorder) -> None:
    ctx = Ctx()
    retrieval = rec.retrieval()
    retrieval.run("Agent", ctx)
    rec.calls.clear()
    ctx.can_read = False  # would raise UNAUTHORIZED if authorize came first
    with pytest.raises(DuplicateQueryError):
        retrieval.run("Agent", ctx)
    assert "authorize" not in rec.calls


def test_duplicate_is_reported_before_quota() -> None:
    ctx = Ctx(quota=1)
    retrieval = simple()
    retrieval.run("Agent", ctx)
    with pytest.raises(DuplicateQueryError):
        retrieval.run("agent", ctx)  # both duplicate and over quota: duplicate wins


def test_limit_none_is_unlimited_and_bad_limits_are_definition_bugs() -> None:
    ctx = Ctx(quota=None)
    retrieval = simple()
    for query in ("Agent", "FAQ", "Billing", "Core"):
        retrieval.run(query, ctx)
    assert ctx.state.query_count == 4
    for bad, error in ((-1, ValueError), (True, TypeError), ("2", TypeError)):
        with pytest.raises(error):
            simple(limit=lambda _ctx, bad=bad: bad).run("Agent", Ctx())


# -- authorisation ------------------------------------------------------------------------


def test_unauthorized_call_does_not_burn_the_key_nor_the_quota(rec: Recorder) -> None:
    ctx = Ctx(can_read=False, quota=1)
    retrieval = rec.retrieval()
    with pytest.raises(UnauthorizedError) as denied:
        retrieval.run("Agent", ctx)
    assert denied.value.code == "UNAUTHORIZED"
    assert "execute" not in rec.calls
    assert ctx.state.seen == frozenset()
    ctx.can_read = True
    receipt = retrieval.run("Agent", ctx)  # same query, now allowed: not a duplicate
    assert receipt.sequence == 1


@pytest.mark.parametrize("verdict", [False, 0, "", "yes", [], None, True])
def test_guards_fail_closed_on_anything_but_none_or_true(verdict: object) -> None:
    retrieval = simple(authorize=lambda _q, _c: verdict)
    if verdict is None or verdict is True:
        assert retrieval.run("Agent", Ctx()).sequence == 1
    else:
        with pytest.raises(UnauthorizedError):
            retrieval.run("Agent", Ctx())


def test_an_exception_in_authorize_is_unauthorized_and_chained() -> None:
    def authorize(_query: str, _ctx: Ctx) -> None:
        raise PermissionError("没有资料读取权限 for owner alice")

    with pytest.raises(UnauthorizedError) as denied:
        simple(authorize=authorize).run("Agent", Ctx())
    assert isinstance(denied.value.__cause__, PermissionError)
    assert "alice" not in str(denied.value)


# -- input checks -------------------------------------------------------------------------


def test_rejected_input_is_invalid_query_and_reserves_nothing(rec: Recorder) -> None:
    ctx = Ctx()
    with pytest.raises(InvalidQueryError) as invalid:
        rec.retrieval().run("   ", ctx)
    assert isinstance(invalid.value.__cause__, ValueError)
    assert invalid.value.details["port"] == "assert_input"
    assert rec.calls == ["prepare", "assert_input"]
    assert ctx.state.seen == frozenset()


def test_a_failing_prepare_or_key_is_invalid_query() -> None:
    def bad(_query: str, _ctx: Ctx) -> str:
        raise KeyError("x")

    for options in ({"prepare": bad}, {"key": bad}):
        with pytest.raises(InvalidQueryError):
            simple(**options).run("Agent", Ctx())
    with pytest.raises(InvalidQueryError):
        simple(key=lambda _q, _c: "").run("Agent", Ctx())  # an empty key is refused


def test_library_errors_raised_by_ports_pass_through_unchanged() -> None:
    stale = IndexStaleError("index behind", details={"target": "manual"})

    def execute(_query: str, _ctx: Ctx) -> Found:
        raise stale

    with pytest.raises(IndexStaleError) as raised:
        simple(execute=execute).run("Agent", Ctx())
    assert raised.value is stale

    def assert_input(_query: str, _ctx: Ctx) -> None:
        raise UnauthorizedError("custom refusal")

    with pytest.raises(UnauthorizedError, match="custom refusal"):
        simple(assert_input=assert_input).run("Agent", Ctx())


# -- results ------------------------------------------------------------------------------


@dataclass(slots=True)
class Loose:
    sources: Any


@dataclass(slots=True)
class LooseDoc:
    source_id: Any


@pytest.mark.parametrize(
    "raw",
    [
        None,
        Loose(sources=None),
        Loose(sources="manual"),
        Loose(sources=[LooseDoc(source_id=None)]),
        Loose(sources=[LooseDoc(source_id="")]),
        Loose(sources=[LooseDoc(source_id="a\x00b")]),
        Loose(sources=[object()]),
        Loose(sources=[LooseDoc(source_id="a"), LooseDoc(source_id="a")]),
    ],
)
def test_malformed_results_are_invalid_result_and_keep_the_key(raw: object) -> None:
    ctx = Ctx()
    retrieval = simple(execute=lambda _q, _c: raw)
    with pytest.raises(InvalidResultError):
        retrieval.run("Agent", ctx)
    assert ctx.state.has_seen("manual-search", "agent")
    assert ctx.state.query_count == 0
    assert ctx.state.pending == 0


def test_recorded_sources_are_a_snapshot_of_the_backend_list() -> None:
    backing = [LooseDoc(source_id="a")]
    ctx = Ctx()
    receipt = simple(execute=lambda _q, _c: Loose(sources=backing)).run("Agent", ctx)
    backing.append(LooseDoc(source_id="b"))
    assert [s.origin_id for s in receipt.result.sources] == ["a"]
    assert len(ctx.state.sources) == 1


# -- effects ------------------------------------------------------------------------------


def test_effects_run_in_order_and_write_extensions(rec: Recorder) -> None:
    seen_by_second: list[dict[str, Any]] = []

    def second(receipt: RetrievalReceipt[str, Doc], _ctx: Ctx) -> None:
        rec.calls.append("effect:second")
        seen_by_second.append(dict(receipt.extensions))
        receipt.extensions["second"] = True

    retrieval = rec.retrieval(
        rec.effect("first"), RetrievalEffect(id="second", description="two", handle=second)
    )
    receipt = retrieval.run("Agent", Ctx())
    assert rec.calls[-2:] == ["effect:first", "effect:second"]
    assert seen_by_second == [{"first": 2}]  # second ran after first
    assert receipt.extensions == {"first": 2, "second": True}


def test_a_failing_effect_is_reported_with_the_receipt_and_nothing_is_rolled_back(
    rec: Recorder,
) -> None:
    ctx = Ctx()
    retrieval = rec.retrieval(
        rec.effect("first"), rec.effect("audit", fails=True), rec.effect("last")
    )
    with pytest.raises(RetrievalEffectError) as failed:
        retrieval.run("Agent", ctx)
    error = failed.value
    assert error.code == "EFFECT_FAILED"
    assert isinstance(error.__cause__, OSError)
    assert error.details["effect"] == "audit"
    assert error.details["completed"] == ["first"]
    assert error.details["skipped"] == ["last"]
    assert "effect:last" not in rec.calls  # later effects do not run
    assert error.receipt is not None
    assert error.receipt.extensions == {"first": 2}  # the earlier effect's work stays
    assert error.receipt.sequence == 1
    assert ctx.state.query_count == 1  # the success stays counted
    assert len(ctx.state.sources) == 2
    with pytest.raises(DuplicateQueryError):
        retrieval.run("Agent", ctx)


def test_effect_error_has_a_stable_code_and_pickles_without_the_receipt() -> None:
    assert error_class_for("EFFECT_FAILED") is RetrievalEffectError
    error = RetrievalEffectError("x", details={"effect": "audit"}, receipt=None)
    clone = pickle.loads(pickle.dumps(error))
    assert isinstance(clone, RetrievalEffectError)
    assert clone.details == {"effect": "audit"}
    assert clone.receipt is None
    assert isinstance(clone, ContextSearchError)


# -- the default key ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("Agent Core", "agent core"),
        ("  agent \t\n core  ", "agent core"),  # whitespace collapsed and trimmed
        ("ＡＧＥＮＴ　ＣＯＲＥ", "agent core"),  # NFKC: full-width letters, ideographic space
        ("Straße", "strasse"),  # case folding, not just lower()
        ("ﬁle", "file"),  # NFKC ligature
        ("e\u0301", "é"),  # composed
        ("使用指南", "使用指南"),
    ],
)
def test_default_key_normalises_nfkc_casefold_whitespace(query: str, key: str) -> None:
    assert retrieval_query_key(query) == key


def test_default_key_makes_spelling_variants_duplicates() -> None:
    ctx = Ctx()
    retrieval = simple()
    retrieval.run("Agent  Core", ctx)
    for variant in ("agent core", "ＡＧＥＮＴ　ＣＯＲＥ", "\tAGENT core\n"):
        with pytest.raises(DuplicateQueryError):
            retrieval.run(variant, ctx)


@pytest.mark.parametrize("query", ["", "  \u3000 ", "a\x00b", "\ud800", 42, "x" * 9000])
def test_default_key_rejects_what_cannot_be_a_text_query(query: object) -> None:
    with pytest.raises(InvalidQueryError):
        retrieval_query_key(query)


def test_a_custom_key_decides_what_is_a_duplicate() -> None:
    ctx = Ctx()
    retrieval = simple(key=lambda query, _ctx: query)  # exact text, no normalisation
    retrieval.run("Agent", ctx)
    assert retrieval.run("agent", ctx).key == "agent"
    with pytest.raises(DuplicateQueryError):
        retrieval.run("Agent", ctx)


# -- per-request state --------------------------------------------------------------------


def test_state_is_per_request() -> None:
    retrieval = simple()
    first, second = Ctx(quota=1), Ctx(quota=1)
    assert retrieval.run("Agent", first).sequence == 1
    assert retrieval.run("Agent", second).sequence == 1  # another request: not a duplicate
    with pytest.raises(QuotaExceededError):
        retrieval.run("FAQ", first)


def test_a_state_shared_by_two_retrievals_shares_quota_and_sequence_not_keys() -> None:
    ctx = Ctx(quota=2)
    manual = simple()
    faq = define_retrieval("faq-search", "reads the FAQ", search, state=state_of, limit=quota_of)
    manual.run("Agent", ctx)
    receipt = faq.run("Agent", ctx)  # same query, other retrieval: not a duplicate
    assert receipt.sequence == 2
    assert [s.source_id for s in ctx.state.sources] == [
        "manual-search:1:manual",
        "manual-search:1:faq",
        "faq-search:2:manual",
        "faq-search:2:faq",
    ]
    with pytest.raises(QuotaExceededError):
        faq.run("Billing", ctx)


def test_without_a_state_port_every_run_is_its_own_request() -> None:
    retrieval = define_retrieval("manual-search", "no state", search)
    assert retrieval.run("Agent", Ctx()).sequence == 1
    assert retrieval.run("Agent", Ctx()).sequence == 1


# -- synchronous only ---------------------------------------------------------------------


def test_asynchronous_ports_are_refused_when_defined() -> None:
    async def execute(query: str, ctx: Ctx) -> Found:  # pragma: no cover - never awaited
        return search(query, ctx)

    with pytest.raises(TypeError, match="synchronous"):
        define_retrieval("manual-search", "async", execute)  # type: ignore[arg-type]


def test_an_awaitable_returned_at_run_time_is_refused() -> None:
    async def later() -> Found:  # pragma: no cover - closed, never run
        return Found(sources=(), scanned=0)

    ctx = Ctx()
    with pytest.raises(TypeError, match="synchronous"):
        simple(execute=lambda _q, _c: later()).run("Agent", ctx)
    assert ctx.state.pending == 0
    assert ctx.state.has_seen("manual-search", "agent")  # a failed attempt, like any other


def test_run_returns_the_receipt_itself() -> None:
    receipt = simple().run("Agent", Ctx())
    assert isinstance(receipt, RetrievalReceipt)


# -- definition errors --------------------------------------------------------------------


def _noop(receipt: RetrievalReceipt[str, Doc], ctx: Ctx) -> None:
    return None


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: define_retrieval("", "d", search), ValueError),
        (lambda: define_retrieval("has:colon", "d", search), ValueError),
        (lambda: define_retrieval("has space", "d", search), ValueError),
        (lambda: define_retrieval("trailing\n", "d", search), ValueError),
        (lambda: define_retrieval("ok", " ", search), ValueError),
        (lambda: define_retrieval("ok", "d", None), TypeError),  # type: ignore[arg-type]
        (lambda: define_retrieval("ok", "d", search, authorize=42), TypeError),  # type: ignore[arg-type]
        (lambda: define_retrieval("ok", "d", search, limit=quota_of), ValueError),
        (lambda: define_retrieval("ok", "d", search, effects="ab"), TypeError),  # type: ignore[arg-type]
        (lambda: define_retrieval("ok", "d", search, effects=[object()]), TypeError),  # type: ignore[list-item]
        (
            lambda: define_retrieval(
                "ok",
                "d",
                search,
                effects=[
                    RetrievalEffect(id="e", description="d", handle=_noop),
                    RetrievalEffect(id="e", description="d", handle=_noop),
                ],
            ),
            ValueError,
        ),
    ],
)
def test_definition_mistakes_fail_at_definition(build: Callable[[], object], error: type) -> None:
    with pytest.raises(error):
        build()


def test_a_state_port_must_return_a_state() -> None:
    with pytest.raises(TypeError):
        simple(state=lambda _ctx: {}).run("Agent", Ctx())


# -- threads ------------------------------------------------------------------------------


def _race(
    work: Callable[[int], object],
    count: int,
    *,
    settled: Callable[[list[object]], bool],
    release: threading.Event,
) -> tuple[list[object], list[object]]:
    """Run ``work`` in ``count`` threads; return the outcomes seen once ``settled`` holds
    (or after 2 s) while ``release`` is still unset, and all outcomes after setting it."""
    outcomes: list[object] = []
    lock = threading.Lock()

    def target(i: int) -> None:
        try:
            value: object = work(i)
        except Exception as exc:
            value = exc
        with lock:
            outcomes.append(value)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            with lock:
                if settled(outcomes):
                    break
            time.sleep(0.005)
        with lock:
            early = list(outcomes)
    finally:
        release.set()
        for t in threads:
            t.join(timeout=5)
    return early, outcomes


def test_concurrent_runs_of_one_query_execute_once() -> None:
    release = threading.Event()
    executed: list[str] = []

    def execute(query: str, ctx: Ctx) -> Found:
        executed.append(query)
        release.wait(timeout=5)
        return search(query, ctx)

    ctx = Ctx()
    retrieval = simple(execute=execute)
    early, final = _race(
        lambda _i: retrieval.run("Agent", ctx),
        8,
        settled=lambda out: len(out) == 7,
        release=release,
    )
    assert len(early) == 7
    assert all(isinstance(o, DuplicateQueryError) for o in early)
    assert sum(isinstance(o, RetrievalReceipt) for o in final) == 1
    assert executed == ["Agent"]


def test_concurrent_runs_never_succeed_more_often_than_the_quota() -> None:
    release = threading.Event()
    entered: list[str] = []

    def execute(query: str, ctx: Ctx) -> Found:
        entered.append(query)
        release.wait(timeout=5)
        return search(query, ctx)

    ctx = Ctx(quota=2)
    retrieval = simple(execute=execute)
    # Two runs hold the two quota slots while blocked in execute; the others must be
    # refused at once, not all admitted because nothing has been counted yet.
    early, final = _race(
        lambda i: retrieval.run(f"query {i}", ctx),
        6,
        settled=lambda out: len(out) == 4,
        release=release,
    )
    assert len(early) == 4
    assert all(isinstance(o, QuotaExceededError) for o in early)
    assert sum(isinstance(o, RetrievalReceipt) for o in final) == 2
    assert len(entered) == 2
    assert ctx.state.query_count == 2
    assert ctx.state.pending == 0


@pytest.mark.parametrize(
    ("same_query", "quota", "refusal"),
    [(True, None, DuplicateQueryError), (False, 1, QuotaExceededError)],
)
def test_the_reserve_step_rechecks_what_changed_while_authorizing(
    same_query: bool, quota: int | None, refusal: type[ContextSearchError]
) -> None:
    # Every thread passes the first check, then all wait in authorize until each one is
    # there: only the atomic re-check when reserving can stop the others.
    threads = 4
    barrier = threading.Barrier(threads, timeout=5)

    def authorize(_query: str, _ctx: Ctx) -> None:
        barrier.wait()

    ctx = Ctx(quota=quota)
    retrieval = simple(authorize=authorize)
    _, final = _race(
        lambda i: retrieval.run("Agent" if same_query else f"Agent {i}", ctx),
        threads,
        settled=lambda out: len(out) == threads,
        release=threading.Event(),
    )
    assert sum(isinstance(o, RetrievalReceipt) for o in final) == 1
    assert sum(isinstance(o, refusal) for o in final) == threads - 1
    assert ctx.state.query_count == 1

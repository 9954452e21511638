"""Leak probes: an adversary in scope ``public`` tries to learn about ``vault`` documents.

The secret documents have unique markers (a title word, owner, source URI, metadata values,
ids, a source revision). Every probe is asked of two indexes that hold the same public
documents — one also holds the secrets, one does not — and the answers must be identical
apart from read timestamps: hits, snippets, scores, filter statistics, rank logs, evidence,
propagation counts, explanations, documents, gap receipts, error codes, messages and
details. Filters, targets and pins that name only the secret must answer exactly like ones
that name nothing; no answer may contain a marker the caller did not type.

Then the database itself is probed as the reader role with raw SQL. Row-level security
holds for a fixed scope setting, but the setting is *trusted* and the session can leave the
role: those escape hatches are asserted and documented below, because they are the reason
an application must never let callers run SQL of their own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from context_search import (
    ContextDocumentRecord,
    ContextSearchError,
    GapReport,
    HashingEmbedder,
    InMemorySearchConnector,
    SearchQuery,
    gap_id_for,
)
from context_search.gateway import ToolContext, ToolGateway
from context_search.postgres import PostgresSearchConnector
from context_search.sqlite import SQLiteSearchConnector
from tests.security.conftest import PROBES

PUBLIC = "public"
VAULT = "vault"

SECRET_ID = "vault-xq-7731"
SECRET_WORD = "xylophonequasar"
SECRET_TITLE = "Xylophonequasar acquisition plan"
SECRET_OWNER = "mallory.vaultkeeper"
SECRET_URI = "vault://covert/xylophonequasar-plan.pdf"
SECRET_REV = "rev-secret-9f3a"
SECRET_TIME = datetime(2026, 6, 1, tzinfo=UTC)

#: Strings that exist only in secret documents (or name them); none may reach the caller.
MARKERS = (
    SECRET_ID,
    SECRET_WORD,
    SECRET_OWNER,
    SECRET_URI,
    SECRET_REV,
    "nightjar",
    "vaultsys",
    "covert-ops",
    "topsecret",
    "vault-poison",
    "vault-deleted-1",
    "vault-rescoped-1",
    "vault-deferred-1",
    "vault2",
    "秘密",
)


def _public(doc_id: str, title: str, body: str, day: int, **kw: Any) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id=doc_id,
        title=title,
        body=body,
        permission_scope=PUBLIC,
        source_system="wiki",
        source_uri=f"wiki://public/{doc_id}",
        source_revision=f"{doc_id}@1",
        updated_at=datetime(2026, 1, day, tzinfo=UTC),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        **kw,
    )


PUBLIC_DOCS = (
    _public(
        "pub-aurora",
        "Aurora runbook",
        "The aurora service restarts nightly. Operators restart aurora when the sentinel fails.",
        10,
        owner="alice",
        project="aurora",
        department="sre",
        tags=("runbook",),
        metadata={"clearance": 1, "region": "eu"},
    ),
    _public(
        "pub-basalt",
        "Basalt storage",
        "Basalt storage nodes restart weekly; an acquisition of new disks is planned.",
        11,
        owner="bob",
        project="basalt",
        tags=("storage",),
        metadata={"clearance": 2},
    ),
    _public(
        "pub-cobalt",
        "Cobalt plan",
        "The cobalt acquisition plan closes in June. Aurora depends on cobalt acquisition.",
        12,
        owner="carol",
        project="cobalt",
        metadata={"clearance": 3, "region": "us"},
    ),
    _public("pub-cjk", "极光 手册", "极光服务每晚重启。计划文档在这里。", 13),
    _public("pub-old", "Old aurora plan", "The old aurora restart plan, replaced.", 14),
    dataclasses.replace(
        _public("pub-new", "New aurora plan", "The new aurora restart plan.", 15),
        supersedes=("pub-old",),
    ),
)

SECRET = ContextDocumentRecord(
    document_id=SECRET_ID,
    title=SECRET_TITLE,
    summary="nightjar acquisition summary",
    body="Aurora restart plan for xylophonequasar: the aurora runbook restarts nightly, and "
    "the xylophonequasar acquisition closes in June. Sentinel, basalt and cobalt are cover.",
    permission_scope=VAULT,
    owner=SECRET_OWNER,
    department="covert-ops",
    project="nightjar",
    source_system="vaultsys",
    source_uri=SECRET_URI,
    tags=("topsecret", "runbook"),
    entities=("Nightjar Corp",),
    metadata={"codename": "nightjar", "clearance": 7, "huge": 2**53},
    source_revision=SECRET_REV,
    updated_at=SECRET_TIME,
    created_at=SECRET_TIME - timedelta(days=10),
)
SECRETS = (
    SECRET,
    # A row that breaks every read that loads it (year 10000 in UTC): invisible rows must
    # never be loaded for a public caller, so public answers stay unaffected.
    ContextDocumentRecord(
        document_id="vault-poison",
        body="aurora restart xylophonequasar poison",
        permission_scope=VAULT,
        updated_at=datetime(9998, 12, 30, 23, 0, tzinfo=timezone(timedelta(hours=-14))),
    ),
    ContextDocumentRecord(
        document_id="vault-deleted-1",
        body="aurora deleted xylophonequasar",
        permission_scope=VAULT,
    ),
    ContextDocumentRecord(
        document_id="vault-rescoped-1",
        body="aurora rescoped xylophonequasar plan",
        permission_scope=VAULT,
    ),
    ContextDocumentRecord(
        document_id="极光-秘密",
        title="极光 秘密 计划",
        body="极光 秘密 计划 xylophonequasar 每晚重启",
        permission_scope=VAULT,
    ),
)
DEFERRED = ContextDocumentRecord(
    document_id="vault-deferred-1", body="aurora deferred xylophonequasar", permission_scope=VAULT
)
SECRET_IDS = (*(s.document_id for s in SECRETS), DEFERRED.document_id)
GAP_QUESTION = "How do we restart aurora after the acquisition?"

# -- the two indexes --------------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    """The same public documents, with and without the secrets."""

    backend: str
    with_secret: Any
    without: Any
    dsn: str | None = None
    schema_with: str | None = None
    schema_without: str | None = None
    #: PostgreSQL only: connectors on the same schemas forced onto the HNSW index path.
    hnsw: tuple[Any, Any] | None = None


def fresh_connector(request: pytest.FixtureRequest, backend: str) -> Any:
    """An empty connector that needs no server: the reference one, or a new SQLite file."""
    if backend == "memory":
        return InMemorySearchConnector(embedder=HashingEmbedder())
    directory = request.getfixturevalue("tmp_path_factory").mktemp("leak")
    return SQLiteSearchConnector.open(str(directory / "index.db"), embedder=HashingEmbedder())


def _fill(connector: Any, *, secret: bool) -> None:
    connector.upsert(list(PUBLIC_DOCS))
    if not secret:
        return
    connector.upsert(list(SECRETS))
    connector.upsert([DEFERRED], defer_indexing=True)  # a pending job in the vault
    assert connector.delete_or_supersede("vault-deleted-1")  # a pending purge job
    assert connector.rescope("vault-rescoped-1", "vault2")  # a job about vault and vault2
    for scopes in ([VAULT], [VAULT], [VAULT], [PUBLIC, VAULT]):
        connector.report_gap(
            GapReport(query=GAP_QUESTION, allowed_scopes=scopes, reason="no evidence")
        )
        connector.report_gap(
            GapReport(query="gateway gap", allowed_scopes=scopes, reason="gateway reason")
        )


@pytest.fixture(scope="module", params=["memory", "postgres", "sqlite", "replica", "partitioned"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    if request.param in ("memory", "sqlite"):
        with_secret, without = (
            fresh_connector(request, request.param),
            fresh_connector(request, request.param),
        )
        _fill(with_secret, secret=True)
        _fill(without, secret=False)
        yield Pair(request.param, with_secret, without)
        with_secret.close()
        without.close()
        return
    dsn: str = request.getfixturevalue("context_search_dsn")
    make: Callable[[], str] = request.getfixturevalue("schema_factory")
    schema_with, schema_without = make(), make()
    # "replica": written on the primary, every read served by a streaming replica (after
    # replaying the connector's own writes); raw SQL probes go to the replica too.
    routed: dict[str, Any] = {}
    if request.param == "replica":
        replica: str = request.getfixturevalue("context_search_replica_dsn")
        routed = {"read_dsns": [replica], "read_your_writes": True}
    with ExitStack() as stack:

        def open_(schema: str, **kw: Any) -> PostgresSearchConnector:
            return stack.enter_context(
                PostgresSearchConnector.open(
                    dsn, embedder=HashingEmbedder(), schema=schema, **routed, **kw
                )
            )

        with_secret, without = open_(schema_with), open_(schema_without)
        if request.param == "partitioned":
            # The secrets' scopes in partitions of their own (their own HNSW graph and
            # postings), the public scope in the default partition; the same layout on
            # both sides, so answers stay comparable.
            for connector in (with_secret, without):
                connector.partition_scopes([VAULT, "vault2"])
        _fill(with_secret, secret=True)
        _fill(without, secret=False)
        off = {"enable_seqscan": "off", "enable_bitmapscan": "off", "enable_sort": "off"}
        force_hnsw = {"exact_threshold": 0, "exact_scale": 0, "planner_settings": off}
        hnsw = (open_(schema_with, **force_hnsw), open_(schema_without, **force_hnsw))
        if request.param == "replica":
            probe = with_secret.search(SearchQuery(query="aurora", allowed_scopes=[PUBLIC]))
            assert probe.evidence.served_by.role == "replica"
            dsn = replica
            for connector in hnsw:  # they wrote nothing: wait for the fill's writes
                connector.search(
                    SearchQuery(query="aurora", allowed_scopes=[PUBLIC]),
                    consistent_with=with_secret.last_commit_token,
                )
        kind = request.param
        yield Pair(kind, with_secret, without, dsn, schema_with, schema_without, hnsw)


#: Raw SQL and the HNSW path exist only on PostgreSQL: those tests take only those pairs.
pg_only = pytest.mark.parametrize("pair", ["postgres", "partitioned"], indirect=True)
#: Raw reads (no writes, no ANALYZE) also run against the streaming replica.
pg_reads = pytest.mark.parametrize("pair", ["postgres", "replica", "partitioned"], indirect=True)


# -- comparing answers ------------------------------------------------------------------

#: Clock and WAL readings: the replica's lag, wait and replayed position differ per call.
_TIMESTAMPS = frozenset(
    {"observed_at", "received_at", "replay_lag_seconds", "waited_seconds", "replayed_position"}
)


def plain(value: Any) -> Any:
    """An answer as plain data without read timestamps (the only allowed difference; the
    age of the oldest pending job is a clock reading too, so only its presence counts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {
            k: (v is None) if k == "oldest_pending_seconds" else plain(v)
            for k, v in value.items()
            if k not in _TIMESTAMPS
        }
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def answer(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", data)`` or ``("error", (class, code, message, details))``; nothing else."""
    try:
        return "ok", plain(fn())
    except ContextSearchError as exc:
        return "error", (type(exc).__name__, exc.code, exc.message, plain(exc.details))


def text_of(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)


def as_json(value: Any) -> Any:
    return json.loads(text_of(value))


def assert_no_markers(result: Any, typed: object = "") -> None:
    """No secret marker in ``result`` unless the caller typed it (``typed``) itself."""
    shown, asked = text_of(result), text_of(typed)
    for marker in MARKERS:
        if marker in shown:
            assert marker in asked, f"secret marker {marker!r} leaked: {shown[:400]}"


def probe(family: str, pair: Pair, ask: Callable[[Any], Any], typed: object = "") -> Any:
    """Ask both indexes; the answers must be identical and free of unasked markers."""
    PROBES[f"leak:{family}"] += 1
    with_secret = answer(lambda: ask(pair.with_secret))
    without = answer(lambda: ask(pair.without))
    assert with_secret == without, f"{family}: answers differ for {typed!r}"
    assert_no_markers(with_secret, typed)
    return with_secret


# -- search: hits, snippets, stats, rank log, evidence ---------------------------------

QUERIES = (
    SECRET_WORD,
    SECRET_TITLE,
    SECRET_OWNER,
    "mallory",
    SECRET_URI,
    "covert vault",
    "nightjar",
    "topsecret",
    SECRET_REV,
    SECRET_ID,
    "aurora restart",
    "aurora",
    "acquisition plan june",
    f'"{SECRET_WORD} acquisition"',
    f"-{SECRET_WORD} aurora",
    f"aurora {SECRET_WORD} basalt cobalt sentinel",
    "xylophone",
    "极光 秘密",
    "极光 计划",
)
VARIANTS: tuple[dict[str, Any], ...] = (
    {"top_k": 1},
    {"top_k": 200},
    {"top_k": 200, "min_similarity": 0.2},
    {"top_k": 200, "include_superseded": True},
    {"top_k": 5, "min_score": 0.0},
)
CALLER_SCOPES = ([PUBLIC], [PUBLIC, "nobody"])


def test_search_answers_identical_with_and_without_secret(pair: Pair) -> None:
    """Hits, snippets, scores, SearchStats counts, the rank log and evidence are equal."""
    for scopes in CALLER_SCOPES:
        for text in QUERIES:
            for variant in VARIANTS if scopes == [PUBLIC] else VARIANTS[1:2]:
                query = SearchQuery(query=text, allowed_scopes=scopes, **variant)
                kind, data = probe("search", pair, lambda c, q=query: c.search(q), text)
                assert kind == "ok"
                assert all(h["permission_scope"] == PUBLIC for h in data["hits"])
    # The probes are sensitive: with the vault in scope the secret is found, and the
    # statistics (hence the public document's BM25 score) change with it.
    found = pair.with_secret.search(
        SearchQuery(query=SECRET_WORD, allowed_scopes=[VAULT], targets=[SECRET_ID])
    )
    assert [h.doc_id for h in found.hits] == [SECRET_ID]

    def both_scopes(c: Any) -> dict[str, Any]:
        query = SearchQuery(query="sentinel operators", allowed_scopes=[PUBLIC, VAULT], top_k=1)
        return {e.doc_id: e for e in c.search(query).rank_log.entries}

    with_vault, without_vault = both_scopes(pair.with_secret), both_scopes(pair.without)
    assert SECRET_ID in with_vault and SECRET_ID not in without_vault
    assert with_vault["pub-aurora"].lexical_score != without_vault["pub-aurora"].lexical_score


@pg_reads
def test_hnsw_path_identical_with_and_without_secret(pair: Pair) -> None:
    """The approximate index walks a graph that includes invisible rows: results must not
    depend on them (PostgreSQL only; the reference connector has no index)."""
    assert pair.hnsw is not None
    hnsw_pair = dataclasses.replace(pair, with_secret=pair.hnsw[0], without=pair.hnsw[1])
    plan = pair.hnsw[0].search_plan(SearchQuery(query="aurora", allowed_scopes=[PUBLIC]))
    assert "ix_chunks_embedding_hnsw" in plan
    for text in QUERIES[::2]:
        for variant in VARIANTS[1:3]:
            query = SearchQuery(query=text, allowed_scopes=[PUBLIC], **variant)
            probe("search-hnsw", hnsw_pair, lambda c, q=query: c.search(q), text)


SECRET_ONLY_FILTERS: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
    ({"owner": SECRET_OWNER}, {"owner": "nobody.at.all"}),
    ({"owner": {"in": [SECRET_OWNER, "x"]}}, {"owner": {"in": ["nobody.at.all", "x"]}}),
    ({"project": "nightjar"}, {"project": "no-project"}),
    ({"department": "covert-ops"}, {"department": "no-department"}),
    ({"source_system": "vaultsys"}, {"source_system": "no-system"}),
    ({"tags": "topsecret"}, {"tags": "no-tag"}),
    ({"tags": {"in": ["topsecret"]}}, {"tags": {"in": ["no-tag"]}}),
    ({"metadata.codename": "nightjar"}, {"metadata.codename": "no-codename"}),
    ({"metadata.clearance": 7}, {"metadata.clearance": 700}),
    ({"metadata.clearance": {"gte": 7}}, {"metadata.clearance": {"gte": 700}}),
    ({"metadata.clearance": {"in": [7, 8]}}, {"metadata.clearance": {"in": [700, 800]}}),
    # the secret holds 2**53, the largest magnitude ingestion accepts: at the edge, no leak
    ({"metadata.huge": {"gte": 0}}, {"metadata.huge": {"lte": -1}}),
    ({"metadata.huge": {"gt": 1e300}}, {"metadata.huge": {"lt": -1e300}}),
    ({"updated_at": {"gte": datetime(2026, 5, 1, tzinfo=UTC)}},
     {"updated_at": {"gte": datetime(2027, 5, 1, tzinfo=UTC)}}),
    ({"updated_at": SECRET_TIME}, {"updated_at": SECRET_TIME + timedelta(days=400)}),
    ({"created_at": {"gt": datetime(2026, 5, 1, tzinfo=UTC)}},
     {"created_at": {"gt": datetime(2027, 5, 1, tzinfo=UTC)}}),
)  # fmt: skip


FILTER_QUERIES: tuple[tuple[str, dict[str, Any]], ...] = (
    (SECRET_WORD, {"top_k": 200}),
    ("aurora restart acquisition plan", {"top_k": 200, "include_superseded": True}),
)


def _filtered(c: Any, text: str, variant: dict[str, Any], filters: dict[str, Any]) -> Any:
    return c.search(SearchQuery(query=text, allowed_scopes=[PUBLIC], filters=filters, **variant))


def _explained(c: Any, doc_id: str, filters: dict[str, Any]) -> Any:
    return c.explain(doc_id, SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters=filters))


def test_filters_matching_only_the_secret_equal_filters_matching_nothing(pair: Pair) -> None:
    for secret_filter, nothing_filter in SECRET_ONLY_FILTERS:
        for text, variant in FILTER_QUERIES:
            secret = probe(
                "filter",
                pair,
                lambda c, t=text, v=variant, f=secret_filter: _filtered(c, t, v, f),
                secret_filter,
            )
            nothing = probe(
                "filter",
                pair,
                lambda c, t=text, v=variant, f=nothing_filter: _filtered(c, t, v, f),
                nothing_filter,
            )
            assert secret == nothing, secret_filter
            assert secret[0] == "ok" and secret[1]["hits"] == []
        # and the explanation of a visible document under such a filter
        for doc_id in ("pub-aurora",):
            a = probe(
                "filter-explain",
                pair,
                lambda c, d=doc_id, f=secret_filter: _explained(c, d, f),
                secret_filter,
            )
            b = probe(
                "filter-explain",
                pair,
                lambda c, d=doc_id, f=nothing_filter: _explained(c, d, f),
                nothing_filter,
            )
            assert a == b, secret_filter


def _swap(result: Any, old: str, new: str) -> Any:
    return json.loads(text_of(result).replace(old, new))


def test_targets_and_pins_naming_the_secret_equal_missing_ids(pair: Pair) -> None:
    for secret_id in SECRET_IDS:
        missing = "missing-" + secret_id
        for build in (
            lambda i: {"targets": [i]},
            lambda i: {"targets": ["pub-aurora", i]},
            lambda i: {"targets": [i], "require_fresh": True},
            lambda i: {"pinned_revisions": {i: SECRET_REV}},
            lambda i: {"pinned_revisions": {"pub-aurora": "pub-aurora@1", i: "x"}},
            lambda i: {"targets": [i], "pinned_revisions": {i: SECRET_REV}},
        ):
            # the secret's own words for the main id, a common query for the others
            for text in ("aurora restart", SECRET_WORD) if secret_id == SECRET_ID else ("aurora",):

                def ask(c: Any, doc_id: str, build: Any = build, text: str = text) -> Any:
                    return c.search(
                        SearchQuery(query=text, allowed_scopes=[PUBLIC], **build(doc_id))
                    )

                typed = (text, build(secret_id))
                secret = probe("target-pin", pair, lambda c, i=secret_id: ask(c, i), typed)
                absent = probe(
                    "target-pin", pair, lambda c, i=missing: ask(c, i), (text, build(missing))
                )
                assert as_json(secret) == _swap(absent, missing, secret_id), build(secret_id)


def test_explain_of_a_secret_equals_explain_of_a_missing_id(pair: Pair) -> None:
    for secret_id in SECRET_IDS:
        for text in (SECRET_WORD, "aurora", SECRET_OWNER):
            for filters in ({}, {"owner": SECRET_OWNER}, {"metadata.huge": {"gte": 0}}):
                query = SearchQuery(query=text, allowed_scopes=[PUBLIC], filters=filters)
                typed = (secret_id, text, filters)
                secret = probe(
                    "explain", pair, lambda c, q=query, i=secret_id: c.explain(i, q), typed
                )
                missing = probe(
                    "explain", pair, lambda c, q=query: c.explain("no-such-doc", q), typed
                )
                assert (
                    secret
                    == missing
                    == (
                        "error",
                        ("NotFoundError", "NOT_FOUND", "document not found", {}),
                    )
                )
    # the explanation of a visible document does not depend on invisible ones either
    for text in QUERIES:
        query = SearchQuery(query=text, allowed_scopes=[PUBLIC])
        probe("explain", pair, lambda c, q=query: c.explain("pub-aurora", q), text)


def test_get_document_of_a_secret_equals_a_missing_id(pair: Pair) -> None:
    for secret_id in SECRET_IDS:
        for scopes in ([PUBLIC], [PUBLIC, "nobody"], ["vault "], ["VAULT"], ["%"], ["{vault}"]):
            got = probe(
                "get_document",
                pair,
                lambda c, i=secret_id, s=scopes: c.get_document(i, s),
                secret_id,
            )
            assert got == ("ok", None)
    # the probes are meaningful: the secret exists for its own scope
    assert pair.with_secret.get_document(SECRET_ID, [VAULT]) is not None
    assert pair.without.get_document(SECRET_ID, [VAULT]) is None
    for doc in PUBLIC_DOCS:
        probe("get_document", pair, lambda c, i=doc.document_id: c.get_document(i, [PUBLIC]))


def test_gap_identity_does_not_depend_on_other_scopes(pair: Pair) -> None:
    """contract.gap_id_for: the id is a hash of (normalised question, *sorted scopes*,
    normalised reason) and ignores the requester; occurrences count repeats of one id. So a
    public caller's gap never shares an id, a status or a count with the vault's reports of
    the same question (made 4 times in the secret index before this test)."""
    report = GapReport(query=GAP_QUESTION, allowed_scopes=[PUBLIC], reason="no evidence")
    first = probe("gap", pair, lambda c: c.report_gap(report))
    assert first[1]["gap_id"] == gap_id_for(report)
    assert first[1]["status"] == "recorded" and first[1]["occurrences"] == 1
    vault_ids = {
        gap_id_for(dataclasses.replace(report, allowed_scopes=s))
        for s in ([VAULT], [PUBLIC, VAULT])
    }
    assert first[1]["gap_id"] not in vault_ids
    again = dataclasses.replace(
        report, query="  how do we RESTART aurora after the acquisition? ", requester="someone"
    )
    second = probe("gap", pair, lambda c: c.report_gap(again))
    assert second[1]["gap_id"] == first[1]["gap_id"]
    assert second[1]["status"] == "duplicate" and second[1]["occurrences"] == 2
    # scope order and duplicates are normalised; other scopes make another gap
    reordered = dataclasses.replace(report, allowed_scopes=[PUBLIC, PUBLIC])
    assert gap_id_for(reordered) == gap_id_for(report)
    for scopes in ([PUBLIC, "nobody"], ["nobody", PUBLIC]):
        other = dataclasses.replace(report, allowed_scopes=scopes)
        probe("gap", pair, lambda c, r=other: c.report_gap(r))


# -- error messages and details ---------------------------------------------------------

_DECOYS = {
    SECRET_OWNER: "decoy.owner.zz",
    SECRET_URI: "decoy://nowhere/plan.pdf",
    SECRET_ID: "decoy-id-0000",
    SECRET_WORD: "decoyword",
}

ERROR_PROBES: tuple[tuple[str, Callable[[Any, str], Any]], ...] = (
    ("unknown operator", lambda c, v: c.search(
        SearchQuery(query=v, allowed_scopes=[PUBLIC], filters={"owner": {"like": v}}))),
    ("unknown key source_uri", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"source_uri": v}))),
    ("unknown key title", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"title": v}))),
    ("list value", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"owner": [v]}))),
    ("string range", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC],
                    filters={"metadata.codename": {"gte": v}}))),
    ("malformed metadata key", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={f"metadata.{v}/": 1}))),
    ("bad top_k", lambda c, v: c.search(SearchQuery(query=v, allowed_scopes=[PUBLIC], top_k=0))),
    ("NUL pin", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], pinned_revisions={v: "\x00"}))),
    ("pin on own revision", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], pinned_revisions={v: v}))),
    ("empty target", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], targets=[v, ""]))),
    ("explain bad query", lambda c, v: c.explain(
        v, SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"owner": {"x": v}}))),
    ("explain", lambda c, v: c.explain(v, SearchQuery(query=v, allowed_scopes=[PUBLIC]))),
    ("explain with filter", lambda c, v: c.explain(
        v, SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"owner": v}))),
    ("get NUL id", lambda c, v: c.get_document(v + "\x00", [PUBLIC])),
    ("get", lambda c, v: c.get_document(v, [PUBLIC])),
    ("valid owner filter", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"owner": v}))),
    ("valid tag filter", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"tags": v}))),
    ("scope named like the secret", lambda c, v: c.search(
        SearchQuery(query="aurora", allowed_scopes=[v]))),
)  # fmt: skip


def test_errors_never_name_the_secret(pair: Pair) -> None:
    """An error depends on what was typed, never on whether it matches hidden data: the
    same probe with a decoy value gives the same answer, value for value."""
    for label, ask in ERROR_PROBES:
        for secret, decoy in _DECOYS.items():
            got = probe("error", pair, lambda c, a=ask, v=secret: a(c, v), (label, secret))
            alt = probe("error", pair, lambda c, a=ask, v=decoy: a(c, v), (label, decoy))
            assert as_json(got) == _swap(alt, decoy, secret), (label, secret)


# -- the tool gateway -------------------------------------------------------------------


def _tool(c: Any, name: str, args: dict[str, Any], scopes: Sequence[str] = (PUBLIC,)) -> Any:
    result = ToolGateway(c).call(name, args, ToolContext(allowed_scopes=list(scopes)))
    # text_of the JSON output, so the comparison is over exactly what the agent reads
    return {"is_error": result.is_error, "content": plain(json.loads(result.to_json()))}


def test_gateway_leaks_nothing(pair: Pair) -> None:
    for text in QUERIES:
        for extra in ({}, {"top_k": 20}, {"include_superseded": True}):
            args = {"query": text, **extra}
            got = probe("gateway", pair, lambda c, a=args: _tool(c, "context.search", a), args)
            assert not got[1]["is_error"]
    for secret_filter, nothing_filter in SECRET_ONLY_FILTERS:
        if "datetime" in repr(secret_filter):
            continue  # JSON cannot carry a datetime; the connector probes cover those
        a = probe("gateway", pair, lambda c, f=secret_filter: _tool(
            c, "context.search", {"query": "aurora", "filters": f}), secret_filter)  # fmt: skip
        b = probe("gateway", pair, lambda c, f=nothing_filter: _tool(
            c, "context.search", {"query": "aurora", "filters": f}), nothing_filter)  # fmt: skip
        assert a == b, secret_filter
    for secret_id in SECRET_IDS:
        secret = probe("gateway", pair, lambda c, i=secret_id: _tool(
            c, "context.get_document", {"doc_id": i}), secret_id)  # fmt: skip
        missing = probe("gateway", pair, lambda c: _tool(
            c, "context.get_document", {"doc_id": "no-such-doc"}))  # fmt: skip
        assert secret == missing
        assert secret[1]["content"]["error"]["code"] == "NOT_FOUND"

    # dedupe and quota treat a forbidden id like a missing one within a request
    def session(c: Any, doc_id: str) -> Any:
        gw, ctx = ToolGateway(c), ToolContext(allowed_scopes=[PUBLIC], quota=2)
        calls = [
            ("context.get_document", {"doc_id": doc_id}),
            ("context.get_document", {"doc_id": doc_id}),
            ("context.search", {"query": "aurora"}),
            ("context.get_document", {"doc_id": "pub-aurora"}),
            ("context.search", {"query": "basalt"}),
        ]
        return [plain(json.loads(gw.call(n, a, ctx).to_json())) for n, a in calls]

    for secret_id in SECRET_IDS:
        secret = probe("gateway", pair, lambda c, i=secret_id: session(c, i), secret_id)
        missing = probe("gateway", pair, lambda c: session(c, "no-such-doc"))
        assert _swap(secret, secret_id, "no-such-doc") == as_json(missing)
        codes = [r.get("error", {}).get("code") for r in secret[1]]
        assert codes == ["NOT_FOUND", "DUPLICATE_QUERY", None, None, "QUOTA_EXCEEDED"]
    # arguments cannot widen the scopes: allowed_scopes is not a tool argument
    widen = {"query": SECRET_WORD, "allowed_scopes": [VAULT]}
    widened = probe("gateway", pair, lambda c: _tool(c, "context.search", widen), SECRET_WORD)
    assert widened[1]["content"]["error"]["code"] == "INVALID_QUERY"
    gap = probe("gateway", pair, lambda c: _tool(
        c, "context.report_gap", {"query": "gateway gap", "reason": "gateway reason"}))  # fmt: skip
    assert gap[1]["content"]["status"] == "recorded"


# -- raw SQL as the reader role (PostgreSQL) --------------------------------------------

TABLES = (
    "documents",
    "chunks",
    "posting_blocks",
    "posting_tombstones",
    "postings",  # a view of the live postings, read with the reader's own rights
    "scope_stats",
    "index_jobs",
    "gaps",
    "index_configs",
    "alembic_version",
)
SCOPED_TABLES = (
    "documents",
    "chunks",
    "posting_blocks",
    "posting_tombstones",
    "postings",
    "scope_stats",
)


@contextmanager
def as_reader(pair: Pair, setting: str | None) -> Iterator[psycopg.Connection[Any]]:
    """A session that did exactly what the brief says an attacker with SQL would do."""
    assert pair.dsn is not None and pair.schema_with is not None
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{pair.schema_with}_reader")))
        if setting is not None:
            conn.execute(
                "SELECT set_config('context_search.allowed_scopes', %s, false)", (setting,)
            )
        yield conn


def run(conn: psycopg.Connection[Any], statement: sql.Composable | str, *params: Any) -> Any:
    """Rows of one statement, or the psycopg error it raised (each try is counted)."""
    PROBES["leak:raw-sql"] += 1
    try:
        cur = conn.execute(statement, params or None)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []
    except psycopg.Error as exc:
        return exc


def qualified(pair: Pair, table: str) -> sql.Composed:
    assert pair.schema_with is not None
    return sql.SQL("{}.{}").format(sql.Identifier(pair.schema_with), sql.Identifier(table))


def _analyze(pair: Pair) -> None:
    """Fresh planner statistics (as the owner), so pg_stats and reltuples are populated."""
    assert pair.dsn is not None
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(sql.SQL("ANALYZE {}").format(qualified(pair, table)))


@pg_only
def test_reader_role_sees_only_its_scope(pair: Pair) -> None:
    _analyze(pair)
    with as_reader(pair, "{public}") as conn:
        for table in TABLES:
            rows = run(conn, sql.SQL("SELECT * FROM {}").format(qualified(pair, table)))
            if table in ("gaps", "alembic_version"):
                # not granted to the reader at all: gaps name the scopes of every reporter
                assert isinstance(rows, psycopg.errors.InsufficientPrivilege), table
                continue
            assert not isinstance(rows, Exception), (table, rows)
            assert_no_markers([list(map(str, r)) for r in rows])
            assert "vault" not in text_of([list(map(str, r)) for r in rows])
        for table in SCOPED_TABLES:
            leaked = run(
                conn,
                sql.SQL("SELECT count(*) FROM {} WHERE permission_scope <> 'public'").format(
                    qualified(pair, table)
                ),
            )
            assert leaked == [(0,)], table
        visible = run(conn, sql.SQL("SELECT count(*) FROM {}").format(qualified(pair, "documents")))
        assert visible == [(len(PUBLIC_DOCS),)]
        for statement, params in (
            ("SELECT * FROM {} WHERE doc_id = %s", (SECRET_ID,)),
            ("SELECT * FROM {} WHERE title ILIKE %s", (f"%{SECRET_WORD}%",)),
            ("SELECT * FROM {} WHERE owner = %s OR source_uri = %s", (SECRET_OWNER, SECRET_URI)),
            ("SELECT * FROM {} WHERE metadata ? 'codename'", ()),
            ("SELECT * FROM {} WHERE lifecycle = 'deleted'", ()),
        ):
            rows = run(conn, sql.SQL(statement).format(qualified(pair, "documents")), *params)
            assert rows == [], statement
        for statement, table in (
            ("SELECT * FROM {} WHERE text LIKE '%%xylophonequasar%%'", "chunks"),
            ("SELECT * FROM {} WHERE tsv @@ to_tsquery('english', 'xylophonequasar')", "chunks"),
            ("SELECT * FROM {} WHERE lexeme = 'xylophonequasar'", "postings"),
            ("SELECT * FROM {} WHERE 'vault' = ANY(scopes)", "index_jobs"),
            ("SELECT * FROM {} WHERE payload::text LIKE '%%vault%%'", "index_jobs"),
        ):
            assert run(conn, sql.SQL(statement).format(qualified(pair, table))) == [], statement
        # COPY applies row-level security like SELECT does
        PROBES["leak:raw-sql"] += 1
        with (
            conn.cursor() as cur,
            cur.copy(sql.SQL("COPY {} TO STDOUT").format(qualified(pair, "documents"))) as copy,
        ):
            copied = b"".join(bytes(block) for block in copy).decode()
        assert SECRET_WORD not in copied and "vault" not in copied and "pub-aurora" in copied
        # planner statistics are hidden for tables whose RLS applies to the reader
        stats = run(
            conn,
            "SELECT tablename, attname, most_common_vals::text, histogram_bounds::text "
            "FROM pg_stats WHERE schemaname = %s",
            pair.schema_with,
        )
        assert not isinstance(stats, Exception)
        assert {r[0] for r in stats} <= {"index_configs"}
        assert_no_markers(stats)
        # no function runs with its owner's rights that a reader could call
        definer = run(
            conn,
            "SELECT proname FROM pg_proc WHERE prosecdef AND pronamespace = %s::regnamespace",
            pair.schema_with,
        )
        assert definer == []


@pg_only
def test_reader_role_cannot_write_or_switch_security_off(pair: Pair) -> None:
    assert pair.schema_with is not None and pair.dsn is not None
    docs = qualified(pair, "documents")
    reader = sql.Identifier(f"{pair.schema_with}_reader")
    attempts: list[sql.Composable] = [
        sql.SQL("INSERT INTO {} (doc_id) VALUES ('evil')").format(docs),
        sql.SQL("UPDATE {} SET permission_scope = 'public'").format(docs),
        sql.SQL("DELETE FROM {}").format(docs),
        sql.SQL("TRUNCATE {}").format(docs),
        sql.SQL("ALTER TABLE {} DISABLE ROW LEVEL SECURITY").format(docs),
        sql.SQL("DROP POLICY documents_scope_read ON {}").format(docs),
        sql.SQL("CREATE POLICY evil ON {} FOR SELECT USING (true)").format(docs),
        sql.SQL("CREATE TABLE {} (x int)").format(qualified(pair, "evil")),
        sql.SQL(
            "CREATE FUNCTION {}() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'"
        ).format(qualified(pair, "evil_fn")),
        sql.SQL("GRANT SELECT ON {} TO {}").format(qualified(pair, "gaps"), reader),
        sql.SQL("INSERT INTO {} (gap_id, query, reason) VALUES ('g', 'q', 'r')").format(
            qualified(pair, "gaps")
        ),
        sql.SQL("UPDATE {} SET scopes = '{{public}}'").format(qualified(pair, "index_jobs")),
        sql.SQL("DELETE FROM {}").format(qualified(pair, "chunks")),
        sql.SQL("UPDATE {} SET permission_scope = 'public'").format(
            qualified(pair, "posting_blocks")
        ),
        sql.SQL("UPDATE {} SET permission_scope = 'public'").format(qualified(pair, "postings")),
        sql.SQL("UPDATE {} SET active = false").format(qualified(pair, "index_configs")),
        sql.SQL("ALTER ROLE {} BYPASSRLS").format(reader),
        sql.SQL("CREATE ROLE cs_sec_evil"),
        sql.SQL("SELECT pg_read_file('/etc/passwd')"),
    ]
    before = _owner_counts(pair)
    with as_reader(pair, "{public}") as conn:
        for statement in attempts:
            outcome = run(conn, statement)
            assert isinstance(outcome, psycopg.Error), statement.as_string(conn)
        PROBES["leak:raw-sql"] += 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.cursor() as cur:
            with cur.copy(sql.SQL("COPY {} (doc_id) FROM STDIN").format(docs)) as copy:
                copy.write_row(["evil"])
        # switching RLS off for the session makes protected queries fail, not leak
        assert run(conn, "SET row_security = off") == []
        outcome = run(conn, sql.SQL("SELECT * FROM {}").format(docs))
        assert isinstance(outcome, psycopg.errors.InsufficientPrivilege)
    assert _owner_counts(pair) == before


def _owner_counts(pair: Pair) -> dict[str, int]:
    assert pair.dsn is not None
    with psycopg.connect(pair.dsn, autocommit=True) as conn:
        counts = {}
        for table in TABLES:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(qualified(pair, table)))
            counts[table] = int(row.fetchone()[0])  # type: ignore[index]
        rls = conn.execute(
            "SELECT bool_and(relrowsecurity) FROM pg_class WHERE relnamespace = %s::regnamespace "
            "AND relname = ANY(%s) AND relkind <> 'v'",
            (pair.schema_with, [*SCOPED_TABLES, "index_jobs"]),
        ).fetchone()
        assert rls == (True,)
        return counts


@pytest.mark.parametrize(
    "setting",
    [None, "", "{}", "{NULL}", '{""}', "{%}", "{*}", "{_ublic}", '{"public vault"}', "{PUBLIC}"],
)
@pg_reads
def test_reader_without_a_matching_setting_sees_nothing(pair: Pair, setting: str | None) -> None:
    with as_reader(pair, setting) as conn:
        for table in (*SCOPED_TABLES, "index_jobs"):
            rows = run(conn, sql.SQL("SELECT count(*) FROM {}").format(qualified(pair, table)))
            assert rows == [(0,)], (setting, table)


@pytest.mark.parametrize(
    "setting",
    ["public", "{public", "public}' OR '1'='1", "{public}} OR true", "public,vault"],
)
@pg_reads
def test_reader_with_a_malformed_setting_fails_closed(pair: Pair, setting: str) -> None:
    with as_reader(pair, setting) as conn:
        for table in (*SCOPED_TABLES, "index_jobs"):
            rows = run(conn, sql.SQL("SELECT * FROM {}").format(qualified(pair, table)))
            assert isinstance(rows, psycopg.Error), (setting, table, rows)


@pg_reads
def test_transaction_local_setting_does_not_outlive_its_transaction(pair: Pair) -> None:
    """The connector sets scopes with ``set_config(..., true)``: they die with the
    transaction, so a pooled connection never carries one caller's scopes to the next."""
    with as_reader(pair, None) as conn:
        assert run(
            conn, "SELECT set_config('context_search.allowed_scopes', '{public,vault}', true)"
        )
        rows = run(conn, sql.SQL("SELECT count(*) FROM {}").format(qualified(pair, "documents")))
        assert rows == [(0,)]


@pg_only
def test_documented_escape_hatches_of_raw_sql(pair: Pair) -> None:
    """What raw SQL on the application's connection can do, by design. None of it is
    reachable through the library's API (scopes are validated and set by the connector, the
    role is set per transaction and SQL text is fixed), which is exactly why an application
    must never let callers run SQL of their own on these connections:

    1. the reader role *trusts* ``context_search.allowed_scopes``: a session that can call
       ``set_config`` widens its own scopes to anything;
    2. ``SET ROLE`` can be undone: ``RESET ROLE`` (or ``SET ROLE <session user>``) returns
       to the login role, which owns the tables (or is a superuser) and bypasses RLS — also
       inside the connector's own ``SET LOCAL ROLE`` transactions;
    3. catalogs readable by every role expose table sizes: after ANALYZE,
       ``pg_class.reltuples`` counts the rows of every scope (a count, never content).
    """
    _analyze(pair)
    docs = qualified(pair, "documents")
    count_vault = sql.SQL("SELECT count(*) FROM {} WHERE permission_scope = 'vault'").format(docs)
    with as_reader(pair, "{public,vault}") as conn:  # 1.
        assert run(conn, count_vault) != [(0,)]
    with as_reader(pair, "{public}") as conn:  # 2.
        assert run(conn, count_vault) == [(0,)]
        assert run(conn, "RESET ROLE") == []
        assert run(conn, "SELECT current_user = session_user") == [(True,)]
        assert run(conn, count_vault) != [(0,)]
    with as_reader(pair, "{public}") as conn:
        assert run(conn, "SET ROLE NONE") == []
        assert run(conn, count_vault) != [(0,)]
    assert pair.dsn is not None and pair.schema_with is not None
    with psycopg.connect(pair.dsn) as conn:  # the connector's transaction pattern
        conn.execute(
            sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(f"{pair.schema_with}_reader"))
        )
        conn.execute("SELECT set_config('context_search.allowed_scopes', '{public}', true)")
        assert run(conn, count_vault) == [(0,)]
        assert run(conn, "RESET ROLE") == []
        assert run(conn, count_vault) != [(0,)]
    with as_reader(pair, "{public}") as conn:  # 3.
        visible = run(conn, sql.SQL("SELECT count(*) FROM {}").format(docs))
        estimate = run(conn, "SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                       f"{pair.schema_with}.documents")  # fmt: skip
        assert visible == [(len(PUBLIC_DOCS),)]
        assert estimate == [(float(len(PUBLIC_DOCS) + len(SECRETS) + 1),)]


def test_regression_memory_bm25_statistics_shrink_to_the_targets(
    request: pytest.FixtureRequest, pair: Pair
) -> None:
    """Both connectors document BM25 statistics as computed over everything the caller may
    see; the reference connector computes them over the targets only, so a target search
    scores (and reveals the statistics of) a different collection than PostgreSQL does."""
    PROBES["leak:stats"] += 1

    def lexical(c: Any, targets: list[str] | None) -> float | None:
        query = SearchQuery(query="aurora", allowed_scopes=[PUBLIC], targets=targets)
        hit = next(h for h in c.search(query).hits if h.doc_id == "pub-aurora")
        return hit.score_parts.lexical_score

    assert lexical(pair.without, ["pub-aurora"]) == lexical(pair.without, None)


# -- leaks found by this suite, fixed (regressions) ---------------------------------


@contextmanager
def fresh(request: pytest.FixtureRequest, backend: str) -> Iterator[Any]:
    if backend in ("memory", "sqlite"):
        with fresh_connector(request, backend) as store:
            yield store
        return
    dsn: str = request.getfixturevalue("context_search_dsn")
    schema: str = request.getfixturevalue("schema_factory")()
    with PostgresSearchConnector.open(dsn, embedder=HashingEmbedder(), schema=schema) as store:
        yield store


@pytest.mark.parametrize("backend", ["memory", "postgres", "sqlite"])
def test_regression_superseded_by_names_an_invisible_successor(
    request: pytest.FixtureRequest, backend: str
) -> None:
    with fresh(request, backend) as c:
        c.upsert([PUBLIC_DOCS[0]])
        c.upsert(
            [dataclasses.replace(SECRET, supersedes=(PUBLIC_DOCS[0].document_id,), metadata={})]
        )
        PROBES["leak:superseded_by"] += 1
        doc = c.get_document(PUBLIC_DOCS[0].document_id, [PUBLIC])
        assert doc is not None  # still readable (superseded), which is fine
        assert_no_markers(plain(doc))


@pytest.mark.parametrize("backend", ["memory", "postgres", "sqlite"])
def test_regression_gateway_error_quotes_stored_metadata(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """A number no double holds is refused at ingestion on every backend, nothing written;
    on PostgreSQL one planted past validation (an older writer, a manual fix) makes the
    filter's cast fail, and the gateway's error still does not quote the stored value."""
    with fresh(request, backend) as c:
        value = 10**400 + 4242
        rec = ContextDocumentRecord(
            document_id="pub-huge", body="huge number", permission_scope=PUBLIC,
            metadata={"n": value},
        )  # fmt: skip
        with pytest.raises(ContextSearchError) as refused:
            c.upsert([rec])
        assert refused.value.code == "INVALID_RECORD"
        assert c.get_document("pub-huge", [PUBLIC]) is None
        if backend != "postgres":
            return
        c.upsert([dataclasses.replace(rec, metadata={"n": 1})])
        with psycopg.connect(request.getfixturevalue("context_search_dsn")) as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {}.documents SET metadata = jsonb_set(metadata, '{{n}}', "
                    "CAST(%s AS jsonb)) WHERE doc_id = 'pub-huge'"
                ).format(sql.Identifier(c.schema)),
                (str(value),),
            )
        PROBES["leak:gateway-error"] += 1
        result = ToolGateway(c).call(
            "context.search",
            {"query": "huge", "filters": {"metadata.n": {"gte": 0}}},
            ToolContext(allowed_scopes=[PUBLIC]),
        )
        assert result.is_error and result.content["error"]["code"] == "BACKEND_ERROR"
        assert str(value)[-30:] not in result.to_json()

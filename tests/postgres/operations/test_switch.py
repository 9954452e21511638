"""A model or chunking change is built beside the active configuration and switched to in one
transaction: searches answer from the old configuration (their evidence naming the new one)
until the swap, writes made meanwhile are carried over, an old connector gets a typed error
afterwards instead of mixing two models, and an interrupted build resumes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations import swap, switch
from context_search.postgres.operations.audit import audit
from context_search.postgres.operations.switch import (
    sibling_names,
    switch_configuration,
    switch_status,
)

OLD, NEW = HashingEmbedder(384), HashingEmbedder(256)


def _doc(i: int, scope: str = "team", **kw: Any) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        **{
            "document_id": f"d{i:05d}",
            "title": f"Turbine note {i}",
            "body": f"Zephyr turbine {i} restarts after a bearing fault. "
            + " ".join(f"clause{k}" for k in range(i % 40)),
            "permission_scope": scope,
            **kw,
        }
    )


def _q(text: str, *scopes: str) -> SearchQuery:
    return SearchQuery(query=text, allowed_scopes=list(scopes or ("team",)), top_k=10)


@pytest.fixture
def live(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=OLD, schema=context_search_schema
    ) as connector:
        connector.upsert([_doc(i, "team" if i % 2 else "ops") for i in range(40)])
        yield connector


def _switch(store: PostgresSearchConnector, **kw: Any) -> switch.SwitchReport | None:
    return switch_configuration(
        store.engine,
        schema=store.schema,
        embedder=NEW,
        chunk_bytes=1200,
        chunk_overlap=200,
        text_search_config="english",
        **kw,
    )


def _rows(dsn: str, query: sql.Composable | str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_old_configuration_answers_until_the_swap_and_writes_made_meanwhile_carry_over(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    old_config = live.search(_q("turbine")).evidence.config_revision
    seen: list[tuple[str, str | None, int]] = []
    progress: list[tuple[int, int]] = []

    def during(indexed: int, total: int) -> None:
        progress.append((indexed, total))
        if len(progress) == 1:  # writes while the new configuration is being built
            live.upsert([_doc(900, body="Aurora compressor manual for the night shift.")])
            assert live.delete_or_supersede("d00003")
            assert live.rescope("d00005", "ops")
            status = switch_status(live.engine, context_search_schema)
            assert status is not None and status.total >= 39
        answer = live.search(_q("turbine bearing"))
        evidence = answer.evidence
        seen.append((evidence.config_revision, evidence.pending_config_revision, len(answer.hits)))

    report = _switch(live, progress=during)
    assert report is not None and report.from_config == old_config
    assert report.documents == 41 and report.caught_up >= 3
    # Every answer during the build came from the old configuration, named the new one.
    assert seen and {s[:2] for s in seen} == {(old_config, report.to_config)}
    assert all(n == 10 for *_, n in seen)
    assert progress[-1][0] == progress[-1][1] == 40  # 41 documents, one deleted
    # The old connector's query vectors belong to the other model: a typed error, not hits.
    with pytest.raises(RetrieverUnconfiguredError):
        live.search(_q("turbine"))
    with pytest.raises(RetrieverUnconfiguredError):
        live.upsert([_doc(901)])
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=NEW, schema=context_search_schema
    ) as switched:
        answer = switched.search(_q("aurora compressor", "team"))
        assert answer.evidence.config_revision == report.to_config
        assert answer.evidence.pending_config_revision is None
        assert answer.hits[0].doc_id == "d00900"
        assert {d.freshness for d in answer.evidence.documents} == {"fresh"}
        team = {h.doc_id for h in switched.search(_q("turbine 5 bearing", "team")).hits}
        ops = {h.doc_id for h in switched.search(_q("turbine 5 bearing", "ops")).hits}
        assert "d00005" not in team and "d00005" in ops and "d00003" not in team
        assert audit(switched.engine).consistent
        switched.upsert([_doc(902)])  # the new configuration takes writes
        assert switched.get_document("d00902", ["team"]).doc_id == "d00902"
    shadow, retired = sibling_names(context_search_schema)
    assert not _rows(
        context_search_dsn,
        "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
        [shadow, retired],
    )
    assert not _rows(
        context_search_dsn, "SELECT 1 FROM pg_roles WHERE rolname = %s", f"{shadow}_reader"
    )


def test_row_level_security_holds_on_the_switched_schema(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    assert _switch(live) is not None
    reader = sql.Identifier(f"{context_search_schema}_reader")
    with psycopg.connect(context_search_dsn) as conn:
        conn.execute(
            sql.SQL("SET search_path = {}, public").format(sql.Identifier(context_search_schema))
        )
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(reader))
        conn.execute("SELECT set_config('context_search.allowed_scopes', '{ops}', true)")
        scopes = {r[0] for r in conn.execute("SELECT DISTINCT permission_scope FROM chunks")}
        postings = {r[0] for r in conn.execute("SELECT DISTINCT permission_scope FROM postings")}
        docs = conn.execute("SELECT count(*) FROM documents").fetchone()
    assert scopes == postings == {"ops"} and docs == (20,)


def test_statistics_triggers_follow_the_schema_rename(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    """The term statistics' trigger function names its table with the schema it was
    created in; after the swap it must write the live schema's table."""
    _switch(live)
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=NEW, schema=context_search_schema
    ) as switched:
        switched.upsert([_doc(950, body="Quasar flange torque values.")])
        assert audit(switched.engine).consistent
        hit = switched.search(_q("quasar flange")).hits[0]
        assert hit.doc_id == "d00950"


def test_open_with_reconfigure_switches_and_going_back_reuses_the_revision(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    before = live.search(_q("turbine")).evidence.config_revision
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=OLD,
        schema=context_search_schema,
        chunk_bytes=600,
        reconfigure=True,
    ) as smaller:
        evidence = smaller.search(_q("turbine")).evidence
        assert evidence.config_revision != before
        assert {d.freshness for d in evidence.documents} == {"fresh"}
        revision = smaller.index_settings.revision
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=OLD, schema=context_search_schema, reconfigure=True
    ) as back:
        assert back.search(_q("turbine")).evidence.config_revision == before
        assert back.index_settings.revision < revision
        assert _switch(back) is not None  # and on to another model
        assert _switch(back) is None  # already active: nothing to do


def test_an_interrupted_build_keeps_the_old_configuration_and_resumes(
    context_search_dsn: str,
    context_search_schema: str,
    live: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_config = live.search(_q("turbine")).evidence.config_revision

    def fail(*_a: Any, **_k: Any) -> int:
        raise RuntimeError("killed before the swap")

    monkeypatch.setattr(switch, "swap_schemas", fail)
    with pytest.raises(RuntimeError):
        _switch(live)
    evidence = live.search(_q("turbine")).evidence
    assert evidence.config_revision == old_config and evidence.pending_config_revision
    status = switch_status(live.engine, context_search_schema)
    assert status is not None and status.indexed == status.total == 40
    assert status.eta_seconds == 0
    live.upsert([_doc(960, body="Nebula valve checklist.")])
    monkeypatch.setattr(switch, "swap_schemas", swap.swap_schemas)
    report = _switch(live)
    assert report is not None and report.documents == 41 and report.caught_up == 1
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=NEW, schema=context_search_schema
    ) as switched:
        assert switched.search(_q("nebula valve")).hits[0].doc_id == "d00960"
    assert switch_status(live.engine, context_search_schema) is None


class _Killed(BaseException):
    """The process dying mid-load: not an error the worker may catch and record."""


class _Recording(HashingEmbedder):
    """``NEW``'s vectors; records which documents it embedded and can die after a while."""

    def __init__(self, die_after_calls: int | None = None) -> None:
        super().__init__(256)
        self.die_after_calls = die_after_calls
        self.calls = 0
        self.docs: set[str] = set()

    def embed_documents(self, texts: Any) -> Any:
        if self.die_after_calls is not None and self.calls >= self.die_after_calls:
            raise _Killed
        self.calls += 1
        self.docs.update(re.findall(r"Zephyr turbine (\d+) ", " ".join(texts)))
        return super().embed_documents(texts)


def test_a_build_killed_mid_load_resumes_from_the_half_built_sibling(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    """Killed after two batches of the new schema's indexing: the old configuration keeps
    answering, and the next switch goes on from the sibling schema, embedding only the
    documents it had not indexed yet."""
    old_config = live.search(_q("turbine")).evidence.config_revision
    shadow, _ = sibling_names(context_search_schema)

    def run(embedder: _Recording) -> switch.SwitchReport | None:
        return switch_configuration(
            live.engine,
            schema=live.schema,
            embedder=embedder,
            chunk_bytes=1200,
            chunk_overlap=200,
            text_search_config="english",
            batch_size=8,
        )

    dying = _Recording(die_after_calls=2)
    with pytest.raises(_Killed):
        run(dying)
    assert live.search(_q("turbine")).evidence.config_revision == old_config
    built = {
        str(int(r[0][1:]))
        for r in _rows(
            context_search_dsn,
            sql.SQL("SELECT doc_id FROM {} WHERE indexed_config_revision IS NOT NULL").format(
                sql.Identifier(shadow, "documents")
            ),
        )
    }
    assert built and len(built) < 40 and built <= dying.docs  # half built
    # The killed process's claimed jobs are still leased (300 s by default): the resumed
    # build holds the build lock, so it takes them over at once instead of failing.
    assert _rows(
        context_search_dsn,
        sql.SQL("SELECT job_id FROM {} WHERE status = 'running'").format(
            sql.Identifier(shadow, "index_jobs")
        ),
    )
    resumed = _Recording()
    report = run(resumed)
    assert report is not None and report.documents == 40
    assert resumed.docs == {str(i) for i in range(40)} - built  # only what was missing
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=NEW, schema=context_search_schema
    ) as switched:
        assert switched.search(_q("turbine 7")).hits


def test_a_second_switch_of_the_same_index_is_refused_while_one_runs(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    refused: list[str] = []

    def during(_i: int, _t: int) -> None:
        if not refused:
            with pytest.raises(RetrieverUnconfiguredError) as caught:
                _switch(live)
            refused.append(str(caught.value.details["reason"]))

    _switch(live, progress=during)
    assert refused == ["switch_in_progress"]


def test_a_worker_of_the_old_configuration_stops_without_failing_jobs(
    context_search_dsn: str,
    context_search_schema: str,
    live: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_worker = live.worker()
    _switch(live)
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=NEW, schema=context_search_schema
    ) as switched:
        switched.upsert([_doc(970, body="Pulsar gasket spec.")], defer_indexing=True)
        # Past its start-of-drain check (as if the swap landed mid-drain), the gate stops it.
        monkeypatch.setattr(old_worker, "_check_config", lambda: None)
        with pytest.raises(RetrieverUnconfiguredError):
            old_worker.drain()
        rows = _rows(
            context_search_dsn,
            sql.SQL("SELECT status, last_error FROM {} WHERE doc_id = 'd00970'").format(
                sql.Identifier(context_search_schema, "index_jobs")
            ),
        )
        assert rows and all(status != "failed" and error is None for status, error in rows)


def test_writers_wait_at_the_gate_the_switch_closes(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    """The switch and the writers compute the gate's key on two sides: they must agree, or
    a writer could slip into the retired schema during the swap."""
    import threading

    from context_search.postgres.write.gate import GATE, lock_key

    finished = threading.Event()
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        key = lock_key(conn, context_search_schema, GATE)
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        writer = threading.Thread(
            target=lambda: (live.upsert([_doc(980)]), finished.set()), daemon=True
        )
        writer.start()
        assert not finished.wait(1.0)  # held at the gate
        results = live.search(_q("turbine"))  # searches do not wait
        assert len(results.hits) == 10
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    assert finished.wait(10.0)
    writer.join()
    assert live.get_document("d00980", ["team"]) is not None


def test_the_swap_waits_for_a_merge_round_in_progress(
    context_search_dsn: str, context_search_schema: str, live: PostgresSearchConnector
) -> None:
    """A merge round holds row locks in the index while the swap, behind the write gate,
    renames schemas and rewrites grants: the swap takes the round's lock first, so it waits
    for the round instead of meeting it in a lock cycle (the server would fail the switch)."""
    import threading
    import time

    from context_search.postgres.engine.drivers import lock_key
    from context_search.postgres.indexes.blocks import MERGE_LOCK

    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(_switch(live))
        except BaseException as exc:
            outcome.append(exc)

    with psycopg.connect(context_search_dsn) as round_:
        round_.execute(
            sql.SQL("SET search_path = {}, public").format(sql.Identifier(context_search_schema))
        )
        # The key as a merge computes it: from the schema its connection resolves.
        schema = round_.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        key = lock_key(round_, schema[0], MERGE_LOCK)
        round_.execute("SELECT pg_advisory_xact_lock(%s)", (key,))  # a round in progress
        switching = threading.Thread(target=run, daemon=True)
        switching.start()
        waited = False
        deadline = time.monotonic() + 60
        while not waited and switching.is_alive() and time.monotonic() < deadline:
            waited = round_.execute(
                "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1)",
                ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            ).fetchone() == (True,)
            time.sleep(0.05)
        still_running = switching.is_alive()
        round_.commit()  # the round ends: the swap goes on (also when the check failed)
    switching.join(60)
    assert waited and still_running, f"the swap did not wait for the merge round: {outcome}"
    assert len(outcome) == 1 and isinstance(outcome[0], switch.SwitchReport), outcome
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=NEW, schema=context_search_schema
    ) as switched:
        assert len(switched.search(_q("turbine")).hits) == 10
        assert audit(switched.engine).consistent

"""What one event loop changes for the async connector, shown by order rather than by time:
searches are in flight together (the server sees them all waiting at once), and writes that
embed take turns while reads go on (a write held inside its model call blocks neither a
search nor the loop, and the next write starts embedding only after it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import sql

from context_search import HashingEmbedder
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.embedding import Vector
from context_search.postgres import AsyncPostgresSearchConnector


def _doc(doc_id: str, word: str) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id=doc_id, body=f"release notes about {word}", permission_scope="team"
    )


def _query(word: str) -> SearchQuery:
    return SearchQuery(query=word, allowed_scopes=["team"], top_k=1)


def _in_own_thread(main: object, seconds: float = 90.0) -> None:
    """Run the coroutine on a loop in a daemon thread: a loop that deadlocks fails the test
    instead of hanging it."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(main)  # type: ignore[arg-type]
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the event loop is stuck"
    if failure:
        raise failure[0]


@contextmanager
def _chunks_locked(dsn: str, schema: str) -> Iterator[None]:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema, "chunks")
            )
        )
        yield
        conn.rollback()


def _blocked(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND wait_event_type = 'Lock' AND application_name = 'context-search'"
        ).fetchone()
    return 0 if row is None else int(row[0])


def test_searches_are_in_flight_together_on_one_loop(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """Three searches started while ``chunks`` is locked are all seen waiting on the server
    at the same moment (one loop, one thread), then each gets its own answer."""
    dsn = context_search_dsn

    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            dsn, schema=context_search_schema, embedder=HashingEmbedder()
        ) as c:
            words = ("alpha", "bravo", "charlie")
            await c.upsert([_doc(f"doc-{w}", w) for w in words])
            with _chunks_locked(dsn, context_search_schema):
                tasks = [asyncio.create_task(c.search(_query(w))) for w in words]
                deadline = time.monotonic() + 30
                while await asyncio.to_thread(_blocked, dsn) < len(words):
                    assert time.monotonic() < deadline, "the searches never waited together"
                    assert not any(t.done() for t in tasks)
                    await asyncio.sleep(0.02)
            answers = await asyncio.gather(*tasks)
            assert [r.hits[0].doc_id for r in answers] == [f"doc-{w}" for w in words]

    _in_own_thread(main())


class _GatedEmbedder(HashingEmbedder):
    """Document embeddings wait for ``gate``; records who was inside and how many at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered: list[str] = []
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        with self._lock:
            self.entered.append(texts[0])
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            assert self.gate.wait(60), "the gate was never opened"
            return super().embed_documents(texts)
        finally:
            with self._lock:
                self.inside -= 1


def test_writes_that_embed_take_turns_and_reads_never_wait(
    context_search_dsn: str, context_search_schema: str
) -> None:
    embedder = _GatedEmbedder()

    async def until(condition: object) -> None:
        deadline = time.monotonic() + 30
        while not condition():  # type: ignore[operator]
            assert time.monotonic() < deadline, "condition not reached"
            await asyncio.sleep(0.01)

    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            context_search_dsn, schema=context_search_schema, embedder=embedder
        ) as c:
            await c.upsert([_doc("seed", "seedling")])
            embedder.gate.clear()
            embedder.entered.clear()
            first = asyncio.create_task(c.upsert([_doc("first", "firstword")]))
            await until(lambda: len(embedder.entered) == 1)
            second = asyncio.create_task(c.upsert([_doc("second", "secondword")]))
            # The first write is inside its model call, holding the turn: a search answers.
            resp = await asyncio.wait_for(c.search(_query("seedling")), 20)
            assert [h.doc_id for h in resp.hits] == ["seed"]
            assert await c.get_document("seed", ["team"]) is not None
            await asyncio.sleep(0.2)  # the second write has had its chance to start
            assert len(embedder.entered) == 1 and not second.done()
            embedder.gate.set()
            await asyncio.gather(first, second)
            assert [t.split()[-1] for t in embedder.entered] == ["firstword", "secondword"]
            assert embedder.most_inside == 1

    _in_own_thread(main())

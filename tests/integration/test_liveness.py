"""The pool's liveness check on real connections: silent for a quiet one, a round trip when
the server has spoken, and a refusal for a terminated backend."""

from __future__ import annotations

import asyncio
import os
import select
import tempfile
import time

import psycopg
import pytest

from context_search.postgres.liveness import check_async_connection, check_connection


def _traced(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[int, str]:
    handle, path = tempfile.mkstemp()
    conn.pgconn.trace(handle)
    return handle, path


def _sent(conn: psycopg.Connection[tuple[object, ...]], handle: int, path: str) -> str:
    """What the client sent while traced (libpq's protocol trace)."""
    conn.pgconn.untrace()
    os.close(handle)
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    return text


def _wait_readable(conn: psycopg.Connection[tuple[object, ...]], timeout: float = 5.0) -> None:
    readable, _, _ = select.select([conn.fileno()], [], [], timeout)
    assert readable, "the server never spoke"


def test_a_quiet_connection_is_checked_without_a_round_trip(context_search_dsn: str) -> None:
    with psycopg.connect(context_search_dsn) as conn:
        conn.execute("SELECT 1").fetchone()
        conn.commit()
        handle, path = _traced(conn)
        check_connection(conn)
        assert _sent(conn, handle, path) == ""


def test_a_connection_the_server_spoke_to_gets_the_full_check(context_search_dsn: str) -> None:
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        conn.execute("LISTEN cs_liveness")
        with psycopg.connect(context_search_dsn, autocommit=True) as other:
            other.execute("NOTIFY cs_liveness")
        _wait_readable(conn)
        handle, path = _traced(conn)
        check_connection(conn)  # healthy: the empty query succeeds
        assert "Query" in _sent(conn, handle, path)


def test_a_terminated_backend_fails_the_check(context_search_dsn: str) -> None:
    with psycopg.connect(context_search_dsn) as conn:
        pid = conn.info.backend_pid
        conn.commit()
        with psycopg.connect(context_search_dsn, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _wait_readable(conn)
        with pytest.raises(psycopg.OperationalError):
            check_connection(conn)


def test_the_async_check_refuses_a_terminated_backend(context_search_dsn: str) -> None:
    async def run() -> None:
        conn = await psycopg.AsyncConnection.connect(context_search_dsn)
        try:
            await check_async_connection(conn)  # quiet: passes
            with psycopg.connect(context_search_dsn, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    await check_async_connection(conn)
                except psycopg.OperationalError:
                    return
                await asyncio.sleep(0.05)
            pytest.fail("a terminated backend passed the check")
        finally:
            await conn.close()

    asyncio.run(run())

"""Is a pooled connection still alive? Answered without a round trip when it can be.

The pool checks every connection it hands out. psycopg_pool's own check
(``check_connection``) sends an empty query: a full round trip on every checkout, one of the
five a search made. An idle connection, though, receives nothing from the server unless
something happened to it: a terminated backend (``pg_terminate_backend``, a shutdown, an
idle-session time limit) sends its FATAL error before closing, a crashed server or a reset
network closes the socket. Either way the socket becomes readable. So the checks below poll
the socket without waiting and fall back to the empty query only when it has something to
say (a notice or a notification on a healthy connection costs that one round trip; a dead
one fails it and the pool replaces the connection).

What no client-side check can see without a round trip, a peer that vanished without a word
(host down, network cut), is what the connection's TCP keepalives are for; the empty query
would hang on it the same way.
"""

from __future__ import annotations

import select
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = ["check_async_connection", "check_connection"]


def _quiet(conn: Any) -> bool:
    """True when ``conn`` is open and the server has sent nothing since its last reply."""
    if conn.closed or conn.broken:
        return False
    fd = conn.fileno()
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    readable, _, failed = select.select([fd], [], [fd], 0)
    return not readable and not failed


def check_connection(conn: Any) -> None:
    """``ConnectionPool``'s ``check``: raises when ``conn`` is no longer usable."""
    if not _quiet(conn):
        ConnectionPool.check_connection(conn)


async def check_async_connection(conn: Any) -> None:
    """``AsyncConnectionPool``'s ``check``: raises when ``conn`` is no longer usable."""
    if not _quiet(conn):
        await AsyncConnectionPool.check_connection(conn)

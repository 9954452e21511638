"""Waiting between attempts without stalling an event loop.

The async connector runs the shared code on the event loop's thread, inside SQLAlchemy's
greenlet bridge: a ``time.sleep`` there would stop every other request the loop serves.
Inside that bridge the loop awaits ``asyncio.sleep`` instead; anywhere else the thread
sleeps.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import TypeVar

from psycopg.errors import LockNotAvailable
from sqlalchemy.util import await_
from sqlalchemy.util.concurrency import in_greenlet

__all__ = ["give_way", "pause"]

T = TypeVar("T")


def pause(seconds: float) -> None:
    """Sleep ``seconds``: on the loop inside an async call, in the thread otherwise."""
    if in_greenlet():
        await_(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def give_way(attempt: Callable[[], T], *, attempts: int, pause_s: float = 0.5) -> T:
    """Run ``attempt`` (one transaction that waits a bounded time for a lock on the tables)
    up to ``attempts`` times while it raises ``LockNotAvailable``, pausing in between. A
    statement waiting for an exclusive lock queues every search that arrives behind it: it
    gives up its place, the queued searches run, and it tries again. The last attempt's
    ``LockNotAvailable`` is raised."""
    for _ in range(attempts - 1):
        try:
            return attempt()
        except LockNotAvailable:
            pause(pause_s * random.uniform(0.5, 1.5))
    return attempt()

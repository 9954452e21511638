"""Waiting between attempts without stalling an event loop.

The async connector runs the shared code on the event loop's thread, inside SQLAlchemy's
greenlet bridge: a ``time.sleep`` there would stop every other request the loop serves.
Inside that bridge the loop awaits ``asyncio.sleep`` instead; anywhere else the thread
sleeps.
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy.util import await_
from sqlalchemy.util.concurrency import in_greenlet

__all__ = ["pause"]


def pause(seconds: float) -> None:
    """Sleep ``seconds``: on the loop inside an async call, in the thread otherwise."""
    if in_greenlet():
        await_(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)

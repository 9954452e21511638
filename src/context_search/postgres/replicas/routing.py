"""Which server serves a read: the decisions of the read/write split, without any I/O.

The driver side (:mod:`context_search.postgres.replicas.routed`) asks :class:`Router` for the
order in which to try servers, reports what it observed (a replica's replay position and
lag, a failure), and asks :func:`consistency_step` what to do about a commit token. Keeping
the decisions here, as plain functions of observations and a clock reading, lets a sync
and an async driver share them and lets tests drive every branch without a server.

Policy
    A replica is *down* after a failure for ``retry_after_s`` (doubling per consecutive
    failure, at most ``max_retry_after_s``), then tried again by the next read. Healthy
    replicas whose last observed lag is within ``max_lag_s`` are preferred, least lagging
    first with lag compared in steps of ``lag_step_s`` (so replicas that are all nearly
    current share the load, taken in turn); the primary comes after them when
    ``fallback_to_primary``. Replicas lagging more than ``max_lag_s`` are used only when
    nothing else is left. A read that names a commit token waits, at most
    ``consistency_wait_s`` for the whole call, for a replica to replay it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from context_search.postgres.settings import ReplicaSettings

__all__ = [
    "PRIMARY",
    "Router",
    "Step",
    "consistency_step",
]

#: The name the router gives the primary among its candidates.
PRIMARY = "primary"

Step = Literal["serve", "wait", "next"]


@dataclass
class _State:
    down_until: float = 0.0
    failures: int = 0
    lag_s: float | None = None


class Router:
    """Health and lag of each replica, and the order of servers for the next read.

    Thread-safe; ``now`` is a monotonic clock reading supplied by the caller.
    """

    def __init__(self, replicas: tuple[str, ...], settings: ReplicaSettings) -> None:
        self._settings = settings
        self._names = replicas
        self._states = {name: _State() for name in replicas}
        self._turn = 0
        self._lock = threading.Lock()

    @property
    def replicas(self) -> tuple[str, ...]:
        return self._names

    def candidates(self, now: float) -> list[str]:
        """Servers to try, in order: :data:`PRIMARY` names the primary."""
        s = self._settings
        with self._lock:
            self._turn += 1
            turn = self._turn
            states = dict(self._states)
        n = len(self._names)
        up = [(i, name) for i, name in enumerate(self._names) if states[name].down_until <= now]
        near = [(i, name) for i, name in up if (states[name].lag_s or 0.0) <= s.max_lag_s]
        far = [name for i, name in up if (states[name].lag_s or 0.0) > s.max_lag_s]
        near.sort(
            key=lambda p: (int((states[p[1]].lag_s or 0.0) // s.lag_step_s), (p[0] - turn) % n)
        )
        order = [name for _, name in near]
        if s.fallback_to_primary:
            return [*order, PRIMARY]
        far.sort(key=lambda name: states[name].lag_s or 0.0)
        return [*order, *far]

    def observed(self, name: str, lag_s: float) -> None:
        """A replica answered: healthy, ``lag_s`` behind its primary."""
        with self._lock:
            self._states[name] = _State(lag_s=lag_s)

    def failed(self, name: str, now: float) -> None:
        """A replica failed (unreachable, no longer a standby, or the read broke off)."""
        s = self._settings
        with self._lock:
            state = self._states[name]
            failures = state.failures + 1
            pause = min(s.retry_after_s * 2 ** (failures - 1), s.max_retry_after_s)
            self._states[name] = _State(
                down_until=now + pause, failures=failures, lag_s=state.lag_s
            )

    def is_down(self, name: str, now: float) -> bool:
        with self._lock:
            return self._states[name].down_until > now


def consistency_step(
    replayed: int, token: int | None, *, waited_s: float, budget_s: float, poll_s: float
) -> Step:
    """What a read does on a replica that has replayed up to ``replayed``: ``serve`` once it
    covers ``token``; ``wait`` (then observe again) while the call's budget lasts; ``next``
    (try the next server) when the budget would be exceeded."""
    if token is None or replayed >= token:
        return "serve"
    return "wait" if waited_s + poll_s <= budget_s else "next"

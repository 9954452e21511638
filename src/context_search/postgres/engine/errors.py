"""The one boundary where driver errors become contract errors, and the retry of a write
transaction PostgreSQL rolled back as a deadlock or serialization victim."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
import sqlalchemy.exc
from sqlalchemy import Engine

from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    ContextSearchError,
    OperationCancelledError,
)
from context_search.postgres.engine.pause import pause
from context_search.postgres.engine.server import redact

__all__ = ["RETRYABLE_STATES", "translate_errors", "write_attempts"]


#: Deadlock and serialization failure: the transaction was rolled back whole and is safe to
#: run again (SQLSTATE class 40).
RETRYABLE_STATES = frozenset({"40P01", "40001"})


def _contract_error(action: str, orig: BaseException | None, dsn: str | None) -> Exception:
    state = getattr(orig, "sqlstate", None) or ""
    where = f" ({redact(dsn)})" if dsn else ""
    if state == "57014":  # query_canceled: statement_timeout or a cancel request
        return OperationCancelledError(
            f"{action}: cancelled or timed out; nothing was changed",
            details={"sqlstate": state, "reason": "timeout"},
        )
    if isinstance(orig, psycopg.OperationalError) and state[:2] in ("", "08", "57"):
        return BackendUnavailableError(
            f"{action}: database unreachable{where}", details={"sqlstate": state}
        )
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) or ""
    return BackendError(
        f"{action} failed with SQLSTATE {state or 'unknown'}: {primary}",
        details={"sqlstate": state},
    )


@contextmanager
def translate_errors(action: str, *, dsn: str | None = None) -> Iterator[None]:
    """The one boundary where driver errors become contract errors (by SQLSTATE class)."""
    try:
        yield
    except ContextSearchError:
        raise
    except sqlalchemy.exc.DBAPIError as exc:
        raise _contract_error(action, exc.orig, dsn) from exc
    except psycopg.Error as exc:  # statements sent on the driver connection itself
        raise _contract_error(action, exc, dsn) from exc
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise BackendError(f"{action} failed: {type(exc).__name__}") from exc


class _Attempt:
    """One try of a write transaction; see :func:`write_attempts`."""

    def __init__(self, engine: Engine, action: str, number: int, last: bool) -> None:
        self._engine, self._action, self._number, self._last = engine, action, number, last
        self._stack = ExitStack()
        self.succeeded = False

    def __enter__(self) -> Any:
        self._stack.enter_context(translate_errors(self._action))
        return self._stack.enter_context(self._engine.begin())

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        try:
            suppressed = bool(self._stack.__exit__(et, ev, tb))
        except BackendError as exc:
            if exc.details.get("sqlstate") in RETRYABLE_STATES and not self._last:
                back_off(self._number)
                return True
            raise
        self.succeeded = et is None
        return suppressed


def back_off(attempt: int) -> None:
    """Before try ``attempt + 1`` of a transaction PostgreSQL aborted as a deadlock victim
    or a serialization failure: both sides were writing, so wait a little, with jitter, so
    they do not collide again in step."""
    pause(random.uniform(0.005, 0.03) * 2**attempt)


def write_attempts(engine: Engine, action: str, *, tries: int = 4) -> Iterator[_Attempt]:
    """Run a write transaction again when PostgreSQL aborted it as a deadlock victim or a
    serialization failure, which concurrent writers on shared counters can cause::

        for attempt in write_attempts(engine, "upsert"):
            with attempt as conn:
                ...  # the whole transaction; it must not depend on a previous try

    Other errors, and the last try's, propagate (translated to contract errors).
    """
    for number in range(tries):
        attempt = _Attempt(engine, action, number, last=number == tries - 1)
        yield attempt
        if attempt.succeeded:
            return

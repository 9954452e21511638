"""The retrieval lifecycle (seed 003): one synchronous call path from query to receipt.

A :class:`Retrieval` puts normalising, checking, deduplicating, rate limiting, authorising,
reading and follow-up effects on one fixed path, so no integrator can forget a step or do
them in a different order. :meth:`Retrieval.run` always goes::

    prepare -> assert_input -> dedupe / quota check -> authorize -> reserve the seen key
            -> execute -> assert_result -> count the success and record its sources
            -> effects (in order)

Why this order:

* ``prepare`` runs first so every later step (checks, key, authorisation, backend) sees the
  same normalised query; the receipt still keeps the caller's original query.
* The cheap, caller-independent refusals (bad input, duplicate, quota) come before
  ``authorize``, and ``authorize`` comes before the key is reserved: a caller who may not
  read does not burn the key, so an authorised retry of the same query is still possible.
* The key is reserved *before* ``execute`` and a failed attempt keeps it. The lifecycle
  never retries on its own; running the same query again in the same request raises
  ``DUPLICATE_QUERY``. Whether to retry is the application's decision, made with a new
  request state.
* Only successes count against the quota: an ``execute`` or ``assert_result`` failure
  frees its quota slot (but not its key).
* Effects run after the success is counted, one by one. A failing effect stops the rest
  and raises :class:`RetrievalEffectError` carrying the receipt; earlier effects and the
  counted success are *not* rolled back, because the lifecycle cannot undo side effects
  and pretending otherwise would be worse.

Every port is synchronous. Coroutine functions are refused when the retrieval is defined,
and an awaitable returned at run time is refused as well; asynchronous retrieval belongs
in the application's own workflow code.

Thread safety: a :class:`Retrieval` is immutable and may be shared by any number of
threads. A :class:`RetrievalState` serialises its own changes with a lock; the ports run
outside that lock. The reserve step re-checks duplicate and quota atomically and holds a
quota slot for every attempt in flight, so concurrent runs on one state can neither run the
same key twice nor succeed more often than the limit. Ports that touch shared data of
their own must be thread-safe themselves.
"""

from __future__ import annotations

import inspect
import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from context_search.errors import (
    BackendError,
    ContextSearchError,
    DuplicateQueryError,
    InvalidQueryError,
    InvalidResultError,
    QuotaExceededError,
    RetrievalEffectError,
    UnauthorizedError,
)
from context_search.validation import MAX_ID_CHARS, MAX_QUERY_BYTES, check_text

__all__ = [
    "Retrieval",
    "RetrievalEffect",
    "RetrievalEffectError",
    "RetrievalReceipt",
    "RetrievalResult",
    "RetrievalState",
    "RetrievedSource",
    "SourceLike",
    "SourcedResult",
    "define_retrieval",
    "request_source_id",
    "retrieval_query_key",
]

Q = TypeVar("Q")
C = TypeVar("C")
S_co = TypeVar("S_co", covariant=True)

_RETRIEVAL_ID = re.compile(r"[^\s:]+")


# -- what execute returns -----------------------------------------------------------------


class SourceLike(Protocol):
    """One source as the backend names it; ``source_id`` is unique within one result."""

    @property
    def source_id(self) -> str: ...


S = TypeVar("S", bound=SourceLike)


class SourcedResult(Protocol[S_co]):
    """What ``execute`` returns: any object with a sequence of sources (it may carry more,
    such as a rank log; the receipt keeps it untouched as ``raw_result``)."""

    @property
    def sources(self) -> Sequence[S_co]: ...


# -- data ---------------------------------------------------------------------------------


def request_source_id(retrieval_id: str, sequence: int, source_id: str) -> str:
    """The request-local id of a source: ``<retrieval id>:<success sequence>:<source id>``.

    It is only a reference within one request state (the sequence restarts with every
    state), never a global document id. Retrieval ids cannot contain ``:``, so the id
    splits back unambiguously with ``split(":", 2)``.
    """
    return f"{retrieval_id}:{sequence}:{source_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrievedSource(Generic[S]):
    """A source of a successful run, renamed for the request.

    ``source_id`` is the request-local id (see :func:`request_source_id`) so sources of
    several retrievals and several runs never collide when an agent cites them;
    ``origin_id`` is the id the backend gave; ``source`` is the backend's object unchanged.
    """

    source_id: str
    origin_id: str
    retrieval_id: str
    sequence: int
    source: S


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrievalResult(Generic[S]):
    """The result handed on: the raw result's sources, in order, with request-local ids."""

    sources: tuple[RetrievedSource[S], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrievalReceipt(Generic[Q, S]):
    """Proof of one successful run.

    ``query`` is the caller's original query (before ``prepare``); ``key`` the dedupe key;
    ``sequence`` the 1-based number of this success within its request state;
    ``started_at`` (UTC) when :meth:`Retrieval.run` was entered. ``extensions`` is the one
    mutable part, deliberately: it is where effects attach what they produced.
    """

    retrieval_id: str
    query: Q
    key: str
    sequence: int
    started_at: datetime
    raw_result: SourcedResult[S]
    result: RetrievalResult[S]
    extensions: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrievalEffect(Generic[Q, C, S]):
    """A follow-up step run after a counted success, e.g. an audit record or a metric.

    ``handle(receipt, context)`` may write into ``receipt.extensions``; its return value is
    ignored. It runs once per success and is never rolled back.
    """

    id: str
    description: str
    handle: Callable[[RetrievalReceipt[Q, S], C], object]


# -- the request state --------------------------------------------------------------------


class RetrievalState:
    """What one request (or session) has done so far: successes, seen keys, sources.

    Give every request its own state, through the ``state(context)`` port; several
    retrievals may share one, and then share its quota and its success sequence. Seen keys
    are kept per retrieval id, so the same query on two different retrievals is not a
    duplicate. All changes happen under one lock (see the module docstring).
    """

    __slots__ = ("_lock", "_pending", "_query_count", "_seen", "_sources")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._query_count = 0
        self._pending = 0
        self._seen: set[tuple[str, str]] = set()
        self._sources: list[RetrievedSource[Any]] = []

    @property
    def query_count(self) -> int:
        """Successful runs so far (the seed's ``queryCount``)."""
        with self._lock:
            return self._query_count

    @property
    def pending(self) -> int:
        """Runs that reserved their key and have not yet succeeded or failed."""
        with self._lock:
            return self._pending

    @property
    def seen(self) -> frozenset[tuple[str, str]]:
        """Reserved ``(retrieval id, key)`` pairs, including those of failed attempts."""
        with self._lock:
            return frozenset(self._seen)

    @property
    def sources(self) -> tuple[RetrievedSource[Any], ...]:
        """Every source of every success, in the order the successes were counted."""
        with self._lock:
            return tuple(self._sources)

    def has_seen(self, retrieval_id: str, key: str) -> bool:
        with self._lock:
            return (retrieval_id, key) in self._seen

    # The methods below are the lifecycle's; they are private to this module.

    def _check_locked(self, retrieval_id: str, key: str, limit: int | None) -> None:
        if (retrieval_id, key) in self._seen:
            raise DuplicateQueryError(
                f"retrieval {retrieval_id!r} already ran this query in this request",
                details={"retrieval": retrieval_id, "key": key},
            )
        if limit is not None and self._query_count + self._pending >= limit:
            raise QuotaExceededError(
                f"the quota of {limit} successful queries is used up for this request",
                details={
                    "retrieval": retrieval_id,
                    "limit": limit,
                    "used": self._query_count,
                    "pending": self._pending,
                },
            )

    def _check(self, retrieval_id: str, key: str, limit: int | None) -> None:
        with self._lock:
            self._check_locked(retrieval_id, key, limit)

    def _reserve(self, retrieval_id: str, key: str, limit: int | None) -> None:
        # Re-checked under the same lock that records the key: another thread may have
        # reserved the key or the last quota slot while this one was being authorised.
        with self._lock:
            self._check_locked(retrieval_id, key, limit)
            self._seen.add((retrieval_id, key))
            self._pending += 1

    def _release(self) -> None:
        """A reserved attempt failed: free its quota slot, keep its key."""
        with self._lock:
            self._pending -= 1

    def _commit(
        self, retrieval_id: str, sources: Sequence[S]
    ) -> tuple[int, tuple[RetrievedSource[S], ...]]:
        with self._lock:
            self._pending -= 1
            self._query_count += 1
            sequence = self._query_count
            local = tuple(
                RetrievedSource(
                    source_id=request_source_id(retrieval_id, sequence, s.source_id),
                    origin_id=s.source_id,
                    retrieval_id=retrieval_id,
                    sequence=sequence,
                    source=s,
                )
                for s in sources
            )
            self._sources.extend(local)
            return sequence, local


# -- the default key ----------------------------------------------------------------------


def retrieval_query_key(query: object) -> str:
    """The default dedupe key of a text query: NFKC, case-folded, whitespace collapsed.

    So ``" Agent  Core"``, ``"agent core"`` and full-width ``"ＡＧＥＮＴ　ＣＯＲＥ"`` are one
    query. Raises ``INVALID_QUERY`` for non-text, NUL bytes, lone surrogates, more than
    ``MAX_QUERY_BYTES`` UTF-8 bytes, or a query that normalises to nothing.
    """
    text = check_text(query, name="query", max_bytes=MAX_QUERY_BYTES)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    key = " ".join(folded.split())
    if not key:
        raise InvalidQueryError("query must not be empty", details={"field": "query"})
    return key


# -- the lifecycle ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrieval(Generic[Q, C, S]):
    """A defined retrieval; build it with :func:`define_retrieval`, call :meth:`run`.

    Ports, all synchronous, all given ``context`` last:

    * ``prepare(query, context) -> query``: normalise; its output is what every later
      port sees.
    * ``assert_input(query, context)``, ``authorize(query, context)``,
      ``assert_result(raw_result, context)``: guards. They pass by returning ``None`` or
      ``True`` and reject by raising or returning anything else (fail closed, so a
      predicate returning ``False`` cannot be mistaken for a pass).
    * ``key(query, context) -> str``: the dedupe key (default :func:`retrieval_query_key`).
    * ``state(context) -> RetrievalState``: the request's state (default: a fresh state per
      run, i.e. no dedupe or quota across runs).
    * ``limit(context) -> int | None``: successful queries allowed per state (``None``:
      unlimited).
    * ``execute(query, context) -> SourcedResult``: the read.
    """

    id: str
    description: str
    execute: Callable[[Q, C], SourcedResult[S]]
    prepare: Callable[[Q, C], Q] | None = None
    assert_input: Callable[[Q, C], bool | None] | None = None
    state: Callable[[C], RetrievalState] | None = None
    limit: Callable[[C], int | None] | None = None
    authorize: Callable[[Q, C], bool | None] | None = None
    assert_result: Callable[[SourcedResult[S], C], bool | None] | None = None
    effects: tuple[RetrievalEffect[Q, C, S], ...] = ()
    key: Callable[[Q, C], str] | None = None

    def __post_init__(self) -> None:
        _check_id(self.id, "retrieval id")
        _check_description(self.description, "description")
        _check_port("execute", self.execute, required=True)
        for name in ("prepare", "assert_input", "state", "limit", "authorize"):
            _check_port(name, getattr(self, name), required=False)
        _check_port("assert_result", self.assert_result, required=False)
        _check_port("key", self.key, required=False)
        if self.limit is not None and self.state is None:
            raise ValueError(
                "limit needs a state port: without one every run has a fresh state "
                "and the quota could never be reached"
            )
        if not isinstance(self.effects, tuple):
            raise TypeError("effects must be a tuple of RetrievalEffect")
        effect_ids: set[str] = set()
        for effect in self.effects:
            if not isinstance(effect, RetrievalEffect):
                raise TypeError(f"expected RetrievalEffect, got {type(effect).__name__}")
            _check_id(effect.id, "effect id")
            _check_description(effect.description, f"description of effect {effect.id!r}")
            _check_port(f"effect {effect.id!r}", effect.handle, required=True)
            if effect.id in effect_ids:
                raise ValueError(f"duplicate effect id {effect.id!r}")
            effect_ids.add(effect.id)

    def run(self, query: Q, context: C) -> RetrievalReceipt[Q, S]:
        """Run the lifecycle once; returns the receipt of a success or raises.

        Raises ``INVALID_QUERY`` (prepare, assert_input or key rejected the query),
        ``DUPLICATE_QUERY`` (this retrieval already reserved the key in this state, even
        if that attempt failed), ``QUOTA_EXCEEDED``, ``UNAUTHORIZED``, ``BACKEND_ERROR``
        (execute raised something that is not a ``ContextSearchError``; those pass
        through unchanged), ``INVALID_RESULT`` (malformed result or assert_result refused
        it) and ``EFFECT_FAILED`` (:class:`RetrievalEffectError`, after the success).
        Port failures are chained with ``from``; their messages are not copied, since the
        lifecycle cannot know whether they quote data the caller may not see.
        """
        started_at = datetime.now(UTC)
        prepared = self._prepare(query, context)
        self._guard("assert_input", self.assert_input, prepared, context, InvalidQueryError)
        key = self._key(prepared, context)
        state = self._state(context)
        limit = self._limit(context)
        state._check(self.id, key, limit)
        self._guard("authorize", self.authorize, prepared, context, UnauthorizedError)
        state._reserve(self.id, key, limit)
        try:
            raw = self._execute(prepared, context)
            sources = self._check_result(raw)
            self._guard("assert_result", self.assert_result, raw, context, InvalidResultError)
        except BaseException:
            state._release()
            raise
        sequence, local = state._commit(self.id, sources)
        receipt: RetrievalReceipt[Q, S] = RetrievalReceipt(
            retrieval_id=self.id,
            query=query,
            key=key,
            sequence=sequence,
            started_at=started_at,
            raw_result=raw,
            result=RetrievalResult(sources=local),
        )
        self._run_effects(receipt, context)
        return receipt

    # -- steps ----------------------------------------------------------------------------

    def _refusal(
        self,
        error: type[ContextSearchError],
        port: str,
        message: str,
        exc: BaseException | None = None,
    ) -> ContextSearchError:
        details: dict[str, Any] = {"retrieval": self.id, "port": port}
        if exc is not None:
            details["cause"] = type(exc).__name__
        return error(f"retrieval {self.id!r}: {message}", details=details)

    def _prepare(self, query: Q, context: C) -> Q:
        if self.prepare is None:
            return query
        try:
            prepared = self.prepare(query, context)
        except ContextSearchError:
            raise
        except Exception as exc:
            raise self._refusal(
                InvalidQueryError, "prepare", "the query could not be prepared", exc
            ) from exc
        _ensure_sync(prepared, self.id, "prepare")
        return prepared

    def _guard(
        self,
        port: str,
        guard: Callable[[Any, C], bool | None] | None,
        value: object,
        context: C,
        error: type[ContextSearchError],
    ) -> None:
        if guard is None:
            return
        try:
            verdict = guard(value, context)
        except ContextSearchError:
            raise
        except Exception as exc:
            raise self._refusal(error, port, f"refused by {port}", exc) from exc
        _ensure_sync(verdict, self.id, port)
        if verdict is not None and verdict is not True:
            raise self._refusal(error, port, f"refused by {port}")

    def _key(self, query: Q, context: C) -> str:
        if self.key is None:
            return retrieval_query_key(query)
        try:
            key = self.key(query, context)
        except ContextSearchError:
            raise
        except Exception as exc:
            raise self._refusal(InvalidQueryError, "key", "no key for the query", exc) from exc
        _ensure_sync(key, self.id, "key")
        return check_text(key, name="key", max_bytes=MAX_QUERY_BYTES, allow_empty=False)

    def _state(self, context: C) -> RetrievalState:
        if self.state is None:
            return RetrievalState()
        state = self.state(context)
        if not isinstance(state, RetrievalState):
            raise TypeError(
                f"retrieval {self.id!r}: state must return a RetrievalState, "
                f"got {type(state).__name__}"
            )
        return state

    def _limit(self, context: C) -> int | None:
        if self.limit is None:
            return None
        limit = self.limit(context)
        if limit is None:
            return None
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"retrieval {self.id!r}: limit must return an int or None")
        if limit < 0:
            raise ValueError(f"retrieval {self.id!r}: limit must not be negative")
        return limit

    def _execute(self, query: Q, context: C) -> SourcedResult[S]:
        try:
            raw = self.execute(query, context)
        except ContextSearchError:
            raise
        except Exception as exc:
            # The backend's message may quote data of any scope; keep only its type.
            raise self._refusal(BackendError, "execute", "execute failed", exc) from exc
        _ensure_sync(raw, self.id, "execute")
        return raw

    def _check_result(self, raw: object) -> tuple[S, ...]:
        sources = getattr(raw, "sources", None)
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
            raise self._refusal(
                InvalidResultError, "execute", "the result has no sequence of sources"
            )
        checked: list[S] = []
        seen: set[str] = set()
        for position, source in enumerate(sources):
            source_id = getattr(source, "source_id", None)
            try:
                check_text(source_id, name="source_id", max_bytes=MAX_ID_CHARS, allow_empty=False)
            except InvalidQueryError:
                error = self._refusal(
                    InvalidResultError, "execute", f"source #{position} has no valid source_id"
                )
                raise error from None
            assert isinstance(source_id, str)
            if source_id in seen:
                raise self._refusal(
                    InvalidResultError, "execute", f"source #{position} repeats a source_id"
                )
            seen.add(source_id)
            checked.append(source)
        # A snapshot: later changes to the backend's list cannot alter what was counted.
        return tuple(checked)

    def _run_effects(self, receipt: RetrievalReceipt[Q, S], context: C) -> None:
        done: list[str] = []
        for position, effect in enumerate(self.effects):
            try:
                _ensure_sync(effect.handle(receipt, context), self.id, f"effect {effect.id!r}")
            except Exception as exc:
                raise RetrievalEffectError(
                    f"retrieval {self.id!r}: effect {effect.id!r} failed after the retrieval "
                    "succeeded; earlier effects were not rolled back",
                    details={
                        "retrieval": self.id,
                        "effect": effect.id,
                        "position": position,
                        "completed": list(done),
                        "skipped": [e.id for e in self.effects[position + 1 :]],
                        "cause": type(exc).__name__,
                    },
                    receipt=receipt,
                ) from exc
            done.append(effect.id)


def define_retrieval(
    id: str,
    description: str,
    execute: Callable[[Q, C], SourcedResult[S]],
    *,
    prepare: Callable[[Q, C], Q] | None = None,
    assert_input: Callable[[Q, C], bool | None] | None = None,
    state: Callable[[C], RetrievalState] | None = None,
    limit: Callable[[C], int | None] | None = None,
    authorize: Callable[[Q, C], bool | None] | None = None,
    assert_result: Callable[[SourcedResult[S], C], bool | None] | None = None,
    effects: Sequence[RetrievalEffect[Q, C, S]] = (),
    key: Callable[[Q, C], str] | None = None,
) -> Retrieval[Q, C, S]:
    """Define a retrieval (the seed's ``defineRetrieval``); see :class:`Retrieval`.

    Definition mistakes (bad id, missing or asynchronous port, duplicate effect id, a
    limit without a state) raise ``TypeError``/``ValueError`` here, once, rather than a
    request error on every run.
    """
    if isinstance(effects, (str, bytes)) or not isinstance(effects, Sequence):
        raise TypeError("effects must be a sequence of RetrievalEffect")
    return Retrieval(
        id=id,
        description=description,
        execute=execute,
        prepare=prepare,
        assert_input=assert_input,
        state=state,
        limit=limit,
        authorize=authorize,
        assert_result=assert_result,
        effects=tuple(effects),
        key=key,
    )


# -- helpers ------------------------------------------------------------------------------


def _check_id(value: object, what: str) -> None:
    if (
        not isinstance(value, str)
        or len(value) > MAX_ID_CHARS
        or not _RETRIEVAL_ID.fullmatch(value)
    ):
        raise ValueError(
            f"{what} must be a non-empty string of at most {MAX_ID_CHARS} characters "
            "without whitespace or ':'"
        )


def _check_description(value: object, what: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string")


def _check_port(name: str, port: object, *, required: bool) -> None:
    if port is None:
        if required:
            raise TypeError(f"{name} is required")
        return
    if not callable(port):
        raise TypeError(f"{name} must be callable")
    if inspect.iscoroutinefunction(port) or inspect.isasyncgenfunction(port):
        raise TypeError(f"{name} must be synchronous; every retrieval port is")


def _ensure_sync(value: object, retrieval_id: str, port: str) -> None:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # no "never awaited" warning for a value we refuse anyway
        raise TypeError(
            f"retrieval {retrieval_id!r}: {port} returned an awaitable; every port is synchronous"
        )

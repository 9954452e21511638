"""The lifecycle itself: :class:`Retrieval` runs the ports in their fixed order (see
:mod:`context_search.lifecycle`) and :func:`define_retrieval` builds one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic

from context_search.errors import (
    BackendError,
    ContextSearchError,
    InvalidQueryError,
    InvalidResultError,
    RetrievalEffectError,
    UnauthorizedError,
)
from context_search.lifecycle.keys import retrieval_query_key
from context_search.lifecycle.ports import check_description, check_id, check_port, ensure_sync
from context_search.lifecycle.state import RetrievalState
from context_search.lifecycle.types import (
    C,
    Q,
    RetrievalEffect,
    RetrievalReceipt,
    RetrievalResult,
    S,
    SourcedResult,
)
from context_search.validation import MAX_ID_CHARS, MAX_QUERY_BYTES, check_text

__all__ = ["Retrieval", "define_retrieval"]


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
        check_id(self.id, "retrieval id")
        check_description(self.description, "description")
        check_port("execute", self.execute, required=True)
        for name in ("prepare", "assert_input", "state", "limit", "authorize"):
            check_port(name, getattr(self, name), required=False)
        check_port("assert_result", self.assert_result, required=False)
        check_port("key", self.key, required=False)
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
            check_id(effect.id, "effect id")
            check_description(effect.description, f"description of effect {effect.id!r}")
            check_port(f"effect {effect.id!r}", effect.handle, required=True)
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
        ensure_sync(prepared, self.id, "prepare")
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
        ensure_sync(verdict, self.id, port)
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
        ensure_sync(key, self.id, "key")
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
        ensure_sync(raw, self.id, "execute")
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
                ensure_sync(effect.handle(receipt, context), self.id, f"effect {effect.id!r}")
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

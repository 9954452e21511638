"""What ``execute`` returns and what a successful run hands on: sources renamed for the
request, the receipt, and the effects that follow a success."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "C",
    "Q",
    "RetrievalEffect",
    "RetrievalReceipt",
    "RetrievalResult",
    "RetrievedSource",
    "S",
    "SourceLike",
    "SourcedResult",
    "request_source_id",
]

Q = TypeVar("Q")
C = TypeVar("C")
S_co = TypeVar("S_co", covariant=True)


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

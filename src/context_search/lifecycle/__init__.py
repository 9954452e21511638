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

The modules: :mod:`~context_search.lifecycle.types` (what ``execute`` returns, sources,
receipts, effects), :mod:`~context_search.lifecycle.state` (the request state),
:mod:`~context_search.lifecycle.keys` (the default dedupe key),
:mod:`~context_search.lifecycle.ports` (definition checks, synchronous ports only) and
:mod:`~context_search.lifecycle.retrieval` (:class:`Retrieval`, the order of it all).
"""

from context_search.errors import RetrievalEffectError
from context_search.lifecycle.keys import retrieval_query_key
from context_search.lifecycle.retrieval import Retrieval, define_retrieval
from context_search.lifecycle.state import RetrievalState
from context_search.lifecycle.types import (
    RetrievalEffect,
    RetrievalReceipt,
    RetrievalResult,
    RetrievedSource,
    SourcedResult,
    SourceLike,
    request_source_id,
)

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

"""The ledger's judgement of a hit: a leak only when no state the client could have caused
during the search let these scopes see the document."""

from __future__ import annotations

import time

from benchmarks.reliability import Ledger


def test_written_doc_seen_before_its_call_returned_is_not_a_leak() -> None:
    # The write commits inside the call; a search overlapping that window may see it
    # before ``ack`` runs.
    ledger = Ledger()
    ledger.intend("d1", "alpha", t_call=1.0)
    assert not ledger.leaked("d1", frozenset({"alpha"}), t0=1.5, t1=2.0)
    # ...but only under the scope the write intends, and not before the call began.
    assert ledger.leaked("d1", frozenset({"beta"}), t0=1.5, t1=2.0)
    assert ledger.leaked("d1", frozenset({"alpha"}), t0=0.1, t1=0.5)


def test_never_written_doc_is_a_leak() -> None:
    assert Ledger().leaked("ghost", frozenset({"alpha"}), t0=0.0, t1=1.0)


def test_rescope_in_flight_allows_both_scopes_then_only_the_new_one() -> None:
    ledger = Ledger()
    ledger.ack("d1", "alpha", 1, t_call=0.0)
    ledger.intend("d1", "beta", t_call=5.0)
    assert not ledger.leaked("d1", frozenset({"beta"}), t0=5.1, t1=5.2)
    assert not ledger.leaked("d1", frozenset({"alpha"}), t0=5.1, t1=5.2)
    ledger.ack("d1", "beta", 1, t_call=5.0)
    assert ledger.pending["d1"] == []
    # A search that began after the rescope was acknowledged must not see it under alpha.

    later = time.monotonic() + 1.0
    assert ledger.leaked("d1", frozenset({"alpha"}), t0=later, t1=later + 1)
    assert not ledger.leaked("d1", frozenset({"beta"}), t0=later, t1=later + 1)


def test_acknowledged_delete_hides_the_doc_from_later_searches() -> None:

    ledger = Ledger()
    ledger.ack("d1", "alpha", 1, t_call=0.0)
    ledger.intend("d1", None, t_call=1.0)
    ledger.ack("d1", None, 1, t_call=1.0)
    later = time.monotonic() + 1.0
    assert ledger.leaked("d1", frozenset({"alpha"}), t0=later, t1=later + 1)

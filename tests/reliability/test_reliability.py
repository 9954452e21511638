"""The CI slice of the reliability suite (``python -m benchmarks reliability`` runs the long one).

Load for 30 s and every fault kind a few times, with the same checks as the on-demand run:
zero errors and leaks under load; after each fault the interrupted call raised its typed
error or completed correctly, the next call worked, no acknowledged write was lost, nothing
half-written, and the audit found no violation.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from benchmarks import reliability

from context_search.postgres.engine.server import temporary_server

pytestmark = pytest.mark.integration

LOAD_SECONDS = float(os.environ.get("CONTEXT_SEARCH_LOAD_SECONDS", "30"))
ROUNDS = int(os.environ.get("CONTEXT_SEARCH_FAULT_ROUNDS", "3"))


def _assert_survived(result: dict[str, Any]) -> None:
    for name, kind in result["kinds"].items():
        assert kind["failures"] == 0, (name, kind["failure_samples"])
        assert kind["rounds"] == ROUNDS
        assert kind["injected"] >= 1, f"{name}: the fault never fired"
    assert result["writes_lost_or_wrong"] == 0, result["final_problems"]
    assert result["final_violations"] == 0
    assert result["acknowledged_documents"] > 200


@pytest.mark.slow
def test_load_has_no_errors_and_no_leaks(
    context_search_dsn: str, context_search_schema: str
) -> None:
    result = reliability.run_load(
        context_search_dsn, context_search_schema, duration_s=LOAD_SECONDS
    )
    assert result["errors"] == 0, result["error_samples"]
    assert result["leaks"] == 0, result["leak_samples"]
    assert result["verify_problems"] == []
    assert result["violations"] == 0
    # The run did real work on every path: searches, writes of each kind, jobs.
    assert result["searches"] > 100 and result["hits_checked"] > 0
    assert result["writes"] > 20 and result["jobs_done"] > 0
    assert result["documents"].get("deleted", 0) > 0


@pytest.mark.slow
def test_faults_are_survived(context_search_dsn: str, context_search_schema: str) -> None:
    result = reliability.run_faults(None, context_search_dsn, context_search_schema, rounds=ROUNDS)
    assert set(result["kinds"]) == {
        "terminate_during_upsert",
        "terminate_during_job",
        "terminate_during_search",
        "embedder_raises_mid_batch",
        "worker_sigkilled_mid_job",
        "merge_sigkilled",
        "merge_races_writes",
        "merge_races_switch",
        "conversion_sigkilled",
        "terminate_during_ordered_upsert",
    }
    _assert_survived(result)


@pytest.mark.slow
def test_server_restart_is_survived() -> None:
    # Restarting needs a server this process owns, whatever CONTEXT_SEARCH_DSN points at.
    with temporary_server() as handle:
        assert handle.data_dir is not None
        result = reliability.run_faults(
            handle.data_dir, handle.dsn, "rel_restart", rounds=ROUNDS, only={"server_restart"}
        )
    assert set(result["kinds"]) == {"server_restart"}
    _assert_survived(result)
    restart = result["kinds"]["server_restart"]
    assert restart["typed_errors"] >= 1  # calls in flight during the outage failed typed

"""Reliability suite: sustained load, then injected faults, against a real server.

``python -m benchmarks reliability`` calls ``run`` and ``markdown``; ``tests/reliability``
runs ``run_load`` and ``run_faults`` for a short slice. Import from here, not from the
modules, which are split by what each part of the suite is responsible for:

- ``ledger``: ground truth from acknowledged writes, the generated documents, and
  ``verify`` (the index against the ledger: readable in its scope only, searchable at its
  last version, no audit violation);
- ``load``: searchers, an ingester and workers at once; every hit checked for leaks;
- ``faults``: backends terminated during an upsert, a job and a search;
- ``outages``: the server restarted, the embedder raising mid-batch, a worker SIGKILLed;
- ``merges``: a merging process SIGKILLed, merges racing deletes, rescopes, rewrites and
  a model switch;
- ``runner``: the fault kinds in order on one ledger, the final verification, ``run``;
- ``report``: the suite's section of BENCHMARKS.md.

The targets: zero errors and zero leaks under load; after every fault the interrupted call
raised its documented typed error or completed correctly, the next call worked, no
acknowledged write was lost, nothing was half-written, and the audit
(``context_search.postgres.operations.audit``) found no violation.
"""

from benchmarks.reliability.faults import FaultTally
from benchmarks.reliability.ledger import SCOPES, Ledger, drain, record, token, verify
from benchmarks.reliability.load import run_load
from benchmarks.reliability.report import markdown
from benchmarks.reliability.runner import run, run_faults

__all__ = [
    "SCOPES",
    "FaultTally",
    "Ledger",
    "drain",
    "markdown",
    "record",
    "run",
    "run_faults",
    "run_load",
    "token",
    "verify",
]

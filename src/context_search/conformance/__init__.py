"""The reusable conformance suite: every SearchConnector rule as a case that can fail.

Use it from any adapter's tests::

    from context_search.conformance import CASES, run_case

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_conformance(case):
        run_case(case, my_fresh_connector_factory)

or run the whole suite with :func:`run_conformance` (the CLI does this). The cases live in
:mod:`context_search.conformance.cases`, one module per part of the contract; ``_registry``
registers and runs them, ``corpus`` holds the documents they ingest.
"""

# Registers every case (CASES is filled as the case modules are imported).
from context_search.conformance import cases  # noqa: F401
from context_search.conformance._registry import (
    CASES,
    Case,
    CaseResult,
    ConformanceFailure,
    ConformanceReport,
    ConnectorFactory,
    run_case,
    run_conformance,
)
from context_search.conformance.corpus import standard_corpus

__all__ = [
    "CASES",
    "Case",
    "CaseResult",
    "ConformanceFailure",
    "ConformanceReport",
    "ConnectorFactory",
    "run_case",
    "run_conformance",
    "standard_corpus",
]

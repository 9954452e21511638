"""The reusable conformance suite: every SearchConnector rule as a case that can fail.

Use it from any adapter's tests::

    from context_search.conformance import CASES, run_case

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_conformance(case):
        run_case(case, my_fresh_connector_factory)

or run the whole suite with :func:`run_conformance` (the CLI does this).
"""

from context_search.conformance import (
    cases_access,
    cases_highlights,
    cases_input,
    cases_knowledge,
    cases_lifecycle,
    cases_overwrites,
    cases_pages,
    cases_query,
    cases_results,
    cases_revisions,
)
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

_GROUPS = (
    cases_access,
    cases_lifecycle,
    cases_results,
    cases_query,
    cases_input,
    cases_revisions,
    cases_overwrites,
    cases_knowledge,
    cases_pages,
    cases_highlights,
)

"""The conformance suite as a pytest mixin, one test per case."""

from __future__ import annotations

import pytest

from context_search.conformance import CASES, Case, ConnectorFactory, run_case

__all__ = ["ConformanceSuite"]


class ConformanceSuite:
    """Every :data:`context_search.conformance.CASES` rule as a test of your connector.

    Subclass it under a name pytest collects (``Test...``) and provide a ``connector_factory``
    fixture returning a :data:`~context_search.conformance.ConnectorFactory`: a callable whose
    context manager yields a *fresh, empty* connector and closes it when the case ends::

        class TestMyConnector(ConformanceSuite):
            @pytest.fixture
            def connector_factory(self, context_search_dsn):
                @contextmanager
                def make(embedder=None):
                    with temporary_schema(context_search_dsn) as schema:
                        with MyConnector.open(
                            context_search_dsn, schema=schema, embedder=embedder
                        ) as connector:
                            yield connector
                return make

    The cases about fusion pass ``embedder=`` (one of their own, e.g. an embedder whose
    vectors carry no signal): the factory builds that case's connector with it.

    The fixture may also live in a conftest or the test module. Each case is one test,
    ``test_conformance[<case name>]``; a violation fails it with a
    :class:`~context_search.conformance.ConformanceFailure` naming the rule.
    """

    @pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
    def test_conformance(self, case: Case, connector_factory: ConnectorFactory) -> None:
        run_case(case, connector_factory)

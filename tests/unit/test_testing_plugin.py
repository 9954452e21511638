"""context_search.testing as a service's tests see it: fixtures through the pytest11 entry
point, with no conftest and no import of the plugin, and the conformance mixin."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from context_search.conformance import CASES

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.unit

FIXTURES = (
    "context_search_dsn",
    "context_search_schema",
    "context_search_embedder",
    "context_search_connector",
)

USER_TESTS = """
from contextlib import contextmanager

import pytest

from context_search import HashingEmbedder, InMemorySearchConnector
from context_search.testing import ConformanceSuite


def test_default_embedder(context_search_embedder):
    assert isinstance(context_search_embedder, HashingEmbedder)


class TestOwnEmbedder:
    @pytest.fixture
    def context_search_embedder(self):
        return HashingEmbedder(dimension=8)

    def test_override_wins(self, context_search_embedder):
        assert context_search_embedder.dimension == 8


class TestMyConnector(ConformanceSuite):
    @pytest.fixture
    def connector_factory(self):
        @contextmanager
        def make(embedder=None):
            with InMemorySearchConnector(embedder=embedder) as connector:
                yield connector

        return make
"""


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    (ep,) = [ep for ep in entry_points(group="pytest11") if ep.name == "context_search"]
    assert ep.value == "context_search.testing.plugin"


def test_a_users_tests_get_fixtures_and_the_suite_without_a_conftest(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_service=USER_TESTS)
    # pytest-asyncio (installed beside us by langchain-tests) warns about its own unset
    # option in a project without configuration; that warning is not ours to judge here.
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "-W", "error")
    result.assert_outcomes(passed=2 + len(CASES))
    assert not (pytester.path / "conftest.py").exists()


def test_the_fixtures_are_listed_and_none_needs_a_server_to_be_listed(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "--fixtures")
    assert result.ret == 0
    for name in FIXTURES:
        result.stdout.fnmatch_lines([f"{name}*context_search*plugin.py*"])


def test_a_failing_case_fails_its_own_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_service="""
from contextlib import contextmanager

import pytest

from context_search import InMemorySearchConnector
from context_search.testing import ConformanceSuite


class Forgetful(InMemorySearchConnector):
    def upsert(self, records, **kwargs):
        return super().upsert([], **kwargs)


class TestForgetful(ConformanceSuite):
    @pytest.fixture
    def connector_factory(self):
        @contextmanager
        def make(embedder=None):
            with Forgetful(embedder=embedder) as connector:
                yield connector

        return make
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) > 0
    assert outcomes.get("failed", 0) + outcomes.get("passed", 0) == len(CASES)
    result.stdout.fnmatch_lines(
        [
            "*TestForgetful.test_conformance[[]permission_prefilter[]]*",
            "E*ConformanceFailure: team caller found nothing*",
        ]
    )


def test_loading_the_plugin_imports_no_database_driver() -> None:
    code = (
        "import sys, pytest, context_search.testing.plugin\n"
        "print(sorted(m for m in ('psycopg', 'sqlalchemy', 'alembic', 'docker', "
        "'testcontainers', 'pgvector') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"

"""The reference connector passes every case; every broken connector fails its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

from context_search import Embedder, InMemorySearchConnector, SearchConnector
from context_search.conformance import (
    CASES,
    ConformanceFailure,
    ConnectorFactory,
    run_case,
    run_conformance,
)
from context_search.testing import ConformanceSuite
from tests.unit.broken_connectors import BROKEN, Broken

pytestmark = pytest.mark.unit


def _factory(cls: type[InMemorySearchConnector]) -> ConnectorFactory:
    @contextmanager
    def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
        with cls(embedder=embedder) as connector:
            yield connector

    return make


def test_suite_has_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


class TestReferenceConnector(ConformanceSuite):
    @pytest.fixture
    def connector_factory(self) -> ConnectorFactory:
        return _factory(InMemorySearchConnector)


@pytest.mark.parametrize("broken", BROKEN, ids=lambda b: b.__name__)
def test_broken_connector_is_caught(broken: type[Broken]) -> None:
    by_name = {c.name: c for c in CASES}
    assert broken.catches, f"{broken.__name__} names no case"
    for name in broken.catches:
        with pytest.raises(ConformanceFailure):
            run_case(by_name[name], _factory(broken))


def test_every_case_is_targeted_by_a_broken_connector() -> None:
    targeted = {name for b in BROKEN for name in b.catches}
    assert {c.name for c in CASES} <= targeted


def test_runner_reports_crashes_as_failures() -> None:
    class Crashes(InMemorySearchConnector):
        def search(self, *args: object, **kwargs: object) -> NoReturn:
            raise RuntimeError("backend exploded")

        get_document = explain = search

    report = run_conformance(_factory(Crashes), [c for c in CASES if c.group == "permission"])
    assert report.failed == len(report.results) > 0
    assert all(
        "backend exploded" in r.message or "RuntimeError" in r.message for r in report.results
    )


def test_a_factory_that_cannot_take_the_cases_embedder_is_told_so() -> None:
    (noise_case,) = [c for c in CASES if c.embedder is not None]

    @contextmanager
    def positional_only(embedder: object = None, /) -> Iterator[SearchConnector]:
        with InMemorySearchConnector() as connector:
            yield connector

    for factory in (_plain_factory, positional_only):
        with pytest.raises(TypeError, match="must accept an `embedder` keyword"):
            run_case(noise_case, factory)


@contextmanager
def _plain_factory() -> Iterator[SearchConnector]:
    with InMemorySearchConnector() as connector:
        yield connector

"""Case registry and runner: cases are plain functions taking a fresh, empty connector."""

from __future__ import annotations

import inspect
import time
import traceback
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from context_search.contract import SearchConnector
from context_search.embedding import Embedder

__all__ = [
    "CASES",
    "Case",
    "CaseResult",
    "ConformanceFailure",
    "ConformanceReport",
    "ConnectorFactory",
    "case",
    "check",
    "run_case",
    "run_conformance",
]

#: Returns a context manager yielding a *fresh, empty* connector; it is closed after the case.
#: The cases about fusion call it with ``embedder=`` (an embedder of their own, e.g. one
#: whose vectors carry no signal): a factory builds that connector with it.
ConnectorFactory = Callable[..., AbstractContextManager[SearchConnector]]


class ConformanceFailure(AssertionError):
    """A contract rule was violated; the message says which and how."""


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    group: str
    rule: str
    func: Callable[[SearchConnector], None]
    #: The case's connector is built with this embedder (``None``: the factory's own).
    embedder: Callable[[], Embedder] | None = None


CASES: list[Case] = []


def case(
    group: str, *, embedder: Callable[[], Embedder] | None = None
) -> Callable[[Callable[[SearchConnector], None]], Callable[[SearchConnector], None]]:
    """Register a case; its docstring's first line is the rule it checks. ``embedder``:
    the case needs a connector built with that embedder."""

    def register(func: Callable[[SearchConnector], None]) -> Callable[[SearchConnector], None]:
        rule = (func.__doc__ or func.__name__).strip().splitlines()[0]
        CASES.append(Case(name=func.__name__, group=group, rule=rule, func=func, embedder=embedder))
        return func

    return register


def check(condition: object, message: str) -> None:
    if not condition:
        raise ConformanceFailure(message)


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    passed: bool
    message: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ConformanceReport:
    results: tuple[CaseResult, ...]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    @property
    def ok(self) -> bool:
        return self.failed == 0


def run_case(item: Case, factory: ConnectorFactory) -> None:
    """Run one case on a fresh connector; raises ConformanceFailure on a violation."""
    if item.embedder is None:
        made = factory()
    else:
        params = inspect.signature(factory).parameters.values()
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        if not any(
            (p.name == "embedder" and p.kind in named) or p.kind is p.VAR_KEYWORD for p in params
        ):
            # A setup error, not a violation of the rule the case checks.
            raise TypeError(
                f"{item.name} needs a connector built with an embedder of its own: the "
                "connector factory must accept an `embedder` keyword"
            )
        made = factory(embedder=item.embedder())
    with made as connector:
        item.func(connector)


def run_conformance(
    factory: ConnectorFactory,
    cases: Iterable[Case] | None = None,
) -> ConformanceReport:
    """Run every case (or the given ones); an unexpected exception counts as a failure."""
    results: list[CaseResult] = []
    for item in CASES if cases is None else cases:
        start = time.perf_counter()
        try:
            run_case(item, factory)
        except ConformanceFailure as exc:
            results.append(CaseResult(item, False, str(exc), time.perf_counter() - start))
        except Exception as exc:
            last = traceback.format_exception_only(exc)[-1].strip()
            results.append(CaseResult(item, False, f"raised {last}", time.perf_counter() - start))
        else:
            results.append(CaseResult(item, True, "", time.perf_counter() - start))
    return ConformanceReport(tuple(results))

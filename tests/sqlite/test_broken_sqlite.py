"""The SQLite connector's read protections are load-bearing: each broken adapter below
weakens one of the TEMP views every read statement goes through (``sqlite/reads.py``), and
the conformance case guarding that rule must fail on it. Searches are guarded twice: their
arrays are loaded one scope the caller named at a time, through the views
(``sqlite/snapshot.py``), so one weakened view alone must not make them leak."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from context_search import HashingEmbedder, SearchConnector
from context_search.conformance import CASES, ConformanceFailure, ConnectorFactory, run_case
from context_search.sqlite import SQLiteSearchConnector

pytestmark = pytest.mark.unit


class _BrokenView(SQLiteSearchConnector):
    """Replaces one TEMP view on every connection it opens."""

    view: ClassVar[str]
    body: ClassVar[str]
    catches: ClassVar[tuple[str, ...]]
    #: Cases the second guard of searches still passes with this view weakened.
    holds: ClassVar[tuple[str, ...]] = ()

    def _connect(self) -> Any:
        conn = super()._connect()
        conn.execute(f"DROP VIEW temp.{self.view}")
        conn.execute(f"CREATE TEMP VIEW {self.view} AS {self.body}")
        return conn


class ViewIgnoresScopes(_BrokenView):
    """Every live document is visible, whatever the caller's scopes. (Searches still hold:
    they read arrays loaded one named scope at a time, ``sqlite/snapshot.py``; the reads
    of single documents are what this view alone guards.)"""

    view = "visible_documents"
    body = "SELECT d.* FROM main.documents AS d WHERE d.lifecycle <> 'deleted'"
    catches = ("get_document_checks_scope", "no_existence_leak_explain")
    holds = ("permission_prefilter",)


class ViewKeepsDeleted(_BrokenView):
    """Deleted documents stay in the caller's view."""

    view = "visible_documents"
    body = (
        "SELECT d.* FROM main.documents AS d "
        "WHERE d.scope IN (SELECT scope FROM temp.caller_scopes)"
    )
    catches = ("deleted_never_returns",)


class ChunksOfEveryDocument(_BrokenView):
    """Chunks are not limited to visible documents: hidden ones feed BM25's statistics."""

    view = "visible_chunks"
    body = "SELECT c.* FROM main.chunks AS c"
    catches = ()
    holds = ("scores_independent_of_hidden_documents", "permission_prefilter")


BROKEN: tuple[type[_BrokenView], ...] = (ViewIgnoresScopes, ViewKeepsDeleted, ChunksOfEveryDocument)


def _factory(cls: type[SQLiteSearchConnector], directory: Path) -> ConnectorFactory:
    counter = iter(range(1_000))

    @contextmanager
    def make() -> Iterator[SearchConnector]:
        path = str(directory / f"{cls.__name__}-{next(counter)}.db")
        with cls.open(path, embedder=HashingEmbedder()) as connector:
            yield connector

    return make


@pytest.mark.parametrize("broken", BROKEN, ids=lambda b: b.__name__)
def test_a_weakened_view_is_caught_by_conformance(
    broken: type[_BrokenView], tmp_path: Path
) -> None:
    by_name = {c.name: c for c in CASES}
    for name in broken.catches:
        run_case(by_name[name], _factory(SQLiteSearchConnector, tmp_path))  # the real one passes
        with pytest.raises(ConformanceFailure):
            run_case(by_name[name], _factory(broken, tmp_path))


@pytest.mark.parametrize("broken", [b for b in BROKEN if b.holds], ids=lambda b: b.__name__)
def test_searches_hold_with_one_view_weakened(broken: type[_BrokenView], tmp_path: Path) -> None:
    by_name = {c.name: c for c in CASES}
    for name in broken.holds:
        run_case(by_name[name], _factory(broken, tmp_path))

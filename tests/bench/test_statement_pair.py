"""The paired statement benchmark compares what each revision's own code sends."""

from __future__ import annotations

from benchmarks.statement_pair import statement_of

from context_search.fusion import FusionSettings
from context_search.postgres.read.statement import SearchStatements, numbered_search_sql


def test_a_revisions_statement_is_built_by_that_revisions_code() -> None:
    """HEAD's exported source builds the statement this checkout builds (the checkout is
    HEAD's): the text and the order of its parameters."""
    here = SearchStatements(fusion=FusionSettings(), text_search_config="english")
    current = numbered_search_sql(None, here.fusion, here.limits())
    assert statement_of("HEAD") == (current.text, current.names)

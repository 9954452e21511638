"""What a person reads: hints that point at what the terminal shows, missing optional parts
as typed errors, explain in words, progress that ends where the work ended, help text."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from context_search.cli import app
from context_search.errors import _REGISTRY

runner = CliRunner()


@pytest.mark.unit
def test_no_hint_points_at_details_the_terminal_does_not_show() -> None:
    # The CLI prints code, message and hint; details only with --json.
    for code, cls in _REGISTRY.items():
        assert "details" not in cls.hint, (code, cls.hint)
        assert "chained cause" not in cls.hint, (code, cls.hint)


@pytest.mark.integration
def test_admin_not_found_hint_does_not_mention_scopes(
    context_search_dsn: str, context_search_schema: str
) -> None:
    where = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    opts = [*where, "--embedder", "hashing"]
    assert runner.invoke(app, ["migrate", *where]).exit_code == 0
    for args in (["delete", "nope"], ["supersede", "nope", "--by", "x"], ["rescope", "nope", "t"]):
        result = runner.invoke(app, [*args, *opts])
        assert result.exit_code == 3, result.output
        assert "NOT_FOUND" in result.output and "hint:" in result.output
        assert "scope" not in result.output.split("hint:")[1], result.output
    read = runner.invoke(app, ["get", "nope", "-s", "team", *opts])
    assert read.exit_code == 3 and "scopes" in read.output.split("hint:")[1]

"""The README's install and CLI tour, as a new user meets them: a wheel in a fresh venv.

No checkout on the path, no dev tools, no torch: the wheel is built from this tree, installed
with the README's own ``pip install`` lines into an empty venv, and the tour runs through that
venv's ``context-search`` with the default model on ONNX Runtime, against PostgreSQL (this
session's server, a schema of the test's own) and against a SQLite file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from benchmarks.install_size import readme_install_lines, with_wheel

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _run(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=900, check=False
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def readme_tour_commands() -> set[str]:
    """The sub-commands the README's CLI tour shows."""
    section = README.read_text(encoding="utf-8").split("## CLI tour", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return set(re.findall(r"^context-search ([\w-]+)", block, flags=re.MULTILINE))


@dataclass(frozen=True)
class Venv:
    root: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def cli(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return _run([str(self.root / "bin" / "context-search"), *args], env=self.env, cwd=cwd)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    work = tmp_path_factory.mktemp("wheel-tour")
    dist = work / "dist"
    _ok(
        _run(
            [
                sys.executable,
                *("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
                *("-w", str(dist), str(ROOT)),
            ]
        )
    )
    (wheel,) = dist.glob("context_search-*.whl")
    root = work / "venv"
    _ok(_run([sys.executable, "-m", "venv", str(root)]))
    home = work / "home"
    env = {
        "PATH": f"{root / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_DATA_HOME": str(home / "data"),
        "HF_HUB_OFFLINE": "1",
        "LANG": "C.UTF-8",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    for line in readme_install_lines():
        # The README installs "context-search" from an index; here it is the wheel just built.
        argv = with_wheel(line, wheel)
        assert argv[:2] == ["pip", "install"]
        _ok(_run([str(root / "bin" / "pip"), *argv[1:], "-q"], env=env))
    # Nothing of the checkout is on the venv's path: its env holds no PYTHONPATH, and the
    # tour runs from an empty folder.
    return Venv(root, env)


def test_readme_install_lines_are_the_small_ones() -> None:
    lines = readme_install_lines()
    assert any("context-search[embeddings]" in a for argv in lines for a in argv)
    assert not any("torch" in a for argv in lines for a in argv)


def test_the_install_has_no_torch_and_embeds_with_the_default_model(fresh_venv: Venv) -> None:
    probe = (
        "import importlib.util, json, sys\n"
        "from context_search.embedding import default_embedder\n"
        "v = default_embedder().embed_query('The aurora service restarts nightly.')\n"
        "print(json.dumps({'torch': importlib.util.find_spec('torch') is not None,\n"
        "  'st': importlib.util.find_spec('sentence_transformers') is not None,\n"
        "  'dim': len(v), 'loaded': sorted(m for m in ('torch', 'transformers') "
        "if m in sys.modules), 'head': [float(x) for x in v[:8]]}))\n"
    )
    out = json.loads(_ok(_run([fresh_venv.python, "-c", probe], env=fresh_venv.env)))
    assert out["torch"] is False and out["st"] is False and out["loaded"] == []
    assert out["dim"] == 384
    # The same vector as this (dev) environment computes for the same text.
    from context_search.embedding import default_embedder

    mine = default_embedder().embed_query("The aurora service restarts nightly.")[:8]
    assert [round(x, 4) for x in out["head"]] == [round(float(x), 4) for x in mine]


NOTES = {
    "aurora.md": "# Aurora runbook\n\nThe aurora service restarts nightly at 02:00 UTC.\n",
    "billing.md": "# Billing\n\nInvoices are issued on the first business day of the month.\n",
}


def _notes(tmp: Path) -> Path:
    folder = tmp / "notes"
    folder.mkdir()
    for name, text in NOTES.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _hits(stdout: str) -> list[str]:
    return [h["doc_id"] for h in json.loads(stdout)["hits"]]


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_cli_tour(
    fresh_venv: Venv,
    backend: str,
    tmp_path: Path,
    context_search_dsn: str,
    request: pytest.FixtureRequest,
) -> None:
    notes = _notes(tmp_path)
    if backend == "postgres":
        schema = request.getfixturevalue("context_search_schema")
        where = ["--dsn", context_search_dsn, "--schema", schema]
    else:
        where = ["--db", str(tmp_path / "index.db")]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return fresh_venv.cli(*args, *where, cwd=tmp_path)

    # A folder has no default scope: the tour's line names it.
    refused = cli("ingest", str(notes))
    assert refused.returncode == 3 and "--scope" in refused.stderr
    _ok(cli("ingest", str(notes), "--scope", "eng"))
    found = _hits(_ok(cli("search", "when does aurora restart", "-s", "eng", "--json")))
    aurora = "aurora.md"  # a note's id is its path inside the folder
    assert found[0] == aurora
    assert _hits(_ok(cli("search", "when does aurora restart", "-s", "sales", "--json"))) == []
    explained = _ok(cli("explain", aurora, "when does aurora restart", "-s", "eng"))
    assert "ScoreParts(" not in explained and "aurora" in explained
    assert "nightly" in _ok(cli("get", aurora, "-s", "eng"))
    listed = _ok(cli("list", "-s", "eng"))
    assert aurora in listed
    # Re-running without --scope widens nothing; another scope needs --allow-rescope.
    assert cli("ingest", str(notes)).returncode == 3
    assert cli("ingest", str(notes), "--scope", "public").returncode == 3
    assert _hits(_ok(cli("search", "aurora", "-s", "public", "--json"))) == []
    _ok(cli("delete", aurora))
    assert aurora not in _hits(_ok(cli("search", "aurora restart", "-s", "eng", "--json")))
    _ok(cli("reindex", "--until-empty"))
    status = _ok(cli("status"))
    assert "document" in status
    # Benchmarks come with a checkout, and say so.
    bench = fresh_venv.cli("bench", "quality", cwd=tmp_path)
    assert bench.returncode == 3 and "checkout" in bench.stderr


def test_every_tour_command_exists() -> None:
    from context_search.cli import app

    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert readme_tour_commands() - names == set()
    assert {
        "demo",
        "ingest",
        "search",
        "explain",
        "get",
        "list",
        "status",
    } <= readme_tour_commands()

"""Search statements of several revisions, run in turn on one kept index, query by query.

``python -m benchmarks.statement_pair --dsn DSN REV [REV ...]`` takes each git revision's
unfiltered search statement (its ``src`` exported to a temporary directory, the statement
text built there by that revision's own code) and runs them on the index that
``python -m benchmarks.search_profile --dsn DSN --chunks N --keep`` left in schema
``bench_profile``. For each of ``--queries`` test queries of the data set, every statement
runs once, in a random order, each in a read transaction of its own with the same bound
values; ``--rounds`` rounds, the first discarded. Reported per revision: the statement's
median and 90th percentile, the median over queries of its time over the first revision's
(a ratio the machine's drift between queries cannot move), and whether it returned the same
rows as the first revision on every query (the clock column left out).

A change to the statement is measured this way because the machine's speed moves between
suite runs by more than most levers: the statements of both revisions see the same moment.
The bound values come from this checkout's code, so the revisions compared must take the
same parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DEFAULT_DATA,
    RESULTS,
    ROOT,
    CachedEmbedder,
    envelope,
    load_beir,
    make_embedder,
)
from benchmarks.search_profile import SCHEMA
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.read.session import driver_cursor
from context_search.validation import validate_query

#: Run with the exported tree first on the path: the revision's statement, as JSON.
_DUMP = """
import json
from context_search.fusion import FusionSettings
from context_search.postgres.read.statement import SearchStatements, numbered_search_sql
st = SearchStatements(fusion=FusionSettings(), text_search_config="english")
s = numbered_search_sql(None, st.fusion, st.limits())
print(json.dumps([s.text, list(s.names)]))
"""


def statement_of(revision: str) -> tuple[str, tuple[str, ...]]:
    """The unfiltered search statement (text, parameter names) of ``revision``."""
    archive = subprocess.run(
        ["git", "archive", revision, "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        out = subprocess.run(
            [sys.executable, "-c", _DUMP],
            env={**os.environ, "PYTHONPATH": str(Path(tmp) / "src")},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    text, names = json.loads(out)
    return text, tuple(names)


def _comparable(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(v for v in r if not isinstance(v, datetime)) for r in rows]


def run(dsn: str, revisions: list[str], queries: int, rounds: int) -> dict[str, Any]:
    statements = [statement_of(r) for r in revisions]
    data = load_beir(DEFAULT_DATA)
    embedder = CachedEmbedder(make_embedder("minilm"))
    texts = [data.queries[q] for q in sorted(data.queries)][:queries]
    vectors = [embedder.embed_query(t) for t in texts]
    times: list[list[float]] = [[] for _ in revisions]
    same = [True] * len(revisions)
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        search = store._statements
        for round_ in range(rounds):
            for text, vector in zip(texts, vectors, strict=True):
                vq = validate_query(SearchQuery(query=text, allowed_scopes=["public"], top_k=10))
                _, bind = search._bind(vq, vector, None, 1.0)
                order = list(range(len(revisions)))
                random.shuffle(order)
                answers: dict[int, list[tuple[Any, ...]]] = {}
                for k in order:
                    sql, names = statements[k]
                    with (
                        store._sessions.read(vq.scopes, "search", tuning=search.tuning(vq)) as s,
                        driver_cursor(s.conn) as cur,
                    ):
                        t0 = time.perf_counter()
                        cur.execute(sql, tuple(bind[n] for n in names))
                        answers[k] = _comparable(cur.fetchall())
                        elapsed = 1000 * (time.perf_counter() - t0)
                    if round_:
                        times[k].append(elapsed)
                for k in answers:
                    same[k] = same[k] and answers[k] == answers[0]
    embedder.save()
    out = {}
    for k, revision in enumerate(revisions):
        xs = sorted(times[k])
        out[revision] = {
            "p50_ms": round(statistics.median(xs), 2),
            "p90_ms": round(xs[int(0.9 * len(xs))], 2),
            "median_ratio_to_first": round(
                statistics.median(b / a for a, b in zip(times[0], times[k], strict=True)), 3
            ),
            "same_rows_as_first": same[k],
        }
    return {"queries": len(texts), "rounds": rounds, "statements": out}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.statement_pair")
    parser.add_argument("--dsn", required=True, help="The server holding the kept index.")
    parser.add_argument("revisions", nargs="+", help="Git revisions; the first is the base.")
    parser.add_argument("--queries", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = {
        **envelope("statement_pair", []),
        "command": " ".join(
            [
                "python -m benchmarks.statement_pair --dsn …",
                *args.revisions,
                f"--queries {args.queries} --rounds {args.rounds}",
            ]
        ),
        **run(args.dsn, args.revisions, args.queries, args.rounds),
    }
    out = args.out or RESULTS / "statement_pair.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result["statements"], indent=2))


if __name__ == "__main__":
    main()

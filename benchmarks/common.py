"""What every benchmark suite shares: datasets in BEIR layout, metrics, an embedding cache,
the server, and writing results (JSON + a section of BENCHMARKS.md)."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from context_search import ContextDocumentRecord
from context_search.embedding import Embedder, embedder_scripts
from context_search.postgres.engine.server import resolve_server, temporary_server

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "beir-scifact"
CACHE = Path(
    os.environ.get("CONTEXT_SEARCH_BENCH_CACHE", Path.home() / ".cache" / "context-search")
)


# -- datasets -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    records: list[ContextDocumentRecord]
    queries: dict[str, str]
    qrels: dict[str, set[str]]


def _open(path: Path) -> Iterator[str]:
    gz = path.with_name(path.name + ".gz")
    if path.exists():
        with path.open(encoding="utf-8") as fh:
            yield from fh
    else:
        with gzip.open(gz, "rt", encoding="utf-8") as fh:
            yield from fh


def load_beir(path: Path, *, split: str = "test", scope: str = "public") -> Dataset:
    """Any dataset in BEIR layout: corpus.jsonl[.gz], queries.jsonl[.gz], qrels-<split>.tsv
    (or qrels/<split>.tsv)."""
    records = []
    for line in _open(path / "corpus.jsonl"):
        row = json.loads(line)
        records.append(
            ContextDocumentRecord(
                document_id=str(row["_id"]),
                title=row.get("title") or "",
                body=row.get("text") or row.get("title") or "(empty)",
                permission_scope=scope,
                source_system=path.name,
                source_uri=f"beir://{path.name}/{row['_id']}",
            )
        )
    qrels_path = path / f"qrels-{split}.tsv"
    if not qrels_path.exists():
        qrels_path = path / "qrels" / f"{split}.tsv"
    qrels: dict[str, set[str]] = defaultdict(set)
    with qrels_path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            parts = line.rstrip("\n").split("\t")
            if n == 0 and not parts[-1].lstrip("-").isdigit():
                continue  # header
            qid, did, score = parts[0], parts[-2], parts[-1]
            if int(score) > 0:
                qrels[qid].add(did)
    queries = {}
    for line in _open(path / "queries.jsonl"):
        row = json.loads(line)
        if str(row["_id"]) in qrels:
            queries[str(row["_id"])] = row["text"]
    return Dataset(path.name, records, queries, dict(qrels))


def tiny_dataset(n_docs: int = 60, n_queries: int = 12, seed: int = 7) -> Dataset:
    """A generated dataset (topic words + shared filler), for smoke tests of every suite."""
    rng = np.random.default_rng(seed)
    topics = [f"topic{i}" for i in range(n_queries)]
    filler = ["the", "of", "and", "system", "data", "result"]
    filler += ["method", "study", "cell", "protein", "model"]
    records = []
    qrels: dict[str, set[str]] = defaultdict(set)
    for d in range(n_docs):
        t = d % n_queries
        words = [topics[t]] * 3 + list(rng.choice(filler, size=40))
        records.append(
            ContextDocumentRecord(
                document_id=f"d{d}",
                title=f"{topics[t]} report {d}",
                body=" ".join(words),
                permission_scope="public",
                source_uri=f"tiny://{d}",
            )
        )
        qrels[f"q{t}"].add(f"d{d}")
    queries = {f"q{t}": f"what about {topics[t]} data" for t in range(n_queries)}
    return Dataset("tiny", records, queries, dict(qrels))


# -- metrics ------------------------------------------------------------------------------


def ndcg_at(ranked: Sequence[str], relevant: set[str], k: int = 10) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranked[:k]) if d in relevant)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal if ideal else 0.0


def recall_at(ranked: Sequence[str], relevant: set[str], k: int = 100) -> float:
    return len(set(ranked[:k]) & relevant) / len(relevant) if relevant else 0.0


def mrr_at(ranked: Sequence[str], relevant: set[str], k: int = 10) -> float:
    return next((1.0 / (i + 1) for i, d in enumerate(ranked[:k]) if d in relevant), 0.0)


def rank_order(entries: Any, attr: str) -> list[str]:
    """Document ids of rank-log ``entries`` in the order of one arm's rank (``attr``, e.g.
    ``lexical_rank``), leaving out those the arm did not rank."""
    ranked = sorted(
        (e for e in entries if getattr(e, attr) is not None), key=lambda e: getattr(e, attr)
    )
    return [e.doc_id for e in ranked]


def quality(runs: dict[str, list[str]], qrels: dict[str, set[str]]) -> dict[str, float]:
    order = sorted(runs)
    return {
        "ndcg@10": round(statistics.fmean(ndcg_at(runs[q], qrels[q]) for q in order), 4),
        "recall@100": round(statistics.fmean(recall_at(runs[q], qrels[q]) for q in order), 4),
        "mrr@10": round(statistics.fmean(mrr_at(runs[q], qrels[q]) for q in order), 4),
    }


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    xs = sorted(samples_s)
    if not xs:
        return {}

    def p(q: float) -> float:
        return round(1000 * xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))], 2)

    return {"p50_ms": p(0.5), "p95_ms": p(0.95), "p99_ms": p(0.99), "n": len(xs)}


# -- embeddings ---------------------------------------------------------------------------


def make_embedder(name: str) -> Embedder:
    """``minilm`` (the product default runtime), ``minilm-torch|onnx|int8`` or ``hashing``."""
    from context_search.cli.common import make_embedder as cli_embedder

    return cli_embedder(name)


class CachedEmbedder:
    """An embedder with an on-disk cache keyed by model id + SHA-256 of each text, so a
    rerun never embeds the same corpus twice. ``seconds`` counts time spent in the model.

    ``register`` adds vectors for texts directly (generated filler with chosen embeddings).
    """

    def __init__(
        self, inner: Embedder, cache_dir: Path = CACHE / "embeddings", name: str | None = None
    ) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self.scripts = embedder_scripts(inner)  # what the model reads, as the product sees it
        # Keyed by model id: runtimes whose vectors differ (onnx-int8) have their own id;
        # ``name`` keeps a runtime's vectors apart where the id is shared (torch / ONNX).
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name or inner.model_id)
        self._path = cache_dir / f"{safe}-{inner.dimension}.npz"
        self._lock = threading.Lock()
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}
        self._dirty = False
        self.seconds = 0.0
        self.computed = 0
        if self._path.exists():
            data = np.load(self._path)
            for key, row in zip(data["keys"], data["vectors"], strict=True):
                self._vectors[str(key)] = row

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def register(self, texts: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        with self._lock:
            for t, v in zip(texts, vectors, strict=True):
                self._vectors[self.key(t)] = v.astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        keys = [self.key(t) for t in texts]
        with self._lock:
            missing = sorted({i for i, k in enumerate(keys) if k not in self._vectors})
        if missing:
            import time

            start = time.perf_counter()
            fresh = self.inner.embed_documents([texts[i] for i in missing])
            self.seconds += time.perf_counter() - start
            self.computed += len(missing)
            with self._lock:
                for i, v in zip(missing, fresh, strict=True):
                    self._vectors[keys[i]] = v
                self._dirty = True
        with self._lock:
            return np.stack([self._vectors[k] for k in keys]).astype(np.float32)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        key = "q:" + self.key(text)
        with self._lock:
            hit = self._vectors.get(key)
        if hit is not None:
            return hit
        vec = self.inner.embed_query(text)
        with self._lock:
            self._vectors[key] = vec
            self._dirty = True
        return vec

    def save(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._path.parent.mkdir(parents=True, exist_ok=True)
            keys = np.array(list(self._vectors))
            vectors = np.stack(list(self._vectors.values())).astype(np.float32)
            tmp = self._path.with_suffix(".tmp.npz")
            np.savez(tmp, keys=keys, vectors=vectors)
            tmp.replace(self._path)
            self._dirty = False


# -- server and results -------------------------------------------------------------------


@contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """``--dsn`` / ``$CONTEXT_SEARCH_DSN`` if given, else a throwaway embedded server."""
    if dsn or os.environ.get("CONTEXT_SEARCH_DSN"):
        yield resolve_server(dsn).dsn
    else:
        with temporary_server() as handle:
            yield handle.dsn


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def envelope(suite: str, args: Iterable[str]) -> dict[str, Any]:
    return {
        "suite": suite,
        "command": "python -m benchmarks " + " ".join(args),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "machine": machine(),
    }


def write_result(name: str, result: dict[str, Any], out_dir: Path = RESULTS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def update_benchmarks_md(suite: str, markdown: str, path: Path = ROOT / "BENCHMARKS.md") -> None:
    """Replace this suite's section (between markers) in BENCHMARKS.md, or append it."""
    begin, end = f"<!-- bench:{suite} -->", f"<!-- /bench:{suite} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def header(result: dict[str, Any]) -> str:
    m = result["machine"]
    return (
        f"`{result['command']}` — {result['date']}, git `{result['git_revision']}`, "
        f"{m['cpus']} CPUs ({m['processor']}), Python {m['python']}"
    )


def fmt_table(rows: list[list[Any]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Undeclared:
    """The same model, declaring no scripts (so taken to cover every one): what a service's
    own wrapper looks like to fusion."""

    scripts = None

    def __init__(self, inner: CachedEmbedder) -> None:
        self._inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension

    def embed_documents(self, texts: Any) -> Any:
        return self._inner.embed_documents(texts)

    def embed_query(self, text: str) -> Any:
        return self._inner.embed_query(text)

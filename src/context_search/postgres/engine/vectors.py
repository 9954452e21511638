"""How vectors travel to pgvector: the text form of a bound parameter (a search's query
vector, the chunks of a row-path write) and the binary form of a ``COPY`` row.

pgvector-python's ``Vector`` encodes one vector at a time and writes every float's shortest
repr; here a batch's matrix is converted to big-endian float32 at once, and the text form
keeps the 7 significant digits every stored vector was written with.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format

__all__ = ["VectorBytes", "vector_literal", "vector_oid", "vector_rows"]


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


class VectorBytes(bytes):
    """A vector already in pgvector's binary wire format."""


class _BinaryDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def vector_oid(raw: Any) -> int:
    """Teach this connection to send :class:`VectorBytes` as ``vector`` (once per pooled
    connection; only that type is affected) and return the type's oid."""
    try:
        return int(raw.adapters.get_dumper(VectorBytes, PyFormat.BINARY).oid)
    except psycopg.ProgrammingError:
        oid = int(raw.execute("SELECT CAST('public.vector' AS regtype)::oid").fetchone()[0])
        dumper = type("VectorDumper", (_BinaryDumper,), {"oid": oid})
        raw.adapters.register_dumper(VectorBytes, dumper)
        return oid


def vector_rows(vectors: np.ndarray[Any, Any]) -> list[VectorBytes]:
    """Each row of ``vectors`` in pgvector's binary form (big-endian float32 after a
    dimension header), the whole matrix converted at once."""
    n, dim = vectors.shape
    header = struct.pack(">HH", dim, 0)
    big = np.ascontiguousarray(vectors, dtype=">f4")
    return [VectorBytes(header + big[i].tobytes()) for i in range(n)]

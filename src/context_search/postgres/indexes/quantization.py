"""What the vector arm's HNSW graph is built over: ``halfvec`` (the default) or bits.

The default graph holds every vector at two bytes per dimension: 1,170 bytes per chunk at
1M chunks of 384 dimensions, the largest search structure a search walks. A ``binary``
graph holds each vector's signs instead (pgvector's ``binary_quantize``, one bit per
dimension, compared by Hamming distance): 349 bytes per chunk. The vector arm re-ranks the
graph's nearest ``binary_rerank`` x its chunk pool by exact cosine distance over the stored
``halfvec``, so the order, the scores and the evidence are those of exact distances over
the candidates the bits found. The price is reads: every candidate's row is fetched for its
vector and the coarser distances lengthen the walk, about twice the buffers per search, and
their ties can leave a few nodes unreachable by any walk (seen with sparse hashing vectors,
where the ``halfvec`` graph of the same rows reached every node). An
instance whose memory holds the smaller graph but not the larger one gains; one that holds
both loses (``python -m benchmarks quantization``, BENCHMARKS.md#quantization).

Which kind an index has is read from the catalog by every search (the graph's operator
class, ``read/sql/vector.py``), so every connector of every process, and every replica,
follows a conversion (``operations/vector_graph.py``) the moment the new graph is valid.
Large loads rebuild the graph from its own definition, so they keep its kind.
"""

from __future__ import annotations

from typing import Any, Literal

from context_search.postgres.indexes.builds import VECTOR_INDEX, VECTOR_INDEX_NEXT, index_states

__all__ = [
    "VECTOR_KINDS",
    "VectorIndexKind",
    "graph_bytes",
    "vector_dimension",
    "vector_index_definition",
    "vector_index_kind",
]

VectorIndexKind = Literal["halfvec", "binary"]
VECTOR_KINDS: tuple[VectorIndexKind, ...] = ("halfvec", "binary")

#: The graph's build parameters, the same for both kinds (pgvector's defaults): the kinds
#: differ in what a node holds, not in how the graph is linked.
_WITH = "WITH (m = 16, ef_construction = 64)"


def vector_index_definition(kind: VectorIndexKind, dimension: int, name: str = VECTOR_INDEX) -> str:
    """The ``CREATE INDEX`` statement of a graph of ``kind`` over ``dimension``-wide vectors."""
    if kind == "binary":
        column = f"(CAST(binary_quantize(embedding) AS bit({int(dimension)}))) bit_hamming_ops"
    else:
        column = "embedding halfvec_cosine_ops"
    return f"CREATE INDEX {name} ON chunks USING hnsw ({column}) {_WITH}"


def vector_index_kind(raw: Any) -> VectorIndexKind | None:
    """The kind of the vector graph searches walk (``None``: no valid one, e.g. during a large
    load), on a psycopg connection whose search_path starts at the index schema."""
    states = index_states(raw, [VECTOR_INDEX, VECTOR_INDEX_NEXT])
    # A valid graph under the temporary name is the one searches use when the live name's
    # is gone or invalid (a conversion killed between its drop and its rename).
    for name in (VECTOR_INDEX, VECTOR_INDEX_NEXT):
        state = states.get(name)
        if state is not None and state[1]:
            return "binary" if "bit_hamming_ops" in state[0] else "halfvec"
    return None


def vector_dimension(raw: Any) -> int:
    """The vectors' dimension, from the column's type (``halfvec(384)``: typmod 384)."""
    row = raw.execute(
        "SELECT atttypmod FROM pg_attribute "
        "WHERE attrelid = CAST('chunks' AS regclass) AND attname = 'embedding'"
    ).fetchone()
    return int(row[0])


def graph_bytes(raw: Any, name: str) -> int:
    """The bytes of an index, its partitions' included."""
    row = raw.execute(
        "SELECT COALESCE(sum(pg_relation_size(c.oid)), 0) FROM pg_class c "
        "WHERE c.oid = to_regclass(%s) "
        "OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(%s))",
        (name, name),
    ).fetchone()
    return int(row[0])

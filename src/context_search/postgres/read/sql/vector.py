"""The vector arm of the hybrid search statement (``hybrid``): the chunks nearest the
query vector among those the caller may see, grouped to documents.

Few eligible chunks are scored exactly; otherwise pgvector's HNSW index is walked with an
iterative scan, so scope, lifecycle and document filters applied during the scan cannot
leave the pool short. Where one approach gets cheaper than the other depends on how many
chunks the walked graph holds, which for an index partitioned by scope is the caller's
partitions, not the whole table. The graph is over ``halfvec`` or over bits
(``postgres/indexes/quantization.py``); which one is read from the catalog by each search,
and a graph of bits finds candidates that exact distances then order.
"""

from __future__ import annotations

__all__ = [
    "ELIGIBLE_COUNTED",
    "ELIGIBLE_PROBE",
    "EXACT_LIMIT",
    "EXACT_LIMIT_PARTITIONED",
    "IN_FILTERED_DOCS",
    "NEAREST",
    "PARTITIONS",
    "VECTOR",
    "VECTOR_GRAPH",
]


#: Chunks of the filtered documents, as one array computed once (an InitPlan), not a join:
#: a bare chunks scan ordered by distance is what lets the planner use the HNSW index.
IN_FILTERED_DOCS = """
      AND c.doc_id = ANY(ARRAY(SELECT d.doc_id FROM documents d WHERE {filter}))"""

EXACT_LIMIT = """
    -- How many eligible chunks are still cheaper to score exactly than through HNSW. An
    -- exact scan reads every eligible row; an iterative HNSW scan reads about as many
    -- rows as the pool over the eligible share of the index, so the two cross where
    -- eligible^2 ~ exact_scale x (chunks in the index): ~14k eligible of 1M chunks,
    -- ~4.5k of 100k. Chunks in the index from the planner's count (ANALYZE), never
    -- below exact_threshold.
    SELECT CAST(GREATEST({exact_threshold},
                         sqrt({exact_scale} * GREATEST(r.reltuples, 0))) AS bigint) AS rows
    FROM pg_catalog.pg_class r WHERE r.oid = CAST('chunks' AS regclass)
"""

PARTITIONS = """
    SELECT r.reltuples, pg_catalog.obj_description(r.oid, 'pg_class') AS scope,
           pg_catalog.pg_get_expr(r.relpartbound, r.oid) = 'DEFAULT' AS fallback
    FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class r ON r.oid = i.inhrelid
    WHERE i.inhparent = CAST('chunks' AS regclass)
"""

EXACT_LIMIT_PARTITIONED = """
    -- As above, over the chunks of the partitions this search reads (operations/partitions.py):
    -- those of the caller's scopes (each partition's comment names its scope) and the default
    -- partition when one of the scopes has no partition of its own. A scope alone in its
    -- partition has a graph of its own, which an iterative scan walks without skipping.
    SELECT CAST(GREATEST({exact_threshold},
                         sqrt({exact_scale} * COALESCE(sum(GREATEST(p.reltuples, 0)), 0)))
                AS bigint) AS rows
    FROM partitions p
    WHERE CASE WHEN p.fallback THEN EXISTS (
              SELECT 1 FROM unnest(CAST(:scopes AS text[])) AS s(scope)
              WHERE s.scope <> ALL (ARRAY(
                  SELECT q.scope FROM partitions q WHERE NOT q.fallback AND q.scope IS NOT NULL)))
          ELSE p.scope = ANY(CAST(:scopes AS text[])) END
"""

ELIGIBLE_PROBE = """
    -- Bounded count: at most exact_limit + 1 rows are touched, whatever the table size.
    SELECT count(*) <= (SELECT rows FROM exact_limit) AS small FROM (
        SELECT 1 FROM chunks c
        WHERE :vector_used AND c.permission_scope = ANY(CAST(:scopes AS text[]))
          AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){in_docs}
        LIMIT (SELECT rows FROM exact_limit) + 1
    ) probe
"""

ELIGIBLE_COUNTED = """
    -- No document filter: the per-scope counters already count the eligible chunks.
    SELECT COALESCE(sum(s.chunks), 0) <= (SELECT rows FROM exact_limit) AS small
    FROM scope_stats s
    WHERE :vector_used AND s.permission_scope = ANY(CAST(:scopes AS text[]))
      AND s.lifecycle = ANY(CAST(:lifecycles AS text[]))
"""

NEAREST = """
    -- Few eligible chunks: exact distance over exactly those rows (the "+ 0" keeps the
    -- planner off the HNSW index). Otherwise: HNSW with an iterative scan, so filters
    -- applied during the scan cannot leave the pool short. One branch runs; the other is
    -- cut by its one-time filter.
    (SELECT c.doc_id, c.ordinal, c.embedding <=> CAST(:qvec AS halfvec) AS distance
     FROM chunks c
     WHERE :vector_used AND (SELECT small FROM eligible_probe)
       AND c.permission_scope = ANY(CAST(:scopes AS text[]))
       AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){in_docs}
     ORDER BY (c.embedding <=> CAST(:qvec AS halfvec)) + 0
     LIMIT {chunk_pool})
    UNION ALL
    (SELECT c.doc_id, c.ordinal, c.embedding <=> CAST(:qvec AS halfvec) AS distance
     FROM chunks c
     WHERE :vector_used AND NOT (SELECT small FROM eligible_probe)
       AND NOT (SELECT bits FROM vector_graph)
       AND c.permission_scope = ANY(CAST(:scopes AS text[]))
       AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){in_docs}
     ORDER BY c.embedding <=> CAST(:qvec AS halfvec)
     LIMIT {chunk_pool})
    UNION ALL
    -- A graph of bits: its nearest by Hamming distance, ordered again by exact distance.
    (SELECT b.doc_id, b.ordinal, b.embedding <=> CAST(:qvec AS halfvec) AS distance
     FROM (SELECT c.doc_id, c.ordinal, c.embedding
           FROM chunks c
           WHERE :vector_used AND NOT (SELECT small FROM eligible_probe)
             AND (SELECT bits FROM vector_graph)
             AND c.permission_scope = ANY(CAST(:scopes AS text[]))
             AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){in_docs}
           ORDER BY CAST(binary_quantize(c.embedding) AS bit({dimension}))
                    <~> binary_quantize(CAST(:qvec AS halfvec))
           LIMIT {binary_candidates}) b
     ORDER BY 3
     LIMIT {chunk_pool})
"""

VECTOR_GRAPH = """
    -- Whether the live vector graph is over bits: a valid HNSW index of chunks, under the
    -- graph's name or the one a conversion builds it under, whose operator class is
    -- Hamming distance on bit strings (postgres/indexes/quantization.py).
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
        JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
        JOIN pg_catalog.pg_am a ON a.oid = x.relam
        JOIN pg_catalog.pg_opclass o ON o.oid = i.indclass[0]
        WHERE i.indrelid = CAST('chunks' AS regclass) AND i.indisvalid
          AND x.relname IN ('ix_chunks_embedding_hnsw', 'ix_chunks_embedding_next')
          AND a.amname = 'hnsw' AND o.opcname = 'bit_hamming_ops') AS bits
"""

VECTOR = """
    SELECT doc_id, vector_similarity, vector_chunk,
           row_number() OVER (ORDER BY vector_similarity DESC, doc_id) AS vector_rank
    FROM (
        SELECT DISTINCT ON (doc_id) doc_id, 1 - distance AS vector_similarity,
               ordinal AS vector_chunk
        FROM nearest
        WHERE CAST(:min_sim AS double precision) IS NULL
           OR 1 - distance >= CAST(:min_sim AS double precision)
        ORDER BY doc_id, distance, ordinal
    ) best
    ORDER BY vector_similarity DESC, doc_id
    LIMIT {pool}
"""

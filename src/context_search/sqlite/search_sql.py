"""The search statement: both arms, fusion and grouping to documents in one SQL statement.

Lexical arm: FTS5's postings (``chunk_vocab``) give each query term's frequency per chunk;
BM25 (k1 = 1.2, b = 0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5)), the formula of the
other backends) is summed per chunk in SQL. FTS5's built-in ``bm25()`` is not used because
its N, df and average length are table-wide: a score would move when a document the caller
cannot see is added (the ``scores_independent_of_hidden_documents`` rule), and the hidden
documents would be measurable. Here every statistic is counted over ``visible_chunks``.
Phrases and negations are checked by ``chunk_fts MATCH`` on the chunk.

Vector arm: exact cosine (``vec_distance_cosine``, sqlite-vec or its numpy stand-in) over
the eligible visible chunks; exact is fine at the sizes a single file serves.

Each arm keeps the best chunk per document (ties: lowest ordinal), ranks documents (ties:
doc id) and is cut to the pool; fusion is RRF or convex as defined in ``fusion.py``. The
first row carries the counts the stats report; the rest are the candidates, best first.
"""

from __future__ import annotations

import json
from typing import Any

from context_search.contract import ScoreParts
from context_search.fusion import FusionSettings
from context_search.responses import Candidate, Ranking
from context_search.sqlite.codec import LexicalPlan, decode_token
from context_search.sqlite.reads import Reader

__all__ = ["SEARCH_SQL", "run_search"]

_ADMITTED = "WHERE o.chunk_id IN (SELECT rowid FROM chunk_fts WHERE chunk_fts MATCH :match)"

_TEMPLATE = """
WITH
qterms(term) AS (SELECT DISTINCT value FROM json_each(:terms)),
vis AS MATERIALIZED (SELECT chunk_id, doc_id, ordinal, length FROM visible_chunks),
corpus AS (
  SELECT count(*) AS n,
         CASE WHEN sum(length) > 0 THEN sum(length) * 1.0 / count(*) ELSE 1.0 END AS avglen
  FROM vis),
postings AS MATERIALIZED (
  SELECT v.term AS term, v.doc AS chunk_id, count(*) AS tf
  FROM qterms q JOIN chunk_vocab v ON v.term = q.term
  GROUP BY v.term, v.doc),
occ AS MATERIALIZED (
  SELECT p.term, p.chunk_id, p.tf, vis.doc_id, vis.ordinal, vis.length
  FROM postings p JOIN vis ON vis.chunk_id = p.chunk_id),
idf AS (
  SELECT term, ln(1.0 + ((SELECT n FROM corpus) - count(*) + 0.5) / (count(*) + 0.5)) AS idf
  FROM occ GROUP BY term),
chunk_scores AS MATERIALIZED (
  SELECT o.doc_id, o.ordinal,
         sum(idf.idf * o.tf * 2.2
             / (o.tf + 1.2 * (0.25 + 0.75 * o.length / corpus.avglen))) AS score,
         json_group_array(o.term) AS terms
  FROM occ o JOIN idf ON idf.term = o.term CROSS JOIN corpus
  {admitted}
  GROUP BY o.chunk_id),
best_lex AS MATERIALIZED (
  SELECT doc_id, score, ordinal, terms FROM (
    SELECT *, row_number() OVER (PARTITION BY doc_id ORDER BY score DESC, ordinal) AS rn
    FROM chunk_scores)
  WHERE rn = 1),
docs AS MATERIALIZED (
  SELECT doc_id,
         (:include_superseded OR lifecycle = 'active') AS live_ok,
         ((:targets IS NULL OR doc_id IN (SELECT value FROM json_each(:targets)))
          AND (:filter IS NULL OR cs_filter(record, :filter))) AS filter_ok
  FROM visible_documents),
lex AS MATERIALIZED (
  SELECT b.doc_id, b.score, b.ordinal, b.terms,
         row_number() OVER (ORDER BY b.score DESC, b.doc_id) AS lexical_rank
  FROM best_lex b JOIN docs d ON d.doc_id = b.doc_id
  WHERE d.live_ok AND d.filter_ok
  ORDER BY b.score DESC, b.doc_id LIMIT :pool),
vchunks AS (
  SELECT c.doc_id, c.ordinal, 1.0 - vec_distance_cosine(c.embedding, :qvec) AS sim
  FROM visible_chunks c JOIN docs d ON d.doc_id = c.doc_id
  WHERE :qvec IS NOT NULL AND d.live_ok AND d.filter_ok
    AND length(c.embedding) = length(:qvec)),
vbest AS (
  SELECT doc_id, sim, ordinal FROM (
    SELECT *, row_number() OVER (PARTITION BY doc_id ORDER BY sim DESC, ordinal) AS rn
    FROM vchunks)
  WHERE rn = 1 AND (:min_sim IS NULL OR sim >= :min_sim)),
vec AS MATERIALIZED (
  SELECT doc_id, sim, ordinal, row_number() OVER (ORDER BY sim DESC, doc_id) AS vector_rank
  FROM vbest ORDER BY sim DESC, doc_id LIMIT :pool),
ids AS (SELECT doc_id FROM lex UNION SELECT doc_id FROM vec),
top AS (SELECT coalesce(max(score), 0.0) AS top_lexical FROM lex),
fused AS (
  SELECT ids.doc_id, lex.lexical_rank, lex.score AS lexical_score, vec.vector_rank,
         vec.sim AS vector_similarity, coalesce(lex.ordinal, vec.ordinal) AS chunk_ordinal,
         lex.terms,
         CASE WHEN :method = 'rrf' THEN
           coalesce(1.0 / (:k + lex.lexical_rank), 0.0)
           + :vw * coalesce(1.0 / (:k + vec.vector_rank), 0.0)
         ELSE
           :w * (CASE WHEN top.top_lexical > 0
                      THEN coalesce(lex.score, 0.0) / top.top_lexical ELSE 0.0 END)
           + (1.0 - :w) * :vw * max(coalesce(vec.sim, 0.0), 0.0)
         END AS fused
  FROM ids LEFT JOIN lex ON lex.doc_id = ids.doc_id LEFT JOIN vec ON vec.doc_id = ids.doc_id
       CROSS JOIN top)
SELECT * FROM (
  SELECT 0 AS stats_row, NULL AS doc_id,
         (SELECT count(*) FROM best_lex) AS lexical_rank,
         (SELECT count(*) FROM best_lex b JOIN docs d ON d.doc_id = b.doc_id
          WHERE NOT d.live_ok) AS lexical_score,
         (SELECT count(*) FROM best_lex b JOIN docs d ON d.doc_id = b.doc_id
          WHERE d.live_ok AND NOT d.filter_ok) AS vector_rank,
         (SELECT count(*) FROM lex) AS vector_similarity,
         (SELECT count(*) FROM vec) AS chunk_ordinal,
         NULL AS terms, NULL AS fused
  UNION ALL
  SELECT 1, doc_id, lexical_rank, lexical_score, vector_rank, vector_similarity,
         chunk_ordinal, terms, fused
  FROM fused)
ORDER BY stats_row, fused DESC, doc_id
"""

#: The statement without and with the phrase/negation check (the only variable part).
SEARCH_SQL = (_TEMPLATE.format(admitted=""), _TEMPLATE.format(admitted=_ADMITTED))


def run_search(
    reader: Reader,
    lexical: LexicalPlan,
    *,
    query_vector: bytes | None,
    fusion: FusionSettings,
    vector_weight: float,
    include_superseded: bool,
    targets: tuple[str, ...] | None,
    filter_key: str | None,
    min_similarity: float | None,
) -> Ranking:
    params: dict[str, Any] = {
        "terms": json.dumps(list(lexical.terms)),
        "qvec": query_vector,
        "pool": fusion.pool_size,
        "method": fusion.method,
        "k": float(fusion.rrf_k),
        "w": float(fusion.lexical_weight),
        "vw": float(vector_weight),
        "include_superseded": int(include_superseded),
        "targets": None if targets is None else json.dumps(list(targets)),
        "filter": filter_key,
        "min_sim": min_similarity,
    }
    statement = SEARCH_SQL[0]
    if lexical.match is not None:
        statement = SEARCH_SQL[1]
        params["match"] = lexical.match
    stats, *rows = reader.execute(statement, params)
    candidates = [
        Candidate.of(
            doc_id=r[1],
            parts=ScoreParts(
                lexical_rank=r[2],
                lexical_score=r[3],
                vector_rank=r[4],
                vector_similarity=r[5],
                fused=float(r[8]),
            ),
            terms=tuple(sorted(decode_token(t) for t in json.loads(r[7]))) if r[7] else (),
            chunk_ordinal=r[6],
        )
        for r in rows
    ]
    return Ranking(
        candidates=candidates,
        lexical_pool=int(stats[5]),
        vector_pool=int(stats[6]),
        lexical_matches=int(stats[2]),
        lifecycle_filtered=int(stats[3]),
        filter_filtered=int(stats[4]),
    )

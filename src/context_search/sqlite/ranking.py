"""Both arms, fusion and grouping to documents, over the caller's scope arrays.

Lexical arm: the postings (``postings.py``) give each query term's frequency per chunk;
only the chunks in the caller's arrays (``snapshot.py``) count, for every statistic: BM25
(k1 = 1.2, b = 0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5)), the other backends'
formula) with N, df and the average length over exactly the visible chunks. FTS5's
``bm25()`` is not used: its statistics are table-wide, so a score would move when a
document the caller cannot see is added (``scores_independent_of_hidden_documents``), and
the hidden documents would be measurable. Phrases and negations are checked by
``chunk_fts MATCH``.

Vector arm: exact cosine over the unit vectors of the eligible visible chunks, one matrix
product per scope.

Each arm keeps the best chunk per document (ties: lowest ordinal), ranks documents (ties:
doc id) and is cut to the pool; fusion is :meth:`FusionSettings.fuse`, the one definition
every backend's rank log is checked against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from context_search.fusion import ArmPlan, ArmScores, FusionSettings, fused_candidates
from context_search.responses import Ranking
from context_search.sqlite.codec import LexicalPlan, decode_token, record_from_json
from context_search.sqlite.postings import READ_POSTINGS, read_postings
from context_search.sqlite.reads import Reader
from context_search.sqlite.snapshot import ScopeArrays
from context_search.validation import FilterClause, record_matches

__all__ = ["SEARCH_STATEMENTS", "rank"]

_K1, _B = 1.2, 0.75

_ADMITTED = "SELECT rowid FROM chunk_fts WHERE chunk_fts MATCH :match ORDER BY rowid"
_RECORDS = "SELECT doc_id, record FROM visible_documents"

#: The statements a search runs besides the loads, for the structural test.
SEARCH_STATEMENTS = (READ_POSTINGS, _ADMITTED, _RECORDS)


@dataclass(frozen=True, slots=True)
class _Best:
    """In one scope (its index among the caller's): the best chunk of each document an arm
    found, as positions into the scope's arrays, with its score."""

    scope: int
    docs: npt.NDArray[np.int64]
    chunks: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float64]

    def where(self, keep: npt.NDArray[np.bool_]) -> _Best:
        return _Best(self.scope, self.docs[keep], self.chunks[keep], self.scores[keep])


def _distinct(docs: npt.NDArray[np.int64], size: int) -> int:
    """How many different documents ``docs`` names (positions below ``size``), in linear
    time: ``np.unique`` sorts, a tenth of a search at 100k chunks."""
    return int(np.count_nonzero(np.bincount(docs, minlength=size)))


def _best_per_document(
    scope: int,
    part: ScopeArrays,
    chunks: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    pool: int,
) -> _Best:
    """The highest-scoring chunk (the lowest ordinal on a tie) of each document among
    ``chunks`` that can be among the ``pool`` best documents.

    Sorting every chunk was most of an arm's time. Only the strongest chunks are sorted: if
    those at or above some score belong to at least ``pool`` documents, no other document's
    best chunk can outrank theirs, and each of them has its best chunk among them."""
    wanted = 2 * pool
    while wanted < len(chunks):
        floor = np.partition(scores, len(scores) - wanted)[len(scores) - wanted]
        keep = scores >= floor
        if _distinct(part.doc[chunks[keep]], len(part.doc_ids)) >= pool:
            chunks, scores = chunks[keep], scores[keep]
            break
        wanted *= 4
    docs = part.doc[chunks]
    order = np.lexsort((part.ordinals[chunks], -scores, docs))
    docs, chunks, scores = docs[order], chunks[order], scores[order]
    first = np.flatnonzero(np.r_[len(docs) > 0, docs[1:] != docs[:-1]])  # sorted by document
    return _Best(scope, docs[first], chunks[first], scores[first])


def _eligible(
    reader: Reader,
    parts: Sequence[ScopeArrays],
    include_superseded: bool,
    targets: tuple[str, ...] | None,
    filters: tuple[FilterClause, ...],
) -> tuple[list[npt.NDArray[np.bool_]], list[npt.NDArray[np.bool_]]]:
    """Per scope and document: whether its lifecycle may be shown, and whether the
    document filter and targets admit it."""
    verdicts: dict[str, bool] | None = None
    if filters:
        verdicts = {
            str(d): record_matches(record_from_json(r), filters)
            for d, r in reader.execute(_RECORDS, {})
        }
    wanted = None if targets is None else frozenset(targets)
    live, passed = [], []
    for p in parts:
        live.append(np.ones(len(p.doc_ids), np.bool_) if include_superseded else p.active)
        if wanted is None and verdicts is None:
            passed.append(np.ones(len(p.doc_ids), np.bool_))
            continue
        passed.append(
            np.array(
                [
                    (wanted is None or d in wanted) and (verdicts is None or verdicts.get(d, False))
                    for d in p.doc_ids
                ],
                dtype=np.bool_,
            )
        )
    return live, passed


def _lexical(
    reader: Reader, parts: Sequence[ScopeArrays], plan: LexicalPlan
) -> tuple[
    list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64]]],
    list[tuple[str, list[npt.NDArray[np.int64]]]],
]:
    """Per scope: the admitted chunks holding a query term, with their BM25; and per term
    that matched anything, the sorted chunk positions holding it in each scope."""
    n = sum(p.size for p in parts)
    if not plan.terms or n == 0:
        return [], []
    total = float(sum(float(p.lengths.sum()) for p in parts))
    avglen = total / n if total > 0 else 1.0
    scores = [np.zeros(p.size) for p in parts]
    matched = [np.zeros(p.size, np.bool_) for p in parts]
    hits: list[tuple[str, list[npt.NDArray[np.int64]]]] = []
    for term in sorted(set(plan.terms)):
        found = _postings(reader, parts, term)
        df = sum(len(pos) for pos, _ in found)
        if df == 0:
            continue
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        for i, (p, (pos, tf)) in enumerate(zip(parts, found, strict=True)):
            norm = _K1 * (1 - _B + _B * p.lengths[pos] / avglen)
            scores[i][pos] += idf * tf * (_K1 + 1) / (tf + norm)
            matched[i][pos] = True
        hits.append((term, [pos for pos, _ in found]))
    admitted = None
    if plan.match is not None:
        rows = reader.execute(_ADMITTED, {"match": plan.match})
        admitted = np.array([r[0] for r in rows], dtype=np.int64)
    out = []
    for i, p in enumerate(parts):
        keep = matched[i]
        if admitted is not None:
            keep = keep & np.isin(p.chunk_ids, admitted, assume_unique=True)
        chunks = np.flatnonzero(keep).astype(np.int64)
        if len(chunks):
            out.append((i, chunks, scores[i][chunks]))
    return out, hits


def _postings(
    reader: Reader, parts: Sequence[ScopeArrays], term: str
) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """Per scope: the positions of the chunks holding ``term`` and its frequency in each.

    The postings cover every scope; a scope's share is kept with its arrays (they are
    replaced when the scope changes), so a term's postings are read from the file once per
    scope generation, not once per query: the terms queries share are the common ones,
    whose postings are the longest."""
    out = []
    read: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None
    for p in parts:
        held = p.postings.get(term)
        if held is None:
            if read is None:
                read = read_postings(reader.execute(READ_POSTINGS, {"term": term}))
            ids, tfs = read
            pos = np.searchsorted(p.chunk_ids, ids)
            ok = pos < p.size
            ok[ok] = p.chunk_ids[pos[ok]] == ids[ok]
            held = (pos[ok], tfs[ok])
            p.remember(term, *held)
        out.append(held)
    return out


def _matched_terms(
    hits: Sequence[tuple[str, list[npt.NDArray[np.int64]]]],
    scope: int,
    chunks: npt.NDArray[np.int64],
) -> list[list[str]]:
    """Per chunk (positions in scope ``scope``): the query terms it holds. A term's positions
    are sorted, so each chunk is looked up by bisection (``np.isin`` sorted every term's
    postings again, a tenth of a search)."""
    out: list[list[str]] = [[] for _ in range(len(chunks))]
    for term, at in hits:
        held = at[scope]
        if not len(held):
            continue
        pos = np.minimum(np.searchsorted(held, chunks), len(held) - 1)
        word = decode_token(term)
        for k in np.flatnonzero(held[pos] == chunks).tolist():
            out[k].append(word)
    return out


def _vector(
    parts: Sequence[ScopeArrays],
    query_vector: npt.NDArray[np.float32],
    eligible: Sequence[npt.NDArray[np.bool_]],
    min_similarity: float | None,
    pool: int,
) -> list[_Best]:
    norm = float(np.linalg.norm(query_vector))
    q = (query_vector / norm if norm > 0 else query_vector).astype(np.float32)
    best = []
    for i, (p, ok) in enumerate(zip(parts, eligible, strict=True)):
        chunks = np.flatnonzero(p.has_vector & ok[p.doc]) if p.size else np.zeros(0, np.int64)
        if not len(chunks):
            continue
        sims = (p.vectors @ q).astype(np.float64)  # every row: a copy of the selected
        b = _best_per_document(i, p, chunks, sims[chunks], pool)  # rows would cost more
        if min_similarity is not None:
            b = b.where(b.scores >= min_similarity)
        best.append(b)
    return best


def _top(
    parts: Sequence[ScopeArrays], best: Sequence[_Best], pool: int
) -> list[tuple[float, str, _Best, int]]:
    """(score, doc id, its scope's best, position in it) of the ``pool`` best documents, by
    score then doc id: the score of the pool-th is found with a partition, so only the
    documents at or above it are sorted in Python."""
    scores = np.concatenate([b.scores for b in best]) if best else np.zeros(0)
    if len(scores) > pool:
        floor = float(np.partition(scores, len(scores) - pool)[len(scores) - pool])
    else:
        floor = -math.inf
    rows = [
        (float(b.scores[k]), parts[b.scope].doc_ids[int(b.docs[k])], b, k)
        for b in best
        for k in np.flatnonzero(b.scores >= floor).tolist()
    ]
    rows.sort(key=lambda r: (-r[0], r[1]))
    return rows[:pool]


def rank(
    reader: Reader,
    parts: Sequence[ScopeArrays],
    plan: LexicalPlan,
    *,
    query_vector: npt.NDArray[np.float32] | None,
    fusion: FusionSettings,
    arm_plan: ArmPlan,
    include_superseded: bool,
    targets: tuple[str, ...] | None,
    filters: tuple[FilterClause, ...],
    min_similarity: float | None,
) -> Ranking:
    """Fused candidates among the caller's scope arrays ``parts`` (its read transaction's
    snapshot), best first, with the counts the stats report."""
    live, passed = _eligible(reader, parts, include_superseded, targets, filters)
    lexical, hits = _lexical(reader, parts, plan)
    lifecycle_filtered = filter_filtered = matches = 0
    shown = []
    for i, chunks, scores in lexical:
        docs = parts[i].doc[chunks]
        found = np.flatnonzero(np.bincount(docs, minlength=len(parts[i].doc_ids)))
        ok_live, ok_filter = live[i][found], passed[i][found]
        matches += len(found)
        lifecycle_filtered += int((~ok_live).sum())
        filter_filtered += int((ok_live & ~ok_filter).sum())
        keep = (live[i] & passed[i])[docs]
        if keep.any():
            shown.append(
                _best_per_document(i, parts[i], chunks[keep], scores[keep], fusion.pool_size)
            )
    arms: dict[str, ArmScores] = {}
    lex = _top(parts, shown, fusion.pool_size)
    terms: dict[tuple[int, int], list[str]] = {}
    for scope in {b.scope for _, _, b, _ in lex}:
        chunks = np.array([int(b.chunks[k]) for _, _, b, k in lex if b.scope == scope], np.int64)
        terms.update(
            ((scope, int(c)), t)
            for c, t in zip(chunks, _matched_terms(hits, scope, chunks), strict=True)
        )
    for position, (score, doc_id, b, k) in enumerate(lex, 1):
        chunk = int(b.chunks[k])
        arms[doc_id] = ArmScores(
            lexical_rank=position,
            lexical_score=score,
            chunk_ordinal=int(parts[b.scope].ordinals[chunk]),
            terms=tuple(sorted(terms[(b.scope, chunk)])),
        )
    vec: list[tuple[float, str, _Best, int]] = []
    if query_vector is not None:
        eligible = [a & b for a, b in zip(live, passed, strict=True)]
        vec = _top(
            parts,
            _vector(parts, query_vector, eligible, min_similarity, fusion.pool_size),
            fusion.pool_size,
        )
    for position, (sim, doc_id, b, k) in enumerate(vec, 1):
        a = arms.setdefault(doc_id, ArmScores())
        a.vector_rank, a.vector_similarity = position, sim
        if a.chunk_ordinal is None:
            a.chunk_ordinal = int(parts[b.scope].ordinals[int(b.chunks[k])])
    candidates, weights = fused_candidates(arms, fusion, arm_plan)
    return Ranking(
        candidates=candidates,
        lexical_pool=len(lex),
        vector_pool=len(vec),
        lexical_matches=matches,
        lifecycle_filtered=lifecycle_filtered,
        filter_filtered=filter_filtered,
        weights=weights,
    )

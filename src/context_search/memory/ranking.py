"""Ranking for the in-memory reference connector: the PostgreSQL adapter's method in Python.

BM25 over chunks (best chunk per document) and cosine similarity over chunk vectors, each
arm cut to ``pool_size`` documents, fused by reciprocal rank or by a convex combination
of the normalised lexical score and the similarity. Lexical statistics (document
frequency, average length) are computed over every chunk the caller may see, so a score
never reveals that an invisible document shares a term; filters and targets only limit
which documents become candidates.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from context_search.contract import ContextDocumentRecord, Lifecycle
from context_search.embedding import Embedder
from context_search.fusion import ArmPlan, ArmScores, FusionSettings, fused_candidates
from context_search.responses import Ranking
from context_search.text import Chunk, parse_query
from context_search.text.stemming import index_terms
from context_search.validation import ValidQuery, record_matches

__all__ = ["Stored", "rank"]

_BM25_K1 = 1.2
_BM25_B = 0.75


@dataclass(slots=True)
class Stored:
    """The current record plus the index entries, which may have been built from an older
    version of it (deferred indexing): visibility always follows ``record``/``lifecycle``,
    the searchable text follows the entries."""

    record: ContextDocumentRecord
    lifecycle: Lifecycle
    superseded_by: str | None
    chunks: list[Chunk]
    chunk_terms: list[Counter[str]]
    vectors: npt.NDArray[np.float32]
    indexed_content_id: str | None
    indexed_masks: frozenset[str] = frozenset()
    chunk_tokens: list[tuple[str, ...]] = field(default_factory=list)


def rank(
    visible: Sequence[Stored],
    vq: ValidQuery,
    embedder: Embedder,
    fusion: FusionSettings,
    plan: ArmPlan,
    text_search_config: str,
) -> Ranking:
    """Fused candidates among ``visible`` (the caller's live documents) for ``vq``; the
    vector arm runs only when ``plan`` gives it weight."""
    lexical = _bm25(visible, _LexicalQuery.parse(vq.text, text_search_config))
    eligible: list[Stored] = []
    lifecycle_filtered = filter_filtered = 0
    targets = None if vq.targets is None else frozenset(vq.targets)
    for s in visible:
        matched = s.record.document_id in lexical
        if s.lifecycle is Lifecycle.SUPERSEDED and not vq.include_superseded:
            lifecycle_filtered += matched
        elif not record_matches(s.record, vq.filters) or (
            targets is not None and s.record.document_id not in targets
        ):
            filter_filtered += matched
        else:
            eligible.append(s)
    arms: dict[str, ArmScores] = {}
    lex = sorted(
        (
            (lexical[s.record.document_id], s.record.document_id)
            for s in eligible
            if s.record.document_id in lexical
        ),
        key=lambda t: (-t[0][0], t[1]),
    )
    for position, ((score, chunk, terms), doc_id) in enumerate(lex[: fusion.pool_size], 1):
        arms[doc_id] = ArmScores(
            lexical_rank=position,
            lexical_score=score,
            chunk_ordinal=chunk,
            terms=tuple(sorted(terms)),
        )
    sims: list[tuple[float, int, str]] = []
    if plan.vector_used:
        qvec = embedder.embed_query(vq.text)
        for s in eligible:
            if len(s.vectors):
                per_chunk = s.vectors @ qvec
                best = int(np.argmax(per_chunk))
                if vq.min_similarity is None or per_chunk[best] >= vq.min_similarity:
                    sims.append((float(per_chunk[best]), best, s.record.document_id))
    sims.sort(key=lambda t: (-t[0], t[2]))
    for position, (sim, chunk, doc_id) in enumerate(sims[: fusion.pool_size], 1):
        a = arms.setdefault(doc_id, ArmScores())
        a.vector_rank, a.vector_similarity = position, sim
        if a.chunk_ordinal is None:
            a.chunk_ordinal = chunk
    candidates, weights = fused_candidates(arms, fusion, plan)
    return Ranking(
        candidates=candidates,
        lexical_pool=min(len(lex), fusion.pool_size),
        vector_pool=min(len(sims), fusion.pool_size),
        lexical_matches=len(lexical),
        lifecycle_filtered=lifecycle_filtered,
        filter_filtered=filter_filtered,
        weights=weights,
    )


@dataclass(frozen=True, slots=True)
class _LexicalQuery:
    """The query syntax of ``text.query`` in terms of index tokens: any positive term may
    match; every phrase must occur in order in the chunk; no negated word or phrase may."""

    terms: tuple[str, ...]
    phrases: tuple[tuple[str, ...], ...]
    negated: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, text: str, config: str) -> _LexicalQuery:
        parsed = parse_query(text)

        def seq(part: str) -> tuple[str, ...]:
            return tuple(index_terms(part, for_query=True, config=config))

        return cls(
            terms=seq(parsed.positive_text),
            phrases=tuple(p for p in map(seq, parsed.phrases) if p),
            negated=tuple(n for n in map(seq, parsed.negated) if n),
        )

    def admits(self, tokens: Sequence[str]) -> bool:
        return all(_contains(tokens, p) for p in self.phrases) and not any(
            _contains(tokens, n) for n in self.negated
        )


def _contains(tokens: Sequence[str], phrase: Sequence[str]) -> bool:
    n = len(phrase)
    first = phrase[0]
    return any(
        tokens[i] == first and tuple(tokens[i : i + n]) == tuple(phrase)
        for i in range(len(tokens) - n + 1)
    )


def _bm25(docs: Iterable[Stored], query: _LexicalQuery) -> dict[str, tuple[float, int, set[str]]]:
    """Best-chunk BM25 per document over the chunks the query admits; statistics over every
    given (visible) chunk."""
    docs = list(docs)
    terms = set(query.terms)
    if not terms:
        return {}
    n = sum(len(s.chunk_terms) for s in docs)
    if n == 0:
        return {}
    lengths = [sum(ct.values()) for s in docs for ct in s.chunk_terms]
    avg = sum(lengths) / n or 1.0
    df = Counter(t for s in docs for ct in s.chunk_terms for t in terms if t in ct)
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms if df[t]}
    check = bool(query.phrases or query.negated)
    out: dict[str, tuple[float, int, set[str]]] = {}
    for s in docs:
        for ordinal, ct in enumerate(s.chunk_terms):
            hit = {t for t in idf if t in ct}
            if not hit or (check and not query.admits(s.chunk_tokens[ordinal])):
                continue
            length = sum(ct.values())
            score = sum(
                idf[t]
                * ct[t]
                * (_BM25_K1 + 1)
                / (ct[t] + _BM25_K1 * (1 - _BM25_B + _BM25_B * length / avg))
                for t in hit
            )
            doc_id = s.record.document_id
            if doc_id not in out or score > out[doc_id][0]:
                out[doc_id] = (score, ordinal, hit)
    return out

"""Fusion settings and arithmetic, one definition for every backend.

The PostgreSQL adapter computes the same formulas in SQL (``postgres/read/sql/hybrid.py`` and,
for the arms' evidence, ``postgres/read/sql/evidence.py``); the in-memory and SQLite
connectors fuse their arms with :func:`fused_candidates`, and ``explain``'s arithmetic uses
:func:`fuse_from_params`, so a rank log reproduces the same order and the same vector weight
whichever backend wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from context_search.responses import Candidate
from context_search.text.scripts import coverage

__all__ = [
    "MIN_COVERAGE",
    "ArmEvidence",
    "ArmPlaces",
    "ArmPlan",
    "ArmScores",
    "ArmWeights",
    "FusionMethod",
    "FusionSettings",
    "Weighting",
    "arm_evidence",
    "fuse_from_params",
    "fused_candidates",
    "plan_arms",
]

FusionMethod = Literal["rrf", "convex"]


class ArmPlaces(Protocol):
    """A candidate's place in each arm: :class:`~context_search.contract.ScoreParts`, a rank
    log's entries, or the connectors' own per-arm records, read alike without copying."""

    @property
    def lexical_rank(self) -> int | None: ...
    @property
    def lexical_score(self) -> float | None: ...
    @property
    def vector_rank(self) -> int | None: ...
    @property
    def vector_similarity(self) -> float | None: ...


#: ``evidence``: the vector arm's weight follows what its own pool and the lexical arm's say
#: about this query (:func:`arm_evidence`); ``fixed``: the weight the arm plan gives.
Weighting = Literal["evidence", "fixed"]


@dataclass(frozen=True, slots=True)
class FusionSettings:
    """``rrf``: ``1 / (rrf_k + lexical rank) + vector_weight / (rrf_k + vector rank)`` over
    the arms that found the document. ``convex``: ``lexical_weight`` x lexical score / best
    lexical score + ``(1 - lexical_weight) x vector_weight`` x cosine similarity (negative
    similarities count as 0). ``pool_size`` bounds each arm; ``vector_weight`` is decided
    per query (:func:`plan_arms`, then :func:`arm_evidence` unless ``weighting`` is
    ``fixed``) and recorded in the rank log's params.

    Convex is the default: RRF's scores for neighbouring lexical ranks differ by a few
    ten-thousandths, so any vector weight at all reorders a lexical arm's confident head,
    and a weak vector arm drags it down; a convex combination moves it only as far as
    the cosines actually differ (see BENCHMARKS.md#fusion for the table across data sets
    and embedders)."""

    method: FusionMethod = "convex"
    rrf_k: int = 60
    lexical_weight: float = 0.5
    pool_size: int = 100
    weighting: Weighting = "evidence"

    def params(self, vector_weight: float = 1.0) -> dict[str, float]:
        """Everything needed to recompute every fused score."""
        if self.method == "rrf":
            out = {"k": float(self.rrf_k), "pool_size": float(self.pool_size)}
        else:
            out = {"lexical_weight": self.lexical_weight, "pool_size": float(self.pool_size)}
        out["vector_weight"] = vector_weight
        return out

    def log_params(self, weights: ArmWeights) -> dict[str, float]:
        """The rank log's params: :meth:`params` at the weight applied, and the signals
        that set it (``script_weight``, ``evidence_*``: see :class:`ArmEvidence`)."""
        out = self.params(weights.vector_weight)
        if weights.evidence is not None:
            out.update(weights.evidence.params(weights.script_weight))
        return out

    def weigh(self, plan: ArmPlan, evidence: ArmEvidence | None) -> ArmWeights:
        """The vector arm's weight for one search: the arm plan's, times the evidence's
        factor when this fusion weighs by evidence; the notes say why."""
        if self.weighting == "fixed" or evidence is None or not plan.vector_used:
            return ArmWeights(plan.vector_weight, None, plan.notes)
        return ArmWeights(plan.vector_weight, evidence, (*plan.notes, *evidence.notes()))


def fuse_from_params(
    method: FusionMethod, params: Mapping[str, float], parts: ArmPlaces, top_lexical: float
) -> float:
    """A fused score from a rank log's method and params (the definition both backends
    implement; the conformance suite recomputes rank logs with the same formula)."""
    vector_weight = params.get("vector_weight", 1.0)
    if method == "rrf":
        k = params["k"]
        lexical = 1.0 / (k + parts.lexical_rank) if parts.lexical_rank is not None else 0.0
        vector = 1.0 / (k + parts.vector_rank) if parts.vector_rank is not None else 0.0
        return lexical + vector_weight * vector
    w = params["lexical_weight"]
    lex_norm = (parts.lexical_score or 0.0) / top_lexical if top_lexical > 0 else 0.0
    sim = max(parts.vector_similarity or 0.0, 0.0)
    return w * lex_norm + (1.0 - w) * vector_weight * sim


#: Below this share of the query in scripts the embedder covers, its vector is mostly noise.
MIN_COVERAGE = 0.5


@dataclass(frozen=True, slots=True)
class ArmPlan:
    """How much the vector arm counts for one query, and the note saying why."""

    vector_weight: float
    notes: tuple[str, ...] = ()

    @property
    def vector_used(self) -> bool:
        return self.vector_weight > 0


def plan_arms(query: str, scripts: frozenset[str] | None, model_id: str) -> ArmPlan:
    """The vector arm's weight for ``query``: the share of its words in scripts the embedder
    covers (``scripts=None``: it covers every script), and none below :data:`MIN_COVERAGE`,
    where the query embedding is closer to noise than to meaning and would only push good
    lexical matches down. The note names the uncovered scripts for the rank log."""
    share, counts = coverage(query, scripts)
    if share >= 1.0 or scripts is None:
        return ArmPlan(vector_weight=1.0)
    foreign = ", ".join(sorted(s for s in counts if s not in scripts))
    covered = ", ".join(sorted(scripts))
    if share < MIN_COVERAGE:
        return ArmPlan(
            vector_weight=0.0,
            notes=(
                f"vector arm skipped: {1 - share:.0%} of the query is in {foreign}, which "
                f"{model_id} does not cover (it covers {covered})",
            ),
        )
    return ArmPlan(
        vector_weight=round(share, 4),
        notes=(
            f"vector arm weighted {share:.2f}: part of the query is in {foreign}, which "
            f"{model_id} does not cover (it covers {covered})",
        ),
    )


#: The heads of the two arms compared for agreement.
EVIDENCE_HEAD = 10
#: With fewer documents in the vector arm's pool there is no tail to measure chance by.
EVIDENCE_MIN_POOL = 12
#: This many documents at the head of both arms: they corroborate each other.
AGREEMENT_FULL = 2
#: A best similarity this many tail widths above chance gives the vector arm full weight.
EXCESS_FULL = 2.0


@dataclass(frozen=True, slots=True)
class ArmEvidence:
    """What one query's candidates say about the vector arm, needing no declaration.

    An embedder that cannot read a query (another script, or no signal at all) still ranks
    every document; what gives it away is the shape of its pool. The similarities at the
    top of N draws spread like an exponential tail, so the mean excess of the pool's tail
    over its last similarity (ranks 11 to K-1) measures that tail's width beta, and by
    chance the best similarity stands ``H(K-1)`` (the harmonic number) widths above the
    last. ``excess`` is how far above that the best one is: about 0 for noise, several for
    an arm that found something. ``agreement`` counts the documents at the head of both
    arms. ``factor`` scales the arm's weight: 1 with ``AGREEMENT_FULL`` shared heads more
    than chance gives, else ``excess / EXCESS_FULL`` clipped to [0, 1], and 1 (today's
    fusion) when the evidence is inconclusive (``excess`` None): a pool too small or flat,
    or no lexical candidate to prefer. PostgreSQL computes the same arithmetic in SQL
    (``postgres/read/sql/evidence.py``)."""

    vector_pool: int
    agreement: int
    excess: float | None
    factor: float

    def params(self, script_weight: float) -> dict[str, float]:
        out = {
            "script_weight": script_weight,
            "evidence_factor": self.factor,
            "evidence_agreement": float(self.agreement),
            "evidence_pool": float(self.vector_pool),
        }
        if self.excess is not None:
            out["evidence_excess"] = self.excess
        return out

    def notes(self) -> tuple[str, ...]:
        if self.factor >= 1.0:
            return ()
        return (
            f"vector arm weighted {self.factor:.2f} by its evidence: its best similarity "
            f"stands {self.excess:.2f} tail widths above chance and the arms share "
            f"{self.agreement} of their top {EVIDENCE_HEAD}",
        )


def evidence_factor(excess: float | None, agreement: int, pool: int) -> float:
    """1 when inconclusive or when the heads agree beyond chance (two heads of ``pool``
    documents share ``EVIDENCE_HEAD**2 / pool`` by chance), else the clipped excess."""
    if excess is None or agreement >= AGREEMENT_FULL + EVIDENCE_HEAD * EVIDENCE_HEAD / pool:
        return 1.0
    return min(max(excess / EXCESS_FULL, 0.0), 1.0)


def arm_evidence(parts: Iterable[ArmPlaces]) -> ArmEvidence:
    """The evidence of one query's fused candidates (every one, as the rank log lists them).
    Sums run in rank order, term by term, as PostgreSQL's ordered aggregates do, so both
    compute the same floating-point values."""
    lexical = False
    agreement = 0
    ranked: list[tuple[int, float]] = []
    for p in parts:
        lexical = lexical or p.lexical_rank is not None
        if p.vector_rank is not None:
            ranked.append((p.vector_rank, p.vector_similarity or 0.0))
            if p.lexical_rank is not None and max(p.lexical_rank, p.vector_rank) <= EVIDENCE_HEAD:
                agreement += 1
    ranked.sort()
    k = len(ranked)
    excess: float | None = None
    if lexical and k >= EVIDENCE_MIN_POOL:
        best, last = ranked[0][1], ranked[-1][1]
        width = 0.0
        for _, sim in ranked[EVIDENCE_HEAD : k - 1]:
            width += sim - last
        width /= k - 1 - EVIDENCE_HEAD
        if width > 0:
            chance = 0.0
            for j in range(1, k):
                chance += 1.0 / j
            excess = (best - last) / width - chance
    return ArmEvidence(k, agreement, excess, evidence_factor(excess, agreement, k))


@dataclass(frozen=True, slots=True)
class ArmWeights:
    """The vector arm's weight in one search: the arm plan's (``script_weight``) times the
    evidence's factor (``evidence`` None: fixed weighting, or no vector arm)."""

    script_weight: float
    evidence: ArmEvidence | None
    notes: tuple[str, ...] = ()

    @property
    def vector_weight(self) -> float:
        if self.evidence is None:
            return self.script_weight
        return self.script_weight * self.evidence.factor


@dataclass(slots=True)
class ArmScores:
    """One document's place in each arm, as the connectors that rank in Python collect it
    (in-memory, SQLite) before :func:`fused_candidates` fuses them. ``chunk_ordinal`` is the
    lexical arm's best chunk when it found one, else the vector arm's."""

    lexical_rank: int | None = None
    lexical_score: float | None = None
    vector_rank: int | None = None
    vector_similarity: float | None = None
    chunk_ordinal: int | None = None
    terms: tuple[str, ...] = ()


def fused_candidates(
    arms: Mapping[str, ArmScores], fusion: FusionSettings, plan: ArmPlan
) -> tuple[list[Candidate], ArmWeights]:
    """Candidates fused by the one definition every rank log is checked against, best first
    (ties: doc id), and the vector arm's weight they were fused with: the arm plan's, times
    what the arms' evidence says (:func:`~context_search.fusion.arm_evidence`). Convex fusion
    normalises by the best lexical score among them.

    The arms' records are read as they are and the params built once per search: per
    candidate, copying them into score parts and rebuilding the params was a third of a
    SQLite search."""
    weights = fusion.weigh(plan, arm_evidence(arms.values()))
    top_lexical = max((a.lexical_score or 0.0 for a in arms.values()), default=0.0)
    params = fusion.params(weights.vector_weight)
    method = fusion.method
    candidates = [
        Candidate.of(
            doc_id, a, fuse_from_params(method, params, a, top_lexical), a.terms, a.chunk_ordinal
        )
        for doc_id, a in arms.items()
    ]
    candidates.sort(key=lambda c: (-c.entry.fused, c.doc_id))
    return candidates, weights

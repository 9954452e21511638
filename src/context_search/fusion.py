"""Fusion settings and arithmetic, one definition for every backend.

The PostgreSQL adapter computes the same formulas in SQL (``postgres/read/sql/hybrid.py``); the
in-memory connector and ``explain``'s arithmetic use :meth:`FusionSettings.fuse`, so a rank
log reproduces the same order whichever backend wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from context_search.contract import ScoreParts
from context_search.text.scripts import coverage

__all__ = [
    "MIN_COVERAGE",
    "ArmPlan",
    "FusionMethod",
    "FusionSettings",
    "fuse_from_params",
    "plan_arms",
]

FusionMethod = Literal["rrf", "convex"]


@dataclass(frozen=True, slots=True)
class FusionSettings:
    """``rrf``: ``1 / (rrf_k + lexical rank) + vector_weight / (rrf_k + vector rank)`` over
    the arms that found the document. ``convex``: ``lexical_weight`` x lexical score / best
    lexical score + ``(1 - lexical_weight) x vector_weight`` x cosine similarity (negative
    similarities count as 0). ``pool_size`` bounds each arm; ``vector_weight`` is decided
    per query by :func:`plan_arms` and recorded in the rank log's params."""

    method: FusionMethod = "rrf"
    rrf_k: int = 60
    lexical_weight: float = 0.5
    pool_size: int = 100

    def params(self, vector_weight: float = 1.0) -> dict[str, float]:
        """The rank log's params: everything needed to recompute every fused score."""
        if self.method == "rrf":
            out = {"k": float(self.rrf_k), "pool_size": float(self.pool_size)}
        else:
            out = {"lexical_weight": self.lexical_weight, "pool_size": float(self.pool_size)}
        out["vector_weight"] = vector_weight
        return out

    def fuse(self, parts: ScoreParts, top_lexical: float, vector_weight: float = 1.0) -> float:
        return fuse_from_params(self.method, self.params(vector_weight), parts, top_lexical)


def fuse_from_params(
    method: FusionMethod, params: Mapping[str, float], parts: ScoreParts, top_lexical: float
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

"""Fusion settings and arithmetic, one definition for every backend.

The PostgreSQL adapter computes the same formulas in SQL (``postgres/search_sql.py``); the
in-memory connector and ``explain``'s arithmetic use :meth:`FusionSettings.fuse`, so a rank
log reproduces the same order whichever backend wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from context_search.contract import ScoreParts

__all__ = ["FusionMethod", "FusionSettings"]

FusionMethod = Literal["rrf", "convex"]


@dataclass(frozen=True, slots=True)
class FusionSettings:
    """``rrf``: sum of ``1 / (rrf_k + rank)`` over the arms that found the document.
    ``convex``: ``lexical_weight`` x lexical score / best lexical score + the rest x cosine
    similarity (negative similarities count as 0). ``pool_size`` bounds each arm."""

    method: FusionMethod = "rrf"
    rrf_k: int = 60
    lexical_weight: float = 0.5
    pool_size: int = 100

    def params(self) -> dict[str, float]:
        if self.method == "rrf":
            return {"k": float(self.rrf_k), "pool_size": float(self.pool_size)}
        return {"lexical_weight": self.lexical_weight, "pool_size": float(self.pool_size)}

    def fuse(self, parts: ScoreParts, top_lexical: float) -> float:
        if self.method == "rrf":
            return sum(
                1.0 / (self.rrf_k + r)
                for r in (parts.lexical_rank, parts.vector_rank)
                if r is not None
            )
        lex_norm = (parts.lexical_score or 0.0) / top_lexical if top_lexical > 0 else 0.0
        sim = max(parts.vector_similarity or 0.0, 0.0)
        return self.lexical_weight * lex_norm + (1.0 - self.lexical_weight) * sim

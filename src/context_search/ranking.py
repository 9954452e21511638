"""The cut from fused candidates to hits, shared by every connector.

Backends differ in how they produce the fused order; what happens after — ``min_score``,
``top_k`` and the ``final_rank`` the rank_log records — must be identical, or the same
rank_log would mean different things on different backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from context_search.contract import RankLogEntry

__all__ = ["Cut", "cut_to_hits"]


@dataclass(frozen=True, slots=True)
class Cut:
    entries: tuple[RankLogEntry, ...]  # every candidate, with final_rank set for the kept ones
    kept: tuple[int, ...]  # positions (into the input) of the hits, in rank order
    below_min_score: int


def cut_to_hits(
    ordered: Sequence[RankLogEntry], *, top_k: int | None, min_score: float | None
) -> Cut:
    """Keep candidates in fused order that reach ``min_score``, at most ``top_k`` of them.

    ``top_k=None`` ranks every passing candidate, which is what ``explain`` reports.
    """
    entries: list[RankLogEntry] = []
    kept: list[int] = []
    below = 0
    for i, entry in enumerate(ordered):
        passes = min_score is None or entry.fused >= min_score
        below += not passes
        keep = passes and (top_k is None or len(kept) < top_k)
        if keep:
            kept.append(i)
        entries.append(replace(entry, final_rank=len(kept) if keep else None))
    return Cut(entries=tuple(entries), kept=tuple(kept), below_min_score=below)

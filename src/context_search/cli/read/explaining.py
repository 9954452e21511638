"""``explain``'s human output: which arms found the document, what each added to its fused
score, and why it ranks where it does — in words, from the explanation's fields alone (the
same on every backend), never a Python repr."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console

from context_search.contract import Lifecycle, RankExplanation, ScoreParts

__all__ = ["explanation_lines", "print_explanation"]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _weights(method: str, params: Mapping[str, float]) -> str:
    v = params.get("vector_weight", 1.0)
    if "evidence_factor" in params and params["evidence_factor"] < 1.0:
        # The weight is the plan's times the evidence's: show both, the notes say why.
        v_text = (
            f"{v:.3g} = {params.get('script_weight', 1.0):g} x evidence "
            f"{params['evidence_factor']:.3g}"
        )
    else:
        v_text = f"{v:g}"
    if method == "rrf":
        return f"rrf, k={params.get('k', 60.0):g}, vector weight {v_text}"
    return f"convex, lexical weight {params.get('lexical_weight', 0.5):g}, vector weight {v_text}"


def _contributions(
    method: str, params: Mapping[str, float], parts: ScoreParts
) -> tuple[float, float]:
    """What each arm added to the fused score (the rank log's formula, split by arm)."""
    v = params.get("vector_weight", 1.0)
    if method == "rrf":
        k = params.get("k", 60.0)
        lexical = 1.0 / (k + parts.lexical_rank) if parts.lexical_rank is not None else 0.0
        vector = v / (k + parts.vector_rank) if parts.vector_rank is not None else 0.0
        return lexical, vector
    w = params.get("lexical_weight", 0.5)
    vector = (1.0 - w) * v * max(parts.vector_similarity or 0.0, 0.0)
    return parts.fused - vector, vector


def explanation_lines(exp: RankExplanation, *, top_k: int, include_superseded: bool) -> list[str]:
    """The explanation as plain lines: verdict, each arm, the fusion, filters, notes."""
    parts = exp.score_parts
    if exp.final_rank is None:
        verdict = "not ranked"
    elif exp.matched:
        verdict = f"matched, ranked {_ordinal(exp.final_rank)}"
    else:
        verdict = f"not a match, though ranked {_ordinal(exp.final_rank)}"
    lines = [f"{exp.doc_id}: {verdict} ({exp.lifecycle.value})"]
    weight = exp.params.get("vector_weight", 1.0)
    lexical, vector = _contributions(exp.method, exp.params, parts) if parts else (0.0, 0.0)
    if parts is None:
        lines.append("arms: a candidate of neither arm (the notes say why)")
    elif parts.lexical_rank is None:
        lines.append("lexical: no query term matched its text")
    else:
        terms = ", ".join(exp.matched_terms) or "-"
        lines.append(
            f"lexical: matched {terms}; BM25 {parts.lexical_score or 0.0:.4g}, "
            f"{_ordinal(parts.lexical_rank)} in the lexical arm, adds {lexical:.4g}"
        )
    if parts is None:
        pass
    elif exp.params.get("script_weight", weight) <= 0:
        lines.append("vector: not used for this query (weight 0, see the notes)")
    elif parts.vector_rank is None:
        lines.append("vector: not among the vector arm's candidates")
    else:
        sim = parts.vector_similarity or 0.0
        counts = (
            "counts as a match"
            if exp.vector_matched
            else "no evidence of a match (similarity not above 0)"
        )
        lines.append(
            f"vector: similarity {sim:.3f}, {_ordinal(parts.vector_rank)} in the vector arm, "
            f"adds {vector:.4g}; {counts}"
        )
    if parts is not None:
        lines.append(f"fused: {parts.fused:.6g} ({_weights(exp.method, exp.params)})")
        if exp.fusion_arithmetic:
            lines.append(f"  = {exp.fusion_arithmetic}")
    if exp.final_rank is not None and exp.final_rank > top_k:
        lines.append(
            f"rank: beyond the top {top_k}, so a search with -k {top_k} does not show it "
            f"(-k {exp.final_rank} would)"
        )
    elif exp.final_rank is not None:
        lines.append(f"rank: within the top {top_k}, so a search with -k {top_k} shows it")
    if exp.lifecycle is Lifecycle.SUPERSEDED and not include_superseded:
        lines.append("superseded: searches leave it out; add --include-superseded to rank it")
    for field, passed in exp.filter_verdicts:
        lines.append(f"filter {field}: {'pass' if passed else 'fail'}")
    lines.extend(f"note: {n}" for n in exp.notes if not n.startswith("superseded:"))
    if exp.served_by is not None:
        lines.append(f"served by: {exp.served_by.role} {exp.served_by.server}")
    return lines


def print_explanation(
    exp: RankExplanation, *, top_k: int, include_superseded: bool, console: Console | None = None
) -> None:
    console = console or Console()
    for line in explanation_lines(exp, top_k=top_k, include_superseded=include_superseded):
        console.print(line, highlight=False, markup=False)

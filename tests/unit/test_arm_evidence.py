"""The arms' evidence about the vector arm: noise gets little weight, a pool whose head
stands out or agrees with the lexical arm gets full weight, and too little to measure
leaves today's fusion."""

from __future__ import annotations

import numpy as np
import pytest

from context_search import InMemorySearchConnector, SearchQuery
from context_search.cli.read.explaining import explanation_lines
from context_search.conformance.corpus import TEAM, NoiseEmbedder, passage_corpus
from context_search.contract import ScoreParts
from context_search.fusion import (
    EVIDENCE_MIN_POOL,
    ArmPlan,
    FusionSettings,
    arm_evidence,
)

pytestmark = pytest.mark.unit


def _parts(sims: list[float], lexical: dict[int, int]) -> list[ScoreParts]:
    """Candidates for a vector pool ranked by ``sims`` (descending); ``lexical`` maps a
    vector rank to the lexical rank of the same document."""
    ranked = sorted(sims, reverse=True)
    return [
        ScoreParts(
            lexical_rank=lexical.get(i),
            lexical_score=None if i not in lexical else 10.0 / lexical[i],
            vector_rank=i,
            vector_similarity=s,
            fused=0.0,
        )
        for i, s in enumerate(ranked, 1)
    ]


def _noise_pool(rng: np.random.Generator, corpus: int = 5000, pool: int = 100) -> list[float]:
    """The best ``pool`` cosines of a random query against ``corpus`` random documents."""
    return sorted((rng.standard_normal(corpus) * 0.05).tolist(), reverse=True)[:pool]


def test_a_vector_arm_of_noise_gets_little_weight() -> None:
    rng = np.random.default_rng(7)
    factors = []
    for _ in range(200):
        drawn = rng.choice(np.arange(1, 101), 30, replace=False)
        lexical = {int(r): i for i, r in enumerate(drawn, 1)}
        factors.append(arm_evidence(_parts(_noise_pool(rng), lexical)).factor)
    assert np.mean(factors) < 0.5
    assert np.median(factors) < 0.3


def test_a_head_that_stands_out_gets_full_weight() -> None:
    rng = np.random.default_rng(3)
    sims = [0.82, 0.78, 0.75, *_noise_pool(rng)[:97]]
    evidence = arm_evidence(_parts(sims, {50: 1, 60: 2}))
    assert evidence.excess is not None and evidence.excess > 2
    assert evidence.factor == 1.0 and evidence.agreement == 0


def test_heads_agreeing_beyond_chance_give_full_weight_to_a_flat_pool() -> None:
    rng = np.random.default_rng(5)
    sims = _noise_pool(rng)
    flat = arm_evidence(_parts(sims, {40: 1, 41: 2}))
    agreeing = arm_evidence(_parts(sims, {1: 1, 2: 2, 3: 3}))
    assert flat.factor < 1.0
    assert agreeing.agreement == 3 and agreeing.factor == 1.0
    # In a pool of 20 documents, two heads of 10 share 5 by chance: 3 is no evidence.
    evenly = [0.5 - 0.01 * i for i in range(20)]
    small = arm_evidence(_parts(evenly, {1: 1, 2: 2, 3: 3}))
    assert small.agreement == 3 and small.factor < 1.0


def test_the_excess_is_the_best_over_the_last_in_tail_widths_less_chance() -> None:
    # Even spacing 0.01: ranks 11..19 stand 0.09..0.01 above the last (mean 0.05), the
    # best 0.19 above it, and chance H(19) widths: excess 0.19 / 0.05 - H(19).
    evenly = [0.5 - 0.01 * i for i in range(20)]
    evidence = arm_evidence(_parts(evenly, {15: 1}))
    chance = sum(1.0 / j for j in range(1, 20))
    assert evidence.excess == pytest.approx(0.19 / 0.05 - chance, abs=1e-12)
    assert evidence.factor == pytest.approx(evidence.excess / 2)
    # The smallest pool measured: one tail rank (the 11th) above the 12th.
    twelve = [1.0 - 0.1 * i for i in range(EVIDENCE_MIN_POOL)]
    at_least = arm_evidence(_parts(twelve, {12: 1}))
    chance = sum(1.0 / j for j in range(1, EVIDENCE_MIN_POOL))
    assert at_least.excess == pytest.approx(1.1 / 0.1 - chance, abs=1e-9)


@pytest.mark.parametrize(
    ("sims", "lexical"),
    [
        ([0.5 - 0.01 * i for i in range(EVIDENCE_MIN_POOL - 1)], {1: 1}),  # pool too small
        ([0.5 - 0.01 * i for i in range(50)], {}),  # no lexical candidate to prefer
        ([0.3] * 50, {5: 1}),  # a flat pool: no tail to measure
    ],
    ids=["small-pool", "no-lexical", "flat"],
)
def test_inconclusive_evidence_leaves_todays_fusion(
    sims: list[float], lexical: dict[int, int]
) -> None:
    evidence = arm_evidence(_parts(sims, lexical))
    assert evidence.excess is None and evidence.factor == 1.0


def test_fixed_weighting_ignores_the_evidence_and_evidence_weighting_says_why() -> None:
    rng = np.random.default_rng(11)
    evidence = arm_evidence(_parts(_noise_pool(rng), {70: 1}))
    assert evidence.factor < 1.0
    plan = ArmPlan(vector_weight=0.75, notes=("part of the query is uncovered",))
    fixed = FusionSettings(weighting="fixed").weigh(plan, evidence)
    assert fixed.vector_weight == 0.75 and fixed.evidence is None
    assert "evidence_factor" not in FusionSettings(weighting="fixed").log_params(fixed)
    weighed = FusionSettings().weigh(plan, evidence)
    assert weighed.vector_weight == pytest.approx(0.75 * evidence.factor)
    assert weighed.notes[0] == plan.notes[0] and "by its evidence" in weighed.notes[1]
    params = FusionSettings().log_params(weighed)
    assert params["script_weight"] == 0.75
    assert params["evidence_factor"] == evidence.factor
    assert params["vector_weight"] == weighed.vector_weight


def test_explain_shows_the_plan_and_the_evidence_behind_a_lowered_weight() -> None:
    with InMemorySearchConnector(embedder=NoiseEmbedder()) as c:
        corpus = passage_corpus()
        c.upsert(corpus)
        lowered = []
        for record in corpus:
            query = SearchQuery(query=" ".join(record.body.split()[:8]), allowed_scopes=[TEAM])
            params = c.search(query).rank_log.params
            if params["evidence_factor"] < 1.0:
                lowered.append((record.document_id, query, params))
        assert lowered, "a noise embedder's arm is weighed down for some query"
        doc_id, query, params = lowered[0]
        explanation = c.explain(doc_id, query)
        text = " ".join(explanation_lines(explanation, top_k=10, include_superseded=False))
        factor = params["evidence_factor"]
        assert f"vector weight {params['vector_weight']:.3g} = 1 x evidence {factor:.3g}" in text
        assert "by its evidence" in text  # the note saying why

"""Result cases: provenance on hits, reproducible rank_log, explain, gaps, masks, filters."""

from __future__ import annotations

import itertools

from context_search.conformance._registry import ConformanceFailure, case, check
from context_search.conformance.corpus import PUBLIC, TEAM, standard_corpus, ts
from context_search.contract import (
    ContextDocumentRecord,
    GapReport,
    RankLog,
    SearchConnector,
    SearchQuery,
    content_id_for,
)
from context_search.fusion import arm_evidence, fuse_from_params
from context_search.rerank import final_order


def _q(text: str, **kw: object) -> SearchQuery:
    kw.setdefault("allowed_scopes", [TEAM, PUBLIC])
    return SearchQuery(query=text, **kw)  # type: ignore[arg-type]


@case("results")
def hits_carry_provenance(c: SearchConnector) -> None:
    """Every hit has source, scope, lifecycle, score_parts and an exact byte-offset snippet."""
    c.upsert(standard_corpus())
    resp = c.search(_q("aurora service outages", top_k=20))
    check(len(resp.hits) >= 3, f"expected several hits, got {len(resp.hits)}")
    for hit in resp.hits:
        check(hit.source_system and hit.source_uri, f"{hit.doc_id}: missing source")
        check(hit.permission_scope in (TEAM, PUBLIC), f"{hit.doc_id}: bad scope")
        check(hit.lifecycle == "active", f"{hit.doc_id}: lifecycle {hit.lifecycle}")
        check(
            hit.score_parts is not None and abs(hit.score_parts.fused - hit.score) < 1e-9,
            f"{hit.doc_id}: score_parts.fused != score",
        )
        check(
            hit.score_parts.lexical_rank is not None or hit.score_parts.vector_rank is not None,
            f"{hit.doc_id}: score_parts name no arm",
        )
        doc = c.get_document(hit.doc_id, [TEAM, PUBLIC])
        check(doc is not None, f"{hit.doc_id}: hit not readable by get_document")
        assert doc is not None
        raw = doc.body.encode("utf-8")
        check(
            0 <= hit.start_byte <= hit.end_byte <= len(raw), f"{hit.doc_id}: offsets outside body"
        )
        check(
            raw[hit.start_byte : hit.end_byte].decode("utf-8") == hit.snippet,
            f"{hit.doc_id}: snippet is not the byte slice of the body",
        )
        check(hit.content_id == doc.content_id, f"{hit.doc_id}: content_id mismatch")


def _recompute(log: RankLog) -> list[tuple[str, float]]:
    top = max((x.lexical_score or 0.0 for x in log.entries), default=0.0)
    return [(e.doc_id, fuse_from_params(log.method, log.params, e, top)) for e in log.entries]


def _weight_follows_evidence(log: RankLog, what: str) -> None:
    """The vector weight a rank log was fused with is the one its own candidates give
    (:func:`~context_search.fusion.arm_evidence`), when the fusion weighs by evidence."""
    params = log.params
    if "evidence_factor" not in params:
        return
    ev = arm_evidence(log.entries)
    logged = (
        params.get("evidence_excess"),
        params["evidence_agreement"],
        params["evidence_pool"],
        params["evidence_factor"],
    )
    excess_ok = (ev.excess is None) == (logged[0] is None) and (
        ev.excess is None or abs(ev.excess - (logged[0] or 0.0)) <= 1e-9
    )
    check(
        excess_ok
        and (logged[1], logged[2]) == (ev.agreement, ev.vector_pool)
        and abs(logged[3] - ev.factor) <= 1e-9
        and abs(params["vector_weight"] - params["script_weight"] * ev.factor) <= 1e-9,
        f"{what}: fused with vector weight {params['vector_weight']} and evidence "
        f"{logged}, its candidates give {ev}",
    )


@case("results")
def rank_log_reproduces_order(c: SearchConnector) -> None:
    """rank_log entries recompute every fused score and the exact final order of the hits."""
    c.upsert(standard_corpus())
    resp = c.search(_q("aurora basalt restart", top_k=4))
    log = resp.rank_log
    check(log.method in ("rrf", "convex"), f"unknown method {log.method}")
    check(len(log.entries) >= len(resp.hits), "rank_log has fewer entries than hits")
    for (doc_id, fused), e in zip(_recompute(log), log.entries, strict=True):
        check(abs(fused - e.fused) < 1e-6, f"{doc_id}: fused {e.fused} != recomputed {fused}")
    _weight_follows_evidence(log, "aurora basalt restart")
    order = final_order(log)  # fused order, or a reranking stage's when the log has one
    ranked = [e.doc_id for e in order if e.final_rank is not None]
    check(
        ranked[: len(resp.hits)] == [h.doc_id for h in resp.hits],
        f"rank_log order {ranked} does not reproduce hits {[h.doc_id for h in resp.hits]}",
    )
    check(
        [e.final_rank for e in order if e.final_rank is not None][: len(resp.hits)]
        == list(range(1, len(resp.hits) + 1)),
        "final_rank values are not 1..n",
    )
    lex = sorted(
        (e for e in log.entries if e.lexical_rank is not None), key=lambda e: e.lexical_rank or 0
    )
    check(
        all((a.lexical_score or 0) >= (b.lexical_score or 0) for a, b in itertools.pairwise(lex)),
        "lexical ranks disagree with lexical scores",
    )
    vec = sorted(
        (e for e in log.entries if e.vector_rank is not None), key=lambda e: e.vector_rank or 0
    )
    check(
        all(
            (a.vector_similarity or 0) >= (b.vector_similarity or 0) - 1e-6
            for a, b in itertools.pairwise(vec)
        ),
        "vector ranks disagree with similarities",
    )
    by_id = {e.doc_id: e for e in log.entries}
    for hit in resp.hits:
        e = by_id[hit.doc_id]
        check(
            (e.lexical_rank, e.vector_rank)
            == (hit.score_parts.lexical_rank, hit.score_parts.vector_rank),
            f"{hit.doc_id}: score_parts disagree with rank_log",
        )


@case("results")
def top_k_and_min_score(c: SearchConnector) -> None:
    """top_k bounds the hits (a prefix of a larger top_k); min_score drops and counts."""
    c.upsert(standard_corpus())
    wide = c.search(_q("aurora", top_k=10))
    one = c.search(_q("aurora", top_k=1))
    check(
        len(one.hits) == 1 and one.hits[0].doc_id == wide.hits[0].doc_id,
        "top_k=1 is not the first hit of a wider search",
    )
    high = c.search(_q("aurora", top_k=10, min_score=wide.hits[0].score + 1.0))
    check(high.hits == (), "min_score above every score still returned hits")
    check(
        high.stats.min_score_filtered == high.stats.candidates > 0,
        f"min_score drops not counted: {high.stats}",
    )


@case("results")
def explain_agrees_with_search(c: SearchConnector) -> None:
    """explain of a returned hit reports its rank and the same score_parts."""
    c.upsert(standard_corpus())
    query = _q("basalt compaction")
    resp = c.search(query)
    check(resp.hits, "no hits to explain")
    top = resp.hits[0]
    exp = c.explain(top.doc_id, query)
    check(exp.matched and exp.final_rank == 1, f"explain of top hit: {exp}")
    check(exp.score_parts == top.score_parts, "explain score_parts differ from the hit")
    check("basalt" in exp.matched_terms, f"matched_terms lack the query term: {exp.matched_terms}")
    miss = c.explain("doc-public-cobalt", query)
    check(
        not miss.matched or (miss.final_rank or 0) > 1,
        f"explain claims an unrelated doc ranks first: {miss}",
    )
    # A rank is not a match: the vector arm ranks every document it reaches, so a match
    # also needs a query term in the text or a positive similarity from a weighted arm.
    for doc_id in ("doc-team-aurora", "doc-public-cobalt", "doc-team-dolomite"):
        other = c.explain(doc_id, query)
        parts = other.score_parts
        vector = (
            parts is not None
            and parts.vector_rank is not None
            and other.params.get("vector_weight", 1.0) > 0
            and (parts.vector_similarity or 0.0) > 0
        )
        lexical = parts is not None and parts.lexical_rank is not None
        check(
            other.lexical_matched == lexical
            and other.vector_matched == vector
            and other.matched == (other.final_rank is not None and (lexical or vector)),
            f"explain's matched disagrees with its arms' evidence: {other}",
        )
    check(
        exp.lexical_matched
        and bool(exp.params)
        and all(resp.rank_log.params.get(k) == v for k, v in exp.params.items()),
        f"explain of the top hit: lexical_matched or params wrong: {exp}",
    )
    check(
        exp.fusion_arithmetic.endswith(f"= {top.score:.6g}"),
        f"explain's fusion arithmetic does not end in the hit's score: {exp.fusion_arithmetic}",
    )
    filtered = _q("basalt compaction", filters={"source_system": "git", "tags": "ops"})
    verdict = c.explain("doc-team-basalt", filtered)
    check(
        verdict.filter_verdicts == (("source_system", True), ("tags", False))
        and not verdict.filters_passed
        and not verdict.matched,
        f"filter verdicts wrong: {verdict.filter_verdicts}, passed={verdict.filters_passed}",
    )


@case("gaps")
def gap_report_stable_id(c: SearchConnector) -> None:
    """report_gap: same report -> same gap_id and a receipt; a different reason -> new id."""
    report = GapReport(
        query="How is aurora failover tested?",
        allowed_scopes=[TEAM],
        reason="no runbook covers failover",
        requester="agent-1",
    )
    first = c.report_gap(report)
    again = c.report_gap(
        GapReport(
            query="  how is AURORA failover tested? ",
            allowed_scopes=[TEAM, TEAM],
            reason=report.reason,
            requester="agent-2",
        )
    )
    other = c.report_gap(
        GapReport(query=report.query, allowed_scopes=[TEAM], reason="runbook is outdated")
    )
    check(first.gap_id == again.gap_id, "same gap got different ids")
    check(first.gap_id != other.gap_id, "different gaps got the same id")
    check(
        first.status == "recorded" and again.status == "duplicate",
        f"statuses {first.status}/{again.status}",
    )
    check(again.occurrences == 2, f"occurrences {again.occurrences} != 2")
    check(first.received_at.tzinfo is not None, "receipt time is not timezone-aware")


_MASKED = ContextDocumentRecord(
    document_id="doc-team-masked",
    title="Quartz payroll export",
    body="The quartz export job writes payroll rows for the finance team.",
    permission_scope=TEAM,
    owner="eve",
    source_system="hr",
    source_uri="hr://quartz",
    metadata={"email": "eve@example.org", "region": "eu"},
    field_mask=("owner", "metadata.email"),
    pii_flags=("title",),
)


@case("masks")
def field_mask_hides_fields(c: SearchConnector) -> None:
    """field_mask / pii_flags fields are absent from get_document, hits and the index."""
    c.upsert([_MASKED])
    doc = c.get_document("doc-team-masked", [TEAM])
    check(doc is not None, "masked document unreadable")
    assert doc is not None
    check(
        doc.owner == "" and doc.title == "" and "email" not in doc.metadata,
        f"masked fields returned: owner={doc.owner!r} title={doc.title!r} {doc.metadata}",
    )
    check({"owner", "title", "metadata.email"} <= set(doc.masked_fields), "masked_fields wrong")
    resp = c.search(_q("quartz export"))
    check([h.doc_id for h in resp.hits] == ["doc-team-masked"], "masked doc not found by body")
    hit = resp.hits[0]
    check(hit.title == "" and "email" not in hit.metadata, "masked fields in the hit")
    title_only = c.search(_q("Quartz payroll export"))
    check(all(h.title == "" for h in title_only.hits), "masked title returned via search")


@case("masks")
def masked_body_not_indexed(c: SearchConnector) -> None:
    """A masked body is neither searchable nor returned; the title still finds the document."""
    c.upsert(
        [
            ContextDocumentRecord(
                document_id="doc-team-sealed",
                title="Sealed onyx memo",
                body="The obsidian merger closes in March.",
                permission_scope=TEAM,
                field_mask=("body",),
            )
        ]
    )
    check(
        all(
            h.doc_id != "doc-team-sealed" or h.snippet == ""
            for h in c.search(_q("obsidian merger", top_k=5)).hits
        ),
        "masked body text returned in a snippet",
    )
    lexical = [
        h for h in c.search(_q("obsidian merger")).hits if h.score_parts.lexical_rank is not None
    ]
    check(lexical == [], "masked body matched lexically")
    found = c.search(_q("onyx memo"))
    check([h.doc_id for h in found.hits][:1] == ["doc-team-sealed"], "title no longer findable")
    doc = c.get_document("doc-team-sealed", [TEAM])
    check(doc is not None and doc.body == "", "masked body returned by get_document")


@case("masks")
def filter_on_masked_field_does_not_match(c: SearchConnector) -> None:
    """Filtering on a masked field's value matches nothing (the value cannot be probed)."""
    c.upsert([_MASKED])
    check(
        c.search(_q("quartz", filters={"owner": "eve"})).hits == (),
        "filter on masked owner matched",
    )
    check(
        c.search(_q("quartz", filters={"metadata.email": "eve@example.org"})).hits == (),
        "filter on masked metadata matched",
    )
    check(
        c.search(_q("quartz", filters={"metadata.region": "eu"})).hits != (),
        "filter on unmasked metadata failed",
    )


@case("filters")
def filters_equality_in_range(c: SearchConnector) -> None:
    """Equality, ``in``, tag containment, datetime and numeric ranges filter correctly."""
    c.upsert(standard_corpus())

    def ids(filters: dict[str, object]) -> set[str]:
        return {
            h.doc_id
            for h in c.search(_q("aurora basalt cobalt dolomite", top_k=50, filters=filters)).hits
        }

    expectations: list[tuple[dict[str, object], set[str]]] = [
        ({"source_system": "git"}, {"doc-team-basalt"}),
        ({"owner": {"in": ["bob", "carol"]}}, {"doc-team-basalt", "doc-public-cobalt"}),
        ({"tags": "ops"}, {"doc-team-aurora", "doc-public-cobalt"}),
        ({"tags": {"in": ["design", "pipeline"]}}, {"doc-team-basalt", "doc-team-dolomite"}),
        (
            {"updated_at": {"gte": ts(13)}, "department": {"in": ["support", "data"]}},
            {"doc-public-cobalt", "doc-team-dolomite"},
        ),
        (
            {"metadata.tier": {"gte": 2}},
            {"doc-team-basalt", "doc-public-cobalt", "doc-team-dolomite"},
        ),
        ({"metadata.region": "eu", "project": "basalt"}, {"doc-team-basalt"}),
        ({"updated_at": {"gt": ts(11), "lt": ts(13)}}, {"doc-team-basalt"}),
    ]
    for filters, expected in expectations:
        got = ids(filters)
        if got != expected:
            raise ConformanceFailure(
                f"filters {filters}: expected {sorted(expected)}, got {sorted(got)}"
            )


@case("evidence")
def evidence_covers_every_hit(c: SearchConnector) -> None:
    """Every hit has revision evidence (content ids, config, freshness) read at a store time."""
    c.upsert(standard_corpus())
    first = c.search(_q("aurora basalt", top_k=5))
    ev = first.evidence
    check(ev is not None and ev.observed_at.tzinfo is not None, "no timezone-aware observed_at")
    check(
        [d.doc_id for d in ev.documents] == [h.doc_id for h in first.hits],
        "evidence does not list exactly the returned documents, in order",
    )
    for hit, doc in zip(first.hits, ev.documents, strict=True):
        check(
            doc.content_id == hit.content_id == doc.indexed_content_id,
            f"{hit.doc_id}: content ids disagree",
        )
        check(
            doc.freshness == "fresh" and doc.indexed_config_revision == ev.config_revision,
            f"{hit.doc_id}: freshly indexed document reported {doc.freshness}",
        )
    basalt = next(r for r in standard_corpus() if r.document_id == "doc-team-basalt")
    fields = {name: getattr(basalt, name) for name in basalt.__dataclass_fields__}
    c.upsert([ContextDocumentRecord(**{**fields, "body": "Basalt moved to erasure coding."})])
    later = c.search(_q("basalt erasure", top_k=5))
    check(later.evidence.observed_at >= ev.observed_at, "observed_at went backwards")
    now = {d.doc_id: d.content_id for d in later.evidence.documents}
    check(
        now.get("doc-team-basalt") == content_id_for("Basalt moved to erasure coding."),
        f"evidence does not show the updated content id: {now}",
    )

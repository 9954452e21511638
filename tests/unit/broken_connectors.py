"""Deliberately broken connectors, one per contract rule, each violating exactly one thing.

Each class names the conformance case(s) that must catch it. They subclass the reference
connector and override a single behaviour, so a passing case proves it checks that rule.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from context_search import (
    ContextDocument,
    ContextDocumentRecord,
    Freshness,
    GapReceipt,
    GapReport,
    IngestReport,
    InMemorySearchConnector,
    Lifecycle,
    NotFoundError,
    RankExplanation,
    RecordOutcome,
    ReindexReport,
    SearchQuery,
    SearchResponse,
)


class Broken(InMemorySearchConnector):
    catches: ClassVar[tuple[str, ...]] = ()


class IgnoresScopes(Broken):
    """Searches every scope that exists."""

    catches = ("permission_prefilter", "no_leak_in_snippets_titles")

    def search(self, query: SearchQuery) -> SearchResponse:
        everything = {s.record.permission_scope for s in self._docs.values()}
        if query.allowed_scopes:
            query = replace(query, allowed_scopes=sorted(everything))
        return super().search(query)


class EmptyScopesSeeAll(Broken):
    """Treats an empty scope list as "no restriction"."""

    catches = ("empty_scopes_see_nothing",)

    def search(self, query: SearchQuery) -> SearchResponse:
        if not query.allowed_scopes:
            query = replace(
                query,
                allowed_scopes=sorted({s.record.permission_scope for s in self._docs.values()}),
            )
        return super().search(query)

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        scopes = allowed_scopes or sorted({s.record.permission_scope for s in self._docs.values()})
        return super().get_document(doc_id, scopes)


class GetDocumentIgnoresScope(Broken):
    catches = (
        "get_document_checks_scope",
        "no_existence_leak_get_document",
        "knowledge_access_is_limited_to_targets_and_dies",
    )

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        stored = self._docs.get(doc_id)
        return None if stored is None else ContextDocument.project_record(stored.record)


class ExplainRevealsExistence(Broken):
    """Says "not permitted" for hidden documents and "not found" for missing ones."""

    catches = ("no_existence_leak_explain",)

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        stored = self._docs.get(doc_id)
        if stored is not None and stored.record.permission_scope not in query.allowed_scopes:
            raise NotFoundError(
                "document exists but is outside your scopes", details={"owner": stored.record.owner}
            )
        return super().explain(doc_id, query)


class FiltersBeforeScopes(Broken):
    """Counts filter matches over every document, so stats reveal hidden owners."""

    catches = ("no_leak_by_owner_or_path_filters",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        hidden = sum(
            1
            for s in self._docs.values()
            if s.record.permission_scope not in query.allowed_scopes
            and any(getattr(s.record, k, None) == v for k, v in query.filters.items())
        )
        return replace(
            resp, stats=replace(resp.stats, filter_filtered=resp.stats.filter_filtered + hidden)
        )


class GlobalStatistics(Broken):
    """BM25 statistics over the whole corpus: hidden documents shift visible scores."""

    catches = ("scores_independent_of_hidden_documents",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        n = len(self._docs)
        hits = tuple(
            replace(
                h,
                score=h.score + 1e-3 * n,
                score_parts=replace(h.score_parts, fused=h.score_parts.fused + 1e-3 * n),
            )
            for h in resp.hits
        )
        return replace(resp, hits=hits)


class IgnoresLifecycle(Broken):
    catches = ("lifecycle_prefilter", "supersede_hides_old_document")

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, include_superseded=True))


class ResurrectsDeleted(Broken):
    """Deletes by marking superseded, so include_superseded brings deleted docs back."""

    catches = ("deleted_never_returns", "batch_delete_propagates")

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        stored = self._docs.get(doc_id)
        if superseded_by is None and stored is not None:
            if stored.lifecycle is Lifecycle.SUPERSEDED:
                return False
            stored.lifecycle = Lifecycle.SUPERSEDED
            return True
        return super().delete_or_supersede(doc_id, superseded_by)


class DeleteAlwaysTrue(Broken):
    catches = ("delete_missing_returns_false", "deleted_never_returns")

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        super().delete_or_supersede(doc_id, superseded_by)
        return True


class IgnoresSupersedesField(Broken):
    catches = ("batch_supersede_via_record",)

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        return super().upsert([replace(r, supersedes=()) for r in records], **options)


class NoProvenance(Broken):
    """Drops source and offsets from hits."""

    catches = ("hits_carry_provenance",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        return replace(resp, hits=tuple(replace(h, source_uri="", start_byte=0) for h in resp.hits))


class ShuffledRankLog(Broken):
    """Returns hits in an order the rank_log does not explain."""

    catches = ("rank_log_reproduces_order",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        return replace(resp, hits=tuple(reversed(resp.hits)))


class IgnoresTopKAndMinScore(Broken):
    catches = ("top_k_and_min_score",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, top_k=50, min_score=None))


class ExplainDisagrees(Broken):
    catches = ("explain_agrees_with_search",)

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        exp = super().explain(doc_id, query)
        return replace(exp, final_rank=(exp.final_rank or 0) + 1)


class MatchedByRankAlone(Broken):
    """Calls every ranked document matched, though the vector arm ranks unrelated ones too."""

    catches = ("explain_agrees_with_search",)

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        exp = super().explain(doc_id, query)
        return replace(exp, matched=exp.final_rank is not None)


class RandomGapIds(Broken):
    catches = ("gap_report_stable_id",)

    def report_gap(self, report: GapReport) -> GapReceipt:
        return GapReceipt(
            gap_id=uuid.uuid4().hex, status="recorded", received_at=datetime.now(UTC), occurrences=1
        )


class IgnoresMasks(Broken):
    """Indexes and returns masked fields as if no mask were set."""

    catches = (
        "field_mask_hides_fields",
        "masked_body_not_indexed",
        "filter_on_masked_field_does_not_match",
    )

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        return super().upsert([replace(r, field_mask=(), pii_flags=()) for r in records], **options)


class IgnoresFilters(Broken):
    catches = ("filters_equality_in_range",)

    def search(self, query: SearchQuery) -> SearchResponse:
        kept = {k: v for k, v in query.filters.items() if k != "tags" and "in" not in repr(v)}
        return super().search(replace(query, filters=kept))


class SkipsQueryValidation(Broken):
    """Coerces whatever it is given instead of rejecting it."""

    catches = (
        "rejects_empty_query",
        "rejects_bad_top_k",
        "rejects_wrong_types",
        "rejects_nul_and_invalid_unicode",
        "rejects_huge_query",
    )

    def search(self, query: SearchQuery) -> SearchResponse:
        text = str(query.query).replace("\x00", "").encode("utf-8", "replace").decode()[:8000]
        top_k = query.top_k if isinstance(query.top_k, int) and 0 < query.top_k <= 200 else 10
        scopes: Any = query.allowed_scopes
        scopes = [scopes] if isinstance(scopes, str) else [str(s) for s in scopes][:1000]
        fixed = replace(
            query,
            query=text.strip() or "aurora",
            top_k=int(top_k),
            allowed_scopes=[s.replace("\x00", "") for s in scopes],
            min_score=None,
            include_superseded=bool(query.include_superseded),
        )
        return super().search(fixed)

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        stored = self._docs.get(str(doc_id))
        if stored is None or stored.record.permission_scope not in allowed_scopes:
            return None
        return ContextDocument.project_record(stored.record)


class IgnoresUnknownFilters(Broken):
    catches = ("rejects_unknown_filter",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, filters={}))


class NonAtomicUpsert(Broken):
    """Writes records one by one, so a bad record leaves the earlier ones written."""

    catches = ("invalid_record_writes_nothing",)

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        outcomes: list[tuple[str, RecordOutcome]] = []
        for r in records:
            outcomes.extend(super().upsert([r], **options).outcomes)
        return IngestReport(outcomes=tuple(outcomes), chunks_written=0, embeddings_computed=0)


class StaleEvidence(Broken):
    """Reports the content ids remembered from the first search, never the current ones."""

    catches = ("evidence_covers_every_hit",)
    _frozen: ClassVar[dict[str, Any]] = {}

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        docs = tuple(
            replace(d, content_id=self._frozen.setdefault(d.doc_id, d.content_id))
            for d in resp.evidence.documents
        )
        return replace(resp, evidence=replace(resp.evidence, documents=docs))


class NotIdempotent(Broken):
    """Re-embeds and reports every record as updated."""

    catches = ("upsert_is_idempotent",)

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        for r in records:
            self._docs.pop(r.document_id, None)
        report = super().upsert(records, **options)
        return replace(
            report, outcomes=tuple((d, RecordOutcome.UPDATED) for d, _ in report.outcomes)
        )


class AlwaysFresh(Broken):
    """Reports every document fresh, whatever its index entries were built from."""

    catches = ("stale_evidence_detected", "deferred_new_document_is_pending_target")

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(replace(query, require_fresh=False))
        docs = tuple(
            replace(d, freshness=Freshness.FRESH, indexed_content_id=d.content_id)
            for d in resp.evidence.documents
        )
        return replace(resp, evidence=replace(resp.evidence, documents=docs))


class CharacterOffsets(Broken):
    """Reports character offsets instead of UTF-8 byte offsets."""

    catches = ("knowledge_hit_offsets_are_utf8_bytes",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        hits = []
        for h in resp.hits:
            body = self._docs[h.doc_id].record.body
            start = len(body.encode("utf-8")[: h.start_byte].decode("utf-8", "ignore"))
            hits.append(replace(h, start_byte=start, end_byte=start + len(h.snippet)))
        return replace(resp, hits=tuple(hits))


class IgnoresSimilarityFloor(Broken):
    """Drops ``min_similarity``: nearest neighbours always exist, so no zero hit is possible."""

    catches = ("zero_hits_carry_complete_evidence",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, min_similarity=None))


class WrongConfigEvidence(Broken):
    """Reports an active config revision other than the one its entries were built with."""

    catches = ("evidence_covers_every_hit", "knowledge_zero_hit_has_complete_evidence")

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        return replace(resp, evidence=replace(resp.evidence, config_revision="cfg:elsewhere"))


class IgnoresPins(Broken):
    """Answers whatever revision the caller pinned."""

    catches = ("pinned_revision_mismatch",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, pinned_revisions={}))


class EvidenceOnlyForHits(Broken):
    """Lists evidence for returned documents only, so a zero hit proves nothing."""

    catches = ("zero_hits_carry_complete_evidence",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        hit_ids = {h.doc_id for h in resp.hits}
        docs = tuple(d for d in resp.evidence.documents if d.doc_id in hit_ids)
        return replace(resp, evidence=replace(resp.evidence, documents=docs))


class IgnoresTargets(Broken):
    """Searches the whole visible index when explicit targets are given."""

    catches = ("targets_restrict_and_hide_invisible",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, targets=None))


class GlobalPropagation(Broken):
    """Counts queued jobs of every scope."""

    catches = ("propagation_counts_only_own_scopes",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        prop = replace(resp.evidence.propagation, pending=len(self._pending))
        return replace(resp, evidence=replace(resp.evidence, propagation=prop))


class LazyRescope(Broken):
    """Moves the document only when the next reindex runs."""

    catches = ("rescope_propagates_at_once",)
    _moves: ClassVar[dict[str, str]] = {}

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        stored = self._docs.get(doc_id)
        if stored is None or stored.lifecycle is Lifecycle.DELETED:
            return False
        self._moves[doc_id] = new_scope
        return True

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        for doc_id, scope in self._moves.items():
            super().rescope(doc_id, scope)
        self._moves.clear()
        return super().reindex(max_jobs=max_jobs)


class IgnoresPhrases(Broken):
    """Treats a quoted phrase as loose words."""

    catches = ("quoted_phrase_required_in_order",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, query=query.query.replace('"', " ")))


class PhraseAsAllWords(Broken):
    """Requires every word of a quoted phrase, in any order and anywhere in the text."""

    catches = ("quoted_phrase_required_in_order",)

    def search(self, query: SearchQuery) -> SearchResponse:
        def each_word(m: re.Match[str]) -> str:
            return " ".join(f'{m.group(1)}"{w}"' for w in m.group(2).split())

        return super().search(replace(query, query=_PHRASE.sub(each_word, query.query)))


_PHRASE = re.compile(r'(-?)"([^"]*)"')


class IgnoresNegation(Broken):
    """Reads ``-word`` as a word to find."""

    catches = ("negated_word_excludes",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, query=query.query.replace("-", " ")))


class UnexplainedVectorWeight(Broken):
    """Halves the vector arm for CJK queries without saying so."""

    catches = ("vector_weight_is_explained",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        if query.query.isascii():
            return resp
        params = {**resp.rank_log.params, "vector_weight": 0.5}
        return replace(resp, rank_log=replace(resp.rank_log, params=params))


class FixedWeightFusion(Broken):
    """Fuses by RRF with the vector arm at the weight the arm plan gives, whatever the arms'
    evidence says: a vector arm of noise drags a lexical arm's exact match down."""

    catches = ("noise_embedder_cannot_bury_an_exact_passage",)

    def __init__(self, **options: Any) -> None:
        super().__init__(**{**options, "fusion": "rrf", "weighting": "fixed"})


class IgnoresOffset(Broken):
    """Answers every page with the first one."""

    catches = ("pages_slice_one_ranking",)

    def search(self, query: SearchQuery) -> SearchResponse:
        return super().search(replace(query, offset=0))


class PageRankedAlone(Broken):
    """Cuts the page right but ranks it on its own: the rank log restarts at 1."""

    catches = ("pages_slice_one_ranking",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        if not query.offset:
            return resp
        entries = tuple(
            replace(e, final_rank=e.final_rank - query.offset)
            if e.final_rank is not None and e.final_rank > query.offset
            else replace(e, final_rank=None)
            for e in resp.rank_log.entries
        )
        return replace(resp, rank_log=replace(resp.rank_log, entries=entries))


class CountsHiddenPages(Broken):
    """Says another page exists while documents of any scope remain."""

    catches = ("pages_slice_one_ranking",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        window = query.offset + query.top_k
        if resp.next_offset is None and len(self._docs) > window:
            return replace(resp, next_offset=window)
        return resp


class AcceptsAnyOffset(Broken):
    """Takes a negative offset as 0 and pages past the window."""

    catches = ("offset_is_validated",)

    def search(self, query: SearchQuery) -> SearchResponse:
        if isinstance(query.offset, int) and not 0 <= query.offset <= 995:
            return super().search(replace(query, offset=0, top_k=1))
        return super().search(query)


class BodyOffsetHighlights(Broken):
    """Gives highlights as offsets into the body instead of into the snippet."""

    catches = ("highlights_mark_query_words",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        hits = tuple(
            replace(
                h, highlights=tuple((a + h.start_byte, b + h.start_byte) for a, b in h.highlights)
            )
            for h in resp.hits
        )
        return replace(resp, hits=hits)


class HighlightsFromIndexText(Broken):
    """Marks the query's words wherever the indexed text had them, title included: a hit
    found through its title gets a span over the snippet's first bytes."""

    catches = ("highlights_mark_query_words",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        hits = tuple(
            replace(h, highlights=((0, min(6, len(h.snippet.encode()))),))
            if h.score_parts.lexical_rank is not None and not h.highlights and h.snippet
            else h
            for h in resp.hits
        )
        return replace(resp, hits=hits)


class NoHighlights(Broken):
    """Returns no highlights at all."""

    catches = ("highlights_mark_query_words",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        return replace(resp, hits=tuple(replace(h, highlights=()) for h in resp.hits))


class SilentlyWidens(Broken):
    """Moves a stored document to whatever scope a re-ingested record names, and says so
    (the reported move is not enough: it was never allowed)."""

    catches = ("rewrite_never_changes_scope_by_default",)

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        return super().upsert(records, **{**options, "allow_scope_change": True})


class UnreportedScopeChange(Broken):
    """Makes an allowed move but leaves it out of the report."""

    catches = ("allowed_scope_change_is_reported",)

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        return replace(super().upsert(records, **options), scope_changes=())


class RevivesDeleted(Broken):
    """A re-ingest brings deleted documents back, as a write without tombstones does."""

    catches = ("reingest_keeps_deleted_deleted",)

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: bool) -> IngestReport:
        report = super().upsert(records, **{**options, "restore_deleted": True})
        return replace(report, restored=())


class MidWordSnippets(Broken):
    """Cites each snippet one character later and earlier than its chunk: inside words."""

    catches = ("snippets_end_between_words",)

    def search(self, query: SearchQuery) -> SearchResponse:
        resp = super().search(query)
        hits = []
        for h in resp.hits:
            text = h.snippet[1:-1]
            start = h.start_byte + len(h.snippet[:1].encode())
            hits.append(
                replace(h, snippet=text, start_byte=start, end_byte=start + len(text.encode()))
            )
        return replace(resp, hits=tuple(hits))


BROKEN: tuple[type[Broken], ...] = tuple(Broken.__subclasses__())

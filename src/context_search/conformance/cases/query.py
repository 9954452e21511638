"""Query syntax and fusion notes: every backend reads the same query the same way.

Quoted phrases are required in order, ``-word`` excludes, and a rank log that gives the
vector arm less than full weight says why (the embedder does not cover the query's script).
Phrases and negation act on the lexical arm; the vector arm still ranks by meaning, so the
checks look at lexical ranks only.
"""

from __future__ import annotations

from context_search.conformance._registry import case, check
from context_search.conformance.cases.results import _recompute, _weight_follows_evidence
from context_search.conformance.corpus import (
    TEAM,
    NoiseEmbedder,
    passage_corpus,
    standard_corpus,
)
from context_search.contract import (
    ContextDocumentRecord,
    SearchConnector,
    SearchQuery,
    SearchResponse,
)


def _lexical(resp: SearchResponse) -> set[str]:
    return {e.doc_id for e in resp.rank_log.entries if e.lexical_rank is not None}


# Both words of the phrase, but never adjacent in its order: reversed, and apart.
_WORDS_NOT_PHRASE = {
    "doc-team-reversed": "Ask the service aurora desk before midnight.",
    "doc-team-apart": "The aurora dashboard lists every service that pages at night.",
}


@case("query")
def quoted_phrase_required_in_order(c: SearchConnector) -> None:
    """A quoted phrase matches only documents containing its words in that order."""
    c.upsert(
        [
            *standard_corpus(),
            *(
                ContextDocumentRecord(document_id=doc_id, body=body, permission_scope=TEAM)
                for doc_id, body in _WORDS_NOT_PHRASE.items()
            ),
        ]
    )
    resp = c.search(SearchQuery(query='"aurora service"', allowed_scopes=[TEAM], top_k=20))
    lexical = _lexical(resp)
    check("doc-team-aurora" in lexical, f"phrase missed the document containing it: {lexical}")
    check(
        "doc-team-dolomite" not in lexical,
        "a document with one of the words but not the phrase matched the phrase lexically",
    )
    both = sorted(lexical & set(_WORDS_NOT_PHRASE))
    check(not both, f"documents with both words, not in order, matched the phrase: {both}")
    loose = _lexical(c.search(SearchQuery(query="aurora service", allowed_scopes=[TEAM])))
    check("doc-team-dolomite" in loose, "unquoted words must match any document with one")
    check(
        set(_WORDS_NOT_PHRASE) <= loose,
        f"unquoted words must match documents with both words in any order: {loose}",
    )


@case("query")
def negated_word_excludes(c: SearchConnector) -> None:
    """``-word`` removes documents containing the word from the lexical arm."""
    c.upsert(standard_corpus())
    plain = _lexical(c.search(SearchQuery(query="aurora", allowed_scopes=[TEAM], top_k=20)))
    check("doc-team-dolomite" in plain, f"'aurora' should match the dolomite document: {plain}")
    resp = c.search(SearchQuery(query="aurora -dolomite", allowed_scopes=[TEAM], top_k=20))
    lexical = _lexical(resp)
    check("doc-team-dolomite" not in lexical, "a negated word did not exclude its document")
    check("doc-team-aurora" in lexical, "negation removed documents without the word")


@case("query")
def vector_weight_is_explained(c: SearchConnector) -> None:
    """A rank log giving the vector arm less than full weight says why, in its notes and in
    explain; an arm the plan gives no weight contributes no candidates."""
    c.upsert(standard_corpus())
    # With an embedder covering Latin only: no weight, full weight, none (a quarter of the
    # query covered) and three quarters; with one covering every script, full weight for all.
    for text in (
        "极光服务重启",
        "aurora restart",
        "aurora 极光服务重启",
        "aurora service restart 极光",
    ):
        query = SearchQuery(query=text, allowed_scopes=[TEAM], top_k=5)
        resp = c.search(query)
        log = resp.rank_log
        weight = log.params.get("vector_weight", 1.0)
        check(0.0 <= weight <= 1.0, f"{text!r}: vector_weight {weight} outside [0, 1]")
        check(
            (weight < 1.0) == bool(log.notes),
            f"{text!r}: vector_weight {weight} with notes {log.notes!r}",
        )
        if 0.0 < weight < 1.0:
            fused = {e.doc_id: e.fused for e in log.entries}
            check(
                all(abs(fused[d] - f) <= 1e-9 for d, f in _recompute(log)),
                f"{text!r}: fused scores do not apply vector_weight {weight}",
            )
        if log.params.get("script_weight", weight) == 0.0:  # skipped, not weighed down
            check(
                log.vector_candidates == 0 and all(e.vector_rank is None for e in log.entries),
                f"{text!r}: the vector arm has no weight but contributed candidates",
            )
        for hit in resp.hits[:2]:
            notes = c.explain(hit.doc_id, query).notes
            check(
                all(n in notes for n in log.notes),
                f"{text!r}: explain({hit.doc_id}) lacks the rank log's notes {log.notes!r}",
            )


@case("query", embedder=NoiseEmbedder)
def noise_embedder_cannot_bury_an_exact_passage(c: SearchConnector) -> None:
    """With an embedder whose vectors carry no signal, a query made of one passage's exact
    words (unquoted, so nothing filters) keeps that passage in the top 3, and the weight the
    vector arm was fused with follows from the rank log's own candidates."""
    corpus = passage_corpus()
    c.upsert(corpus)
    noise = NoiseEmbedder()
    for record in corpus[:10]:
        words = " ".join(record.body.split()[:8])
        resp = c.search(SearchQuery(query=words, allowed_scopes=[TEAM], top_k=3))
        top = [h.doc_id for h in resp.hits]
        check(record.document_id in top, f"{words!r}: {record.document_id} not in top 3 {top}")
        _weight_follows_evidence(resp.rank_log, words)
        # The connector embedded with the case's embedder, not one of its own.
        hit = next(h for h in resp.hits if h.doc_id == record.document_id)
        expected = float(noise.embed_query(words) @ noise.embed_query(hit.snippet))
        sim = hit.score_parts.vector_similarity
        check(
            sim is not None and abs(sim - expected) <= 2e-3,
            f"{words!r}: similarity {sim} is not the noise embedder's {expected:.4f}: the "
            "factory did not build the connector with the case's embedder",
        )

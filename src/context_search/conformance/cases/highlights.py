"""Highlights: the query's words in the returned snippet, as exact byte spans of it; and
snippets that begin and end between words.

Spans are relative to the snippet (never to the body), so they can only mark text the
caller was given: a hit found through its title, or through a masked field, marks nothing
in a snippet that does not contain the word.
"""

from __future__ import annotations

import re

from context_search.conformance._registry import case, check
from context_search.conformance.corpus import TEAM, standard_corpus
from context_search.contract import ContextDocumentRecord, EvidenceHit, SearchConnector, SearchQuery

_PREFACE = "A preface about granite ledgers and nothing else. "
_LATER = "Later the Aurora service reads the aurora-logs."


def _extra() -> list[ContextDocumentRecord]:
    body = _PREFACE + _LATER
    cut = len(_PREFACE.encode())
    return [
        # Two caller-chosen chunks: the match is in the second, which starts past byte 0.
        ContextDocumentRecord(
            document_id="doc-team-two-chunks",
            title="Granite ledger",
            body=body,
            chunks=((0, cut), (cut, len(body.encode()))),
            permission_scope=TEAM,
        ),
        ContextDocumentRecord(
            document_id="doc-team-title-only",
            title="Zircon rollout memo",
            body="The rollout finished on Tuesday.",
            permission_scope=TEAM,
        ),
        ContextDocumentRecord(
            document_id="doc-team-masked-title",
            title="Zircon salary table",
            body="Figures are in the appendix.",
            permission_scope=TEAM,
            field_mask=("title",),
        ),
    ]


def _word_spans(snippet: str, word: str) -> list[tuple[int, int]]:
    raw = snippet.encode()
    pattern = re.compile(rb"(?<![\w])" + re.escape(word.encode()) + rb"(?![\w])", re.IGNORECASE)
    return [(m.start(), m.end()) for m in pattern.finditer(raw)]


def _well_formed(hit: EvidenceHit) -> None:
    raw = hit.snippet.encode()
    last = 0
    for start, end in hit.highlights:
        check(
            last <= start < end <= len(raw),
            f"{hit.doc_id}: highlight {(start, end)} is not a sorted span inside the snippet "
            f"of {len(raw)} bytes",
        )
        try:
            raw[start:end].decode("utf-8")
        except UnicodeDecodeError:
            check(False, f"{hit.doc_id}: highlight {(start, end)} splits a UTF-8 sequence")
        last = end


@case("results")
def highlights_mark_query_words(c: SearchConnector) -> None:
    """Highlights are the byte spans of the query's words in the snippet (CJK terms as one
    span), relative to the snippet; a snippet without the word has none."""
    c.upsert([*standard_corpus(), *_extra()])
    resp = c.search(SearchQuery(query="aurora -basalt", allowed_scopes=[TEAM], top_k=20))
    check(resp.hits, "no hits for 'aurora'")
    for hit in resp.hits:
        _well_formed(hit)
        check(
            list(hit.highlights) == _word_spans(hit.snippet, "aurora"),
            f"{hit.doc_id}: highlights {hit.highlights} are not the words 'aurora' of its "
            f"snippet {hit.snippet!r}",
        )
    two = next((h for h in resp.hits if h.doc_id == "doc-team-two-chunks"), None)
    check(two is not None and two.start_byte > 0, "the second chunk's match was not cited")
    zh = c.search(SearchQuery(query="极光服务", allowed_scopes=[TEAM], top_k=3))
    found = next((h for h in zh.hits if h.doc_id == "doc-team-chinese"), None)
    check(found is not None, "the Chinese document was not found")
    assert found is not None
    _well_formed(found)
    marked = [found.snippet.encode()[a:b].decode() for a, b in found.highlights]
    check(marked == ["极光服务"], f"CJK highlights are {marked}, not ['极光服务']")
    for hit in c.search(SearchQuery(query="zircon", allowed_scopes=[TEAM], top_k=20)).hits:
        _well_formed(hit)
        check(
            hit.highlights == () or "zircon" in hit.snippet.casefold(),
            f"{hit.doc_id}: highlights {hit.highlights} in a snippet without the word",
        )


_WORDY = re.compile(r"\w")


def _splits_word(body: str, at: int) -> bool:
    """Whether byte offset ``at`` of ``body`` falls between two letters of one Latin word."""
    raw = body.encode()
    before, after = raw[:at].decode(), raw[at:].decode()
    return bool(
        before
        and after
        and before[-1].isascii()
        and after[0].isascii()
        and _WORDY.match(before[-1])
        and _WORDY.match(after[0])
    )


@case("results")
def snippets_end_between_words(c: SearchConnector) -> None:
    """A snippet cut from a long body starts and ends between words, never inside one."""
    words = [f"{w}{i}" for i in range(400) for w in ("granite", "ledger")]
    body = " ".join(words[:300]) + " The aurora marker sits here. " + " ".join(words[300:])
    c.upsert([ContextDocumentRecord(document_id="doc-team-long", body=body, permission_scope=TEAM)])
    resp = c.search(SearchQuery(query="aurora marker", allowed_scopes=[TEAM], top_k=1))
    check(resp.hits, "the long document was not found")
    hit = resp.hits[0]
    check(
        hit.start_byte > 0 and hit.end_byte < len(body.encode()),
        f"the snippet {hit.start_byte}-{hit.end_byte} is not cut from inside the body",
    )
    for name, at in (("starts", hit.start_byte), ("ends", hit.end_byte)):
        check(not _splits_word(body, at), f"the snippet {name} inside a word at byte {at}")

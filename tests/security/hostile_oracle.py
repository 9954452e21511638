"""What a hostile input must produce, stated from the documented rules.

Each input has one right answer. The oracles here derive it from the documented limits
(:mod:`context_search.validation`'s constants), the error-code table and the published
tool schemas, without calling the code under test: the exact error code
(``INVALID_QUERY``, ``INVALID_FILTER``, ``NOT_FOUND``, ``REVISION_MISMATCH``,
``UNAUTHORIZED``) or success; on success the exact document, or hits that stay inside the
caller's scopes, targets and filters with snippets that are the cited bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jsonschema

from context_search import (
    ContextDocument,
    ContextDocumentRecord,
    ContextSearchError,
    GapReport,
    Lifecycle,
    SearchQuery,
    SearchResponse,
    gap_id_for,
)
from context_search.errors import error_class_for
from context_search.gateway import MAX_AGENT_TOP_K, TOOL_SCHEMAS, ToolResult
from context_search.validation import (
    FILTER_FIELDS,
    MAX_ID_CHARS,
    MAX_QUERY_BYTES,
    MAX_SCOPE_CHARS,
    MAX_SCOPES,
    MAX_TARGETS,
    MAX_TOP_K,
    MAX_WINDOW,
)
from tests.security.hostile_data import AGENT_HIT_FIELDS


@dataclasses.dataclass
class Store:
    """One connector plus what the test believes it holds.

    ``registry`` maps doc_id to the last record written successfully; ``gaps`` counts the
    gap reports accepted per gap id (so the next receipt's status is known in advance).
    """

    backend: str
    connector: Any
    registry: dict[str, ContextDocumentRecord]
    dsn: str | None = None
    schema: str | None = None
    gaps: Counter[str] = dataclasses.field(default_factory=Counter)


# -- oracles: what the documented rules say about an input ------------------------------

#: Metadata keys (records and ``metadata.<key>`` filters) are identifiers of <= 64 chars.
METADATA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
RANGE_OPS = frozenset({"gte", "gt", "lte", "lt"})
MAX_SAFE_INT = 2**53


def valid_text(value: object, *, max_bytes: int | None = None, nonblank: bool = False) -> bool:
    """A str without NUL that encodes as UTF-8 within ``max_bytes`` (and is not blank)."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if max_bytes is not None and size > max_bytes:
        return False
    return not nonblank or bool(value.strip())


def valid_scopes(scopes: object) -> bool:
    """A sequence or set (not a bare string) of <= 1000 non-blank scopes of <= 256 chars."""
    if isinstance(scopes, (str, bytes)) or not isinstance(scopes, (Sequence, set, frozenset)):
        return False
    return len(scopes) <= MAX_SCOPES and all(
        valid_text(s, nonblank=True) and len(s) <= MAX_SCOPE_CHARS for s in scopes
    )


def valid_doc_id(doc_id: object) -> bool:
    return valid_text(doc_id, nonblank=True) and len(doc_id) <= MAX_ID_CHARS  # type: ignore[arg-type]


def finite_number(value: object) -> bool:
    """An int of magnitude <= 2**53 or a finite float (bools are not numbers)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INT
    return isinstance(value, float) and math.isfinite(value)


def filter_kind(key: object) -> str | None:
    """``text``, ``tags``, ``time`` or ``meta`` for a filterable key, None for any other."""
    if not isinstance(key, str):
        return None
    if key.startswith("metadata."):
        return "meta" if METADATA_KEY.fullmatch(key.removeprefix("metadata.")) else None
    return FILTER_FIELDS.get(key)


def valid_filter_scalar(kind: str, value: object) -> bool:
    if kind == "time":
        return isinstance(value, datetime) and value.tzinfo is not None
    if kind == "meta" and isinstance(value, (bool, int, float)):
        return isinstance(value, bool) or finite_number(value)
    return valid_text(value, max_bytes=1024)


def valid_filter(key: object, value: object) -> bool:
    kind = filter_kind(key)
    if kind is None:
        return False
    if not isinstance(value, Mapping):
        return not isinstance(value, (list, tuple, set)) and valid_filter_scalar(kind, value)
    if not value:
        return False
    for op, operand in value.items():
        if op == "in":
            if isinstance(operand, (str, bytes)) or not isinstance(operand, Sequence):
                return False
            if not 1 <= len(operand) <= 1000:
                return False
            if not all(valid_filter_scalar(kind, v) for v in operand):
                return False
        elif op in RANGE_OPS:
            if kind == "tags" or not valid_filter_scalar(kind, operand):
                return False
            if isinstance(operand, bool) or (kind == "meta" and isinstance(operand, str)):
                return False
        else:
            return False
    return True


def valid_filters(filters: object) -> bool:
    return isinstance(filters, Mapping) and all(valid_filter(k, v) for k, v in filters.items())


def valid_pins(pins: object) -> bool:
    return (
        isinstance(pins, Mapping)
        and len(pins) <= MAX_TARGETS
        and all(valid_doc_id(k) and valid_text(v, max_bytes=1024) for k, v in pins.items())
    )


def valid_targets(targets: object) -> bool:
    if targets is None:
        return True
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        return False
    return 1 <= len(targets) <= MAX_TARGETS and all(valid_doc_id(t) for t in targets)


def query_error(query: SearchQuery) -> str | None:
    """The code validating ``query`` must raise, or None when it is valid.

    Every malformed field is ``INVALID_QUERY`` except the filters (``INVALID_FILTER``); the
    query text, scopes, top_k, flags and min_score are checked before the filters, the
    targets, min_similarity and pins after them.
    """
    top, skip = query.top_k, query.offset
    before_filters = (
        valid_text(query.query, max_bytes=MAX_QUERY_BYTES, nonblank=True)
        and valid_scopes(query.allowed_scopes)
        and isinstance(top, int)
        and not isinstance(top, bool)
        and 1 <= top <= MAX_TOP_K
        and isinstance(skip, int)
        and not isinstance(skip, bool)
        and 0 <= skip <= MAX_WINDOW - top
        and isinstance(query.include_superseded, bool)
        and (query.min_score is None or finite_number(query.min_score))
        and isinstance(query.require_fresh, bool)
    )
    if not before_filters:
        return "INVALID_QUERY"
    if not valid_filters(query.filters):
        return "INVALID_FILTER"
    sim = query.min_similarity
    after_filters = (
        valid_targets(query.targets)
        and (sim is None or (finite_number(sim) and -1 <= sim <= 1))  # type: ignore[operator]
        and valid_pins(query.pinned_revisions)
    )
    return None if after_filters else "INVALID_QUERY"


def visible(store: Store, doc_id: object, scopes: object) -> bool:
    rec = store.registry.get(doc_id) if isinstance(doc_id, str) else None
    return (
        rec is not None
        and rec.permission_scope in scopes  # type: ignore[operator]
        and rec.lifecycle is not Lifecycle.DELETED
    )


def search_error(store: Store, query: SearchQuery) -> str | None:
    """The code ``search`` must raise for ``query`` against ``store``, or None.

    Beyond validation: a pin on a document that is not readable at that revision is
    ``REVISION_MISMATCH`` (a store written synchronously is always fresh).
    """
    code = query_error(query)
    if code is not None:
        return code
    for doc_id, revision in query.pinned_revisions.items():
        if not visible(store, doc_id, query.allowed_scopes):
            return "REVISION_MISMATCH"
        if store.registry[doc_id].source_revision != revision:
            return "REVISION_MISMATCH"
    return None


def json_equal(a: object, b: object) -> bool:
    """Equal as JSON values: numbers by value (``1 == 1.0``), but ``True`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def literally_matches(rec: ContextDocumentRecord, filt: Mapping[str, Any]) -> bool:
    """Equality and membership filters, written out independently of the library; a masked
    field never matches. (Ranges are left out: their text order is the backend's collation.)
    """
    for key, want in filt.items():
        if isinstance(want, Mapping) and set(want) != {"in"}:
            continue
        values = want["in"] if isinstance(want, Mapping) else [want]
        if key in rec.masked_fields:
            return False
        if key == "tags":
            ok = any(v in rec.tags for v in values)
        elif key.startswith("metadata."):
            name = key.removeprefix("metadata.")
            ok = name in rec.metadata and any(json_equal(rec.metadata[name], v) for v in values)
        else:
            ok = any(json_equal(getattr(rec, key), v) for v in values)
        if not ok:
            return False
    return True


def query_key_ok(text: object) -> bool:
    """The gateway's dedupe key: the query NFKC-normalised, case-folded, whitespace collapsed
    must be valid text of <= 8192 bytes and not empty."""
    if not valid_text(text, max_bytes=MAX_QUERY_BYTES):
        return False
    assert isinstance(text, str)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return bool(folded.split())


def valid_gap(report: GapReport) -> bool:
    """Query, reason and requester within their limits, valid scopes, details a mapping that
    is JSON (finite numbers, valid text, no NUL) of at most 64 KiB."""
    if not (
        valid_text(report.query, max_bytes=MAX_QUERY_BYTES, nonblank=True)
        and valid_text(report.reason, max_bytes=4096, nonblank=True)
        and valid_text(report.requester, max_bytes=512)
        and valid_scopes(report.allowed_scopes)
        and isinstance(report.details, Mapping)
    ):
        return False
    try:
        blob = json.dumps(dict(report.details), allow_nan=False, ensure_ascii=False, default=str)
        size = len(blob.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        return False
    return "\x00" not in blob and "\\u0000" not in blob and size <= 65536


def gap_status(store: Store, gap_id: str) -> tuple[str, int]:
    """Count one more accepted report of ``gap_id``: (expected status, occurrences)."""
    store.gaps[gap_id] += 1
    seen = store.gaps[gap_id]
    return ("recorded" if seen == 1 else "duplicate"), seen


_VALIDATORS = {n: jsonschema.Draft202012Validator(s) for n, s in TOOL_SCHEMAS.items()}


def schema_valid(name: str, args: Mapping[str, Any]) -> bool:
    """The arguments conform to the published tool schema (too deep to check: they do not)."""
    try:
        return bool(_VALIDATORS[name].is_valid(dict(args)))
    except RecursionError:
        return False


def tool_error(store: Store, name: object, args: object, scopes: Any) -> str | None:
    """The error code a tool call must answer with, or None for a successful call.

    Unknown tools, non-object arguments and arguments outside the schema are
    ``INVALID_QUERY``. A read then needs a valid retrieval key, valid context scopes
    (``INVALID_QUERY``) that are not empty (``UNAUTHORIZED``), and a valid search; a
    document the caller cannot see is ``NOT_FOUND``. A gap report needs well-formed
    context scopes (an empty list is accepted) and a valid report.
    """
    if not isinstance(name, str) or name not in TOOL_SCHEMAS:
        return "INVALID_QUERY"
    if not isinstance(args, Mapping) or not schema_valid(name, args):
        return "INVALID_QUERY"
    if name == "context.report_gap":
        if not valid_scopes(scopes):
            return "INVALID_QUERY"
        return None if valid_gap(tool_gap(args, scopes)) else "INVALID_QUERY"
    if name == "context.get_document":
        if not valid_text(args["doc_id"], max_bytes=MAX_QUERY_BYTES, nonblank=True):
            return "INVALID_QUERY"
    else:
        try:
            json.dumps(dict(args.get("filters", {})), sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):
            return "INVALID_QUERY"
        if not query_key_ok(args["query"]):
            return "INVALID_QUERY"
    if not valid_scopes(scopes):
        return "INVALID_QUERY"
    if not scopes:
        return "UNAUTHORIZED"
    if name == "context.get_document":
        return None if visible(store, args["doc_id"], scopes) else "NOT_FOUND"
    return search_error(store, tool_query(args, scopes))


def tool_query(args: Mapping[str, Any], scopes: Sequence[str]) -> SearchQuery:
    """The search ``context.search`` runs for schema-valid ``args``."""
    return SearchQuery(
        query=args["query"],
        allowed_scopes=list(scopes),
        top_k=int(args.get("top_k", 5)),
        offset=int(args.get("offset", 0)),
        filters=dict(args.get("filters", {})),
        include_superseded=bool(args.get("include_superseded", False)),
    )


def tool_gap(args: Mapping[str, Any], scopes: Sequence[str]) -> GapReport:
    """The gap ``context.report_gap`` records for schema-valid ``args``."""
    return GapReport(query=args["query"], allowed_scopes=list(scopes), reason=args["reason"])


# -- checking outcomes ------------------------------------------------------------------


def outcome(fn: Callable[[], Any]) -> Any:
    """Run ``fn``: its value, or the ContextSearchError it raised (anything else propagates)."""
    try:
        return fn()
    except ContextSearchError as exc:
        return exc


def assert_error(result: object, code: str, **details: object) -> ContextSearchError:
    """``result`` is the typed error for ``code``, with these ``details`` entries."""
    assert isinstance(result, ContextSearchError), f"expected {code}, got {result!r}"
    assert result.code == code, f"expected {code}, got {result!r}"
    assert isinstance(result, error_class_for(code)), type(result)
    assert isinstance(result.message, str) and result.message
    for key, want in details.items():
        assert result.details.get(key) == want, (key, result.details)
    return result


def assert_tool_error(result: ToolResult, code: str, **details: object) -> None:
    """A structured tool error with exactly ``code``: its hint, a message, UTF-8 output."""
    assert result.is_error, result.content
    assert set(result.content) == {"error"}
    error = result.content["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["hint"] == error_class_for(code).hint
    assert set(error) <= {"code", "message", "hint", "details"}
    for key, want in details.items():
        assert error.get("details", {}).get(key) == want, (key, error)
    result.to_json().encode("utf-8")


def cited_text(rec: ContextDocumentRecord, start: int, end: int) -> str:
    body = "" if "body" in rec.masked_fields else rec.body
    return body.encode("utf-8")[start:end].decode("utf-8")


def clause_count(filters: Mapping[str, Any]) -> int:
    return sum(len(v) if isinstance(v, Mapping) else 1 for v in filters.values())


def check_highlights(snippet: str, spans: Sequence[tuple[int, int]]) -> None:
    """Highlights are sorted, disjoint spans inside the snippet that decode on their own."""
    raw = snippet.encode()
    last = 0
    for start, end in spans:
        assert last <= start < end <= len(raw), (spans, len(raw))
        raw[start:end].decode("utf-8")
        last = end


def check_response(store: Store, query: SearchQuery, resp: SearchResponse) -> None:
    """A successful search: only visible documents, inside the targets and filters, each
    snippet the cited bytes of the body, finite scores and consistent statistics."""
    assert isinstance(resp, SearchResponse)
    scopes = frozenset(query.allowed_scopes)
    assert len(resp.hits) <= query.top_k
    assert resp.next_offset in (None, query.offset + query.top_k)
    for hit in resp.hits:
        check_highlights(hit.snippet, hit.highlights)
        rec = store.registry[hit.doc_id]
        assert rec.permission_scope in scopes and hit.permission_scope == rec.permission_scope
        assert math.isfinite(hit.score)
        assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
        assert literally_matches(rec, query.filters), (hit.doc_id, query.filters)
        if query.targets is not None:
            assert hit.doc_id in query.targets
        if not query.include_superseded:
            assert hit.lifecycle is Lifecycle.ACTIVE
        if query.min_score is not None:
            assert hit.score >= query.min_score
    for entry in resp.rank_log.entries:
        assert store.registry[entry.doc_id].permission_scope in scopes
        assert math.isfinite(entry.fused)
    readable_targets = [t for t in query.targets or () if visible(store, t, scopes)]
    assert {d.doc_id for d in resp.evidence.documents} == {
        *(h.doc_id for h in resp.hits),
        *readable_targets,
    }
    stats = resp.stats
    counts = [getattr(stats, f.name) for f in dataclasses.fields(stats) if f.name != "timings"]
    assert all(isinstance(n, int) and n >= 0 for n in counts), stats
    assert stats.timings is None  # stage timings are opt-in
    assert stats.returned == len(resp.hits)
    assert stats.scopes_applied == len(scopes)


def expected_doc(rec: ContextDocumentRecord) -> ContextDocument | None:
    return None if rec.lifecycle is Lifecycle.DELETED else ContextDocument.project_record(rec)


def typed_metadata(meta: Mapping[str, Any]) -> dict[str, tuple[type, Any]]:
    """Metadata with each value's type, so ``1`` and ``1.0`` (or ``True``) differ."""
    return {k: (type(v), v) for k, v in meta.items()}


def assert_same_document(got: object, want: ContextDocument) -> None:
    """Equal documents, numbers in metadata of the same type as written."""
    assert isinstance(got, ContextDocument), got
    assert got == want
    assert typed_metadata(got.metadata) == typed_metadata(want.metadata)


def agent_document(doc: ContextDocument) -> dict[str, Any]:
    """What the first ``context.get_document`` of a request shows an agent for ``doc``
    (``updated_at`` as a datetime: its ISO text depends on the backend's time zone)."""
    return {
        "citation_id": f"context.get_document:1:{doc.doc_id}",
        "doc_id": doc.doc_id,
        "title": doc.title,
        "summary": doc.summary,
        "body": doc.body,
        "source_uri": doc.source_uri,
        "source_system": doc.source_system,
        "lifecycle": doc.lifecycle.value,
        "updated_at": doc.updated_at,
        "content_id": doc.content_id,
        "masked_fields": sorted(doc.masked_fields),
    }


def check_agent_payload(
    store: Store, name: str, args: Any, scopes: Any, result: ToolResult
) -> None:
    """A successful tool result: the agent-safe fields only, nothing the caller cannot see."""
    assert not result.is_error, result.content
    assert json.loads(result.to_json()) == json.loads(json.dumps(result.content))
    if name == "context.search":
        assert set(result.content) == {"hits", "next_offset", "observed_at"}
        query = tool_query(args, scopes)
        assert result.content["next_offset"] in (None, query.offset + query.top_k)
        hits = result.content["hits"]
        assert len(hits) <= query.top_k <= MAX_AGENT_TOP_K
        for hit in hits:
            assert set(hit) == AGENT_HIT_FIELDS
            assert visible(store, hit["doc_id"], scopes), hit
            assert hit["citation_id"] == f"context.search:1:{hit['doc_id']}"
            rec = store.registry[hit["doc_id"]]
            assert hit["snippet"] == cited_text(rec, hit["start_byte"], hit["end_byte"])
            check_highlights(hit["snippet"], [tuple(span) for span in hit["highlights"]])
            assert literally_matches(rec, query.filters)
    elif name == "context.get_document":
        got = dict(result.content)
        if got["updated_at"] is not None:
            got["updated_at"] = datetime.fromisoformat(got["updated_at"])
        got["masked_fields"] = sorted(got["masked_fields"])
        want = expected_doc(store.registry[args["doc_id"]])
        assert want is not None and got == agent_document(want)
    else:
        assert name == "context.report_gap"
        gap_id = gap_id_for(tool_gap(args, scopes))
        status, _ = gap_status(store, gap_id)
        assert result.content == {"gap_id": gap_id, "status": status}

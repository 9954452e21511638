"""The agent tool gateway: ``context.search``, ``context.get_document``, ``context.report_gap``.

An agent is the least trusted caller a retrieval service has: it chooses tool arguments,
may loop, and repeats whatever it reads. So the gateway

* takes the caller's scopes from the server-side :class:`ToolContext`, never from tool
  arguments (the schemas forbid extra properties, so an agent cannot even try);
* runs every read through the retrieval lifecycle (:mod:`context_search.lifecycle`) with
  one :class:`~context_search.lifecycle.RetrievalState` per request: a per-request quota,
  and the same query twice in one request is ``DUPLICATE_QUERY`` instead of a loop;
* returns only agent-safe fields — citation ids, titles, snippets, byte spans, source URIs,
  freshness — never the audit statistics, the rank log, scores or the index's propagation
  state, which describe the index rather than the evidence;
* answers a document the caller may not see exactly like a missing one;
* turns every failure into a structured tool error ``{"error": {"code", "message"}}``.

It works with any :class:`~context_search.contract.SearchConnector`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from context_search.contract import (
    ContextDocument,
    EvidenceHit,
    GapReport,
    SearchConnector,
    SearchQuery,
    SearchResponse,
)
from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    ContextSearchError,
    InvalidQueryError,
    NotFoundError,
)
from context_search.lifecycle import (
    Retrieval,
    RetrievalReceipt,
    RetrievalState,
    define_retrieval,
    retrieval_query_key,
)
from context_search.validation import MAX_QUERY_BYTES, MAX_WINDOW, validate_scopes

__all__ = [
    "TOOL_SCHEMAS",
    "ToolContext",
    "ToolGateway",
    "ToolResult",
    "ToolSpec",
]

#: Largest ``top_k`` an agent may ask for: evidence beyond that costs tokens, not quality.
MAX_AGENT_TOP_K = 20
#: Deepest page start an agent may ask for (``offset + top_k`` stays within the window).
MAX_AGENT_OFFSET = MAX_WINDOW - MAX_AGENT_TOP_K

_FILTER_VALUE: dict[str, Any] = {
    "anyOf": [
        {"type": ["string", "number", "boolean"]},
        {
            "type": "object",
            "properties": {
                "in": {"type": "array", "items": {"type": ["string", "number", "boolean"]}},
                "gte": {"type": ["string", "number"]},
                "gt": {"type": ["string", "number"]},
                "lte": {"type": ["string", "number"]},
                "lt": {"type": ["string", "number"]},
            },
            "additionalProperties": False,
            "minProperties": 1,
        },
    ]
}

TOOL_SCHEMAS: Mapping[str, Mapping[str, Any]] = {
    "context.search": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_BYTES},
            "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_AGENT_TOP_K},
            "offset": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_AGENT_OFFSET,
                "description": "Skip this many ranks: the next page starts at the previous "
                "answer's next_offset.",
            },
            "filters": {
                "type": "object",
                "description": "source_system, source_type, object_type, owner, department, "
                "project, review_status, tags, created_at, updated_at or metadata.<key>.",
                "additionalProperties": _FILTER_VALUE,
                "maxProperties": 16,
            },
            "include_superseded": {"type": "boolean"},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "context.get_document": {
        "type": "object",
        "properties": {"doc_id": {"type": "string", "minLength": 1, "maxLength": 512}},
        "required": ["doc_id"],
        "additionalProperties": False,
    },
    "context.report_gap": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_BYTES},
            "reason": {"type": "string", "minLength": 1, "maxLength": 4096},
        },
        "required": ["query", "reason"],
        "additionalProperties": False,
    },
}

_DESCRIPTIONS = {
    "context.search": "Search the knowledge you may read. Returns cited evidence: each hit has "
    "a citation_id, title, snippet (exact text of the document between start_byte and "
    "end_byte), highlights (UTF-8 byte spans of your query's words inside the snippet), "
    'source_uri and freshness. Plain words are alternatives, "quoted phrases" are '
    "required, -word excludes. When more hits exist, next_offset is the offset of the "
    "next page.",
    "context.get_document": "Read one document you may read, by doc_id from a search hit.",
    "context.report_gap": "Record that the available evidence could not answer a question.",
}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """Who is asking, set by the server for one request; nothing here comes from the agent.

    ``quota`` bounds successful reads (search + get_document) in this request.
    """

    allowed_scopes: Sequence[str]
    requester: str = ""
    quota: int | None = 20
    state: RetrievalState = field(default_factory=RetrievalState)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """``content`` is the JSON-safe tool output; ``is_error`` marks a structured error."""

    content: Mapping[str, Any]
    is_error: bool = False

    def to_json(self) -> str:
        return json.dumps(self.content, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True, slots=True)
class _SearchArgs:
    query: str
    top_k: int
    offset: int
    filters: Mapping[str, Any]
    include_superseded: bool


@dataclass(frozen=True, slots=True)
class _HitSource:
    hit: EvidenceHit
    freshness: str

    @property
    def source_id(self) -> str:
        return self.hit.doc_id


@dataclass(frozen=True, slots=True)
class _SearchOutcome:
    response: SearchResponse
    sources: tuple[_HitSource, ...]


@dataclass(frozen=True, slots=True)
class _DocSource:
    document: ContextDocument

    @property
    def source_id(self) -> str:
        return self.document.doc_id


@dataclass(frozen=True, slots=True)
class _DocOutcome:
    sources: tuple[_DocSource, ...]


def _search_key(args: _SearchArgs, _ctx: ToolContext) -> str:
    # A digest: the normalised query plus options, fixed-length whatever the query's size.
    blob = json.dumps(
        [
            retrieval_query_key(args.query),
            args.top_k,
            args.offset,
            args.include_superseded,
            json.dumps(args.filters, sort_keys=True, default=str),
        ]
    )
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _scopes_set(_query: object, ctx: ToolContext) -> bool:
    # An empty scope list would search nothing; refusing says why instead of a silent zero.
    return bool(validate_scopes(ctx.allowed_scopes))


def _safe(text: str) -> str:
    """Text that encodes as UTF-8 (lone surrogates from hostile input become escapes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ToolGateway:
    """Dispatches tool calls to one connector; thread-safe, one :class:`ToolContext` per
    request (create it with the caller's scopes from your authentication layer)."""

    def __init__(self, connector: SearchConnector) -> None:
        self._connector = connector
        self._validators = {
            name: jsonschema.Draft202012Validator(schema) for name, schema in TOOL_SCHEMAS.items()
        }
        self._search: Retrieval[_SearchArgs, ToolContext, _HitSource] = define_retrieval(
            "context.search",
            _DESCRIPTIONS["context.search"],
            self._execute_search,
            state=lambda ctx: ctx.state,
            limit=lambda ctx: ctx.quota,
            authorize=_scopes_set,
            key=_search_key,
        )
        self._get: Retrieval[str, ToolContext, _DocSource] = define_retrieval(
            "context.get_document",
            _DESCRIPTIONS["context.get_document"],
            self._execute_get,
            state=lambda ctx: ctx.state,
            limit=lambda ctx: ctx.quota,
            authorize=_scopes_set,
            key=lambda doc_id, _ctx: doc_id,
        )
        self._handlers: dict[str, Callable[[Mapping[str, Any], ToolContext], dict[str, Any]]] = {
            "context.search": self._call_search,
            "context.get_document": self._call_get,
            "context.report_gap": self._call_gap,
        }

    def tools(self) -> list[ToolSpec]:
        return [ToolSpec(n, _DESCRIPTIONS[n], TOOL_SCHEMAS[n]) for n in TOOL_SCHEMAS]

    def call(self, name: str, arguments: object, context: ToolContext) -> ToolResult:
        """Run one tool call; never raises for bad input or backend failure."""
        try:
            handler = self._handlers.get(name) if isinstance(name, str) else None
            if handler is None:
                raise InvalidQueryError("unknown tool", details={"tool": _safe(str(name))[:100]})
            args = self._validated(name, arguments)
            return ToolResult(handler(args, context))
        except ContextSearchError as exc:
            return ToolResult(_error(exc), is_error=True)

    # -- argument checking ------------------------------------------------------------------

    def _validated(self, name: str, arguments: object) -> Mapping[str, Any]:
        if not isinstance(arguments, Mapping):
            raise InvalidQueryError("tool arguments must be a JSON object")
        try:
            error = next(iter(self._validators[name].iter_errors(dict(arguments))), None)
        except RecursionError:
            raise InvalidQueryError("tool arguments are nested too deeply") from None
        if error is not None:
            where = _safe("/".join(str(p) for p in error.absolute_path) or "arguments")[:200]
            # The validator's message may echo the offending value; the path is enough.
            raise InvalidQueryError(
                f"invalid arguments for {name} at {where}: {error.validator} violated",
                details={"field": where, "rule": str(error.validator)},
            )
        return arguments

    # -- tools ------------------------------------------------------------------------------

    def _call_search(self, args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
        receipt = self._search.run(
            _SearchArgs(
                query=args["query"],
                top_k=int(args.get("top_k", 5)),
                offset=int(args.get("offset", 0)),
                filters=dict(args.get("filters", {})),
                include_superseded=bool(args.get("include_superseded", False)),
            ),
            ctx,
        )
        return _search_payload(receipt)

    def _execute_search(self, args: _SearchArgs, ctx: ToolContext) -> _SearchOutcome:
        response = self._connector.search(
            SearchQuery(
                query=args.query,
                allowed_scopes=list(ctx.allowed_scopes),
                top_k=args.top_k,
                offset=args.offset,
                filters=args.filters,
                include_superseded=args.include_superseded,
            )
        )
        freshness = {d.doc_id: d.freshness.value for d in response.evidence.documents}
        return _SearchOutcome(
            response=response,
            sources=tuple(_HitSource(h, freshness.get(h.doc_id, "unknown")) for h in response.hits),
        )

    def _call_get(self, args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
        receipt = self._get.run(str(args["doc_id"]), ctx)
        (source,) = receipt.result.sources
        doc = source.source.document
        return {
            "citation_id": source.source_id,
            "doc_id": doc.doc_id,
            "title": doc.title,
            "summary": doc.summary,
            "body": doc.body,
            "source_uri": doc.source_uri,
            "source_system": doc.source_system,
            "lifecycle": doc.lifecycle.value,
            "updated_at": doc.updated_at.isoformat() if doc.updated_at else None,
            "content_id": doc.content_id,
            "masked_fields": list(doc.masked_fields),
        }

    def _execute_get(self, doc_id: str, ctx: ToolContext) -> _DocOutcome:
        doc = self._connector.get_document(doc_id, list(ctx.allowed_scopes))
        if doc is None:
            raise NotFoundError("document not found")
        return _DocOutcome(sources=(_DocSource(doc),))

    def _call_gap(self, args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
        _scopes_set(None, ctx)
        receipt = self._connector.report_gap(
            GapReport(
                query=args["query"],
                allowed_scopes=list(ctx.allowed_scopes),
                reason=args["reason"],
                requester=ctx.requester,
            )
        )
        return {"gap_id": receipt.gap_id, "status": receipt.status}


def _search_payload(receipt: RetrievalReceipt[_SearchArgs, _HitSource]) -> dict[str, Any]:
    hits = []
    for src in receipt.result.sources:
        h = src.source.hit
        hits.append(
            {
                "citation_id": src.source_id,
                "doc_id": h.doc_id,
                "title": h.title,
                "snippet": h.snippet,
                "highlights": [list(span) for span in h.highlights],
                "start_byte": h.start_byte,
                "end_byte": h.end_byte,
                "source_uri": h.source_uri,
                "source_system": h.source_system,
                "lifecycle": h.lifecycle.value,
                "updated_at": h.updated_at.isoformat() if h.updated_at else None,
                "freshness": src.source.freshness,
            }
        )
    outcome = receipt.raw_result
    assert isinstance(outcome, _SearchOutcome)
    return {
        "hits": hits,
        "next_offset": outcome.response.next_offset,
        "observed_at": outcome.response.evidence.observed_at.isoformat(),
    }


def _error(exc: ContextSearchError) -> dict[str, Any]:
    # Only codes and messages written by this library; details are field names and limits.
    # A backend failure's message may quote stored data of any scope: never forward it.
    message = (
        "the retrieval backend failed; try again later"
        if isinstance(exc, (BackendError, BackendUnavailableError))
        else _safe(exc.message)
    )
    payload: dict[str, Any] = {"code": exc.code, "message": message}
    if exc.hint:
        payload["hint"] = exc.hint
    safe = {
        k: _safe(v) if isinstance(v, str) else v
        for k, v in exc.details.items()
        if k in ("field", "rule", "limit", "tool") and isinstance(v, (str, int))
    }
    if safe:
        payload["details"] = safe
    return {"error": payload}

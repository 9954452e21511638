"""Request validation and budgets, all of it done before any backend work.

A request is checked field by field; its raw target array is bounded before a single item
is read (the rest of an oversized array is never validated); targets are validated and
de-duplicated, ambiguous names rejected; the final targets are then counted and measured.
The canonical encoding of the final targets lives here because the byte budget is measured
on exactly the bytes the mapping revision hashes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from context_search.errors import InvalidQueryError
from context_search.knowledge.types import (
    MAX_KNOWLEDGE_LIMIT,
    MAX_KNOWLEDGE_TARGET_BYTES,
    MAX_KNOWLEDGE_TARGETS,
    MAX_RAW_KNOWLEDGE_TARGETS,
    KnowledgeRequest,
    KnowledgeTarget,
)
from context_search.validation import MAX_ID_CHARS, MAX_QUERY_BYTES, check_text

_MAX_REVISION_BYTES = 1024

#: Part of every canonical mapping, so a change of the encoding changes every revision.
_MAPPING_VERSION = 1


def _validate_request(
    request: object,
) -> tuple[KnowledgeRequest, tuple[KnowledgeTarget, ...], bytes]:
    if not isinstance(request, KnowledgeRequest):
        raise InvalidQueryError("expected a KnowledgeRequest", details={"field": "request"})
    text = check_text(request.text, name="text", max_bytes=MAX_QUERY_BYTES, allow_empty=False)
    limit = _bounded_int(request.limit, "limit", MAX_KNOWLEDGE_LIMIT)
    max_targets = _bounded_int(request.max_targets, "max_targets", MAX_KNOWLEDGE_TARGETS)
    max_bytes = _bounded_int(
        request.max_target_bytes, "max_target_bytes", MAX_KNOWLEDGE_TARGET_BYTES
    )
    final = _final_targets(_checked_targets(request.targets, max_bytes=max_bytes))
    if len(final) > max_targets:
        raise _budget_error("count", max_targets, len(final))
    canonical = _canonical_mapping(final)
    if len(canonical) > max_bytes:
        raise _budget_error("bytes", max_bytes, len(canonical))
    checked = KnowledgeRequest(
        text=text,
        targets=final,
        limit=limit,
        max_targets=max_targets,
        max_target_bytes=max_bytes,
    )
    return checked, final, canonical


def _bounded_int(value: object, name: str, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQueryError(f"{name} must be an integer", details={"field": name})
    if not 1 <= value <= upper:
        raise InvalidQueryError(
            f"{name} must be between 1 and {upper}", details={"field": name, "limit": upper}
        )
    return value


def _budget_error(budget: str, limit: int, actual: int) -> InvalidQueryError:
    what = {
        "raw_count": "raw target array has",
        "raw_bytes": "raw target array declares",
        "count": "de-duplicated targets are",
        "bytes": "de-duplicated targets encode to",
    }[budget]
    unit = "bytes" if budget.endswith("bytes") else "entries"
    return InvalidQueryError(
        f"targets over budget: the {what} more than {limit} {unit}",
        details={"field": "targets", "budget": budget, "limit": limit, "actual": actual},
    )


def _checked_targets(raw: object, *, max_bytes: int | None) -> list[KnowledgeTarget]:
    """Every raw item, validated; the raw array's size is budgeted before items are read."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise InvalidQueryError(
            "targets must be a sequence of KnowledgeTarget", details={"field": "targets"}
        )
    if not raw:
        raise InvalidQueryError("targets must not be empty", details={"field": "targets"})
    if len(raw) > MAX_RAW_KNOWLEDGE_TARGETS:
        raise _budget_error("raw_count", MAX_RAW_KNOWLEDGE_TARGETS, len(raw))
    items: list[KnowledgeTarget] = []
    total = 0
    for index, item in enumerate(raw):
        items.append(_check_target(index, item))
        total += _declared_bytes(item)
        if max_bytes is not None and total > max_bytes:
            # Stop at once: the rest of an oversized array is never even validated.
            raise _budget_error("raw_bytes", max_bytes, total)
    return items


def _check_target(index: int, item: object) -> KnowledgeTarget:
    if not isinstance(item, KnowledgeTarget):
        raise InvalidQueryError(
            f"targets[{index}] must be a KnowledgeTarget",
            details={"field": "targets", "index": index},
        )
    for part in ("doc_id", "knowledge_id", "source"):
        _check_part(index, part, getattr(item, part), max_chars=MAX_ID_CHARS)
    for part in ("expected_content_id", "source_revision"):
        value = getattr(item, part)
        if value is not None:
            # Empty would be a pin nobody can satisfy on purpose: ``None`` means "no pin".
            _check_part(index, part, value, max_chars=_MAX_REVISION_BYTES)
    return item


def _check_part(index: int, part: str, value: object, *, max_chars: int) -> None:
    try:
        check_text(value, name=part, allow_empty=False)
    except InvalidQueryError as exc:
        raise InvalidQueryError(
            f"targets[{index}].{exc.message}",
            details={"field": "targets", "index": index, "part": part},
        ) from None
    if isinstance(value, str) and len(value) > max_chars:
        raise InvalidQueryError(
            f"targets[{index}].{part} is longer than {max_chars} characters",
            details={"field": "targets", "index": index, "part": part, "limit": max_chars},
        )


def _declared_bytes(item: KnowledgeTarget) -> int:
    parts = (
        item.doc_id,
        item.knowledge_id,
        item.source,
        item.expected_content_id or "",
        item.source_revision or "",
    )
    return sum(len(p.encode("utf-8")) for p in parts)


def _final_targets(items: Sequence[KnowledgeTarget]) -> tuple[KnowledgeTarget, ...]:
    """De-duplicate in first-seen order; a repeat that disagrees, or a name that would let
    one read resolve to two documents, is ambiguous and rejected."""
    by_doc: dict[str, tuple[int, KnowledgeTarget]] = {}
    for index, item in enumerate(items):
        prior = by_doc.get(item.doc_id)
        if prior is None:
            by_doc[item.doc_id] = (index, item)
        elif prior[1] != item:
            raise InvalidQueryError(
                f"targets[{index}] repeats doc_id of targets[{prior[0]}] with another declaration",
                details={"field": "targets", "index": index, "reason": "conflicting_duplicate"},
            )
    owners: dict[str, str] = {}
    for index, item in by_doc.values():
        for name in dict.fromkeys((item.doc_id, item.knowledge_id)):
            if owners.setdefault(name, item.doc_id) != item.doc_id:
                raise InvalidQueryError(
                    f"targets[{index}] uses a name that already names another target",
                    details={"field": "targets", "index": index, "reason": "ambiguous_name"},
                )
    return tuple(item for _, item in by_doc.values())


def _canonical_mapping(final: Sequence[KnowledgeTarget]) -> bytes:
    """The final targets as canonical JSON: what ``max_target_bytes`` budgets and what the
    mapping revision hashes."""
    rows = sorted(
        (
            {
                "doc_id": t.doc_id,
                "expected_content_id": t.expected_content_id,
                "knowledge_id": t.knowledge_id,
                "source": t.source,
                "source_revision": t.source_revision,
            }
            for t in final
        ),
        key=lambda row: str(row["doc_id"]),
    )
    return json.dumps(
        {"targets": rows, "v": _MAPPING_VERSION},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")

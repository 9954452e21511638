"""The record hash stored with every document decides whether a re-ingested record is
rewritten, so its text is a stored format: it must stay the JSON its definition names,
whatever shortcuts compute it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from context_search.contract import ContextDocumentRecord, Lifecycle
from context_search.postgres.write.records import record_hash


def _defined(record: ContextDocumentRecord) -> str:
    """The definition: every field, datetimes as ISO text, tuples as arrays, mappings with
    sorted keys, encoded with sorted keys, no ASCII escapes and no spaces."""

    def plain(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in sorted(value.items())}
        return value

    fields = {name: plain(getattr(record, name)) for name in record.__dataclass_fields__}
    fields["metadata"] = plain(dict(record.metadata))
    blob = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


@pytest.mark.parametrize(
    "record",
    [
        ContextDocumentRecord(document_id="a", body="plain ASCII body", permission_scope="team"),
        ContextDocumentRecord(
            document_id="zh-1",
            body="极光服务每天夜间重启。",
            permission_scope="team",
            title="Zoë's «notes»",
            chunks=((0, 6), (6, 12)),
            lifecycle=Lifecycle.SUPERSEDED,
            created_at=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
            updated_at=datetime(2024, 2, 3, tzinfo=UTC),
            tags=("b", "a"),
            entities=("e",),
            pii_flags=("owner",),
            field_mask=("summary",),
            supersedes=("old",),
            metadata={
                "z": [1, {"b": 2, "a": 1}],
                "a": "é中",
                "n": None,
                "f": 1.5,
                "t": True,
                "d": {"y": 1, "x": [3]},
            },
        ),
    ],
)
def test_record_hash_is_the_defined_json(record: ContextDocumentRecord) -> None:
    assert record_hash(record) == _defined(record)


def test_record_hash_tells_records_apart() -> None:
    base = ContextDocumentRecord(document_id="a", body="x", permission_scope="team")
    changed = ContextDocumentRecord(
        document_id="a", body="x", permission_scope="team", metadata={"k": "v"}
    )
    assert record_hash(base) != record_hash(changed)


def test_record_hash_of_a_stored_record_is_pinned() -> None:
    """Indexes already hold hashes computed this way: a change to any part of the text
    (both copies of the definition above changed together, say) rewrites every document
    on its next ingest. The value was computed by the implementation before this test."""
    record = ContextDocumentRecord(
        document_id="zh-1",
        body="极光服务每天夜间重启。",
        permission_scope="team",
        title="Zoë",
        chunks=((0, 6),),
        lifecycle=Lifecycle.SUPERSEDED,
        updated_at=datetime(2024, 2, 3, tzinfo=UTC),
        tags=("b", "a"),
        metadata={"k": [1, {"b": 2, "a": 1}], "a": "é"},
    )
    assert record_hash(record) == (
        "sha256:46d8b4de18a76557939f0b001e2c9e1d90acda1e8add26230f17b61cc94ae4dc"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Annotated(ContextDocumentRecord):
    """A caller's own record type with a field of its own."""

    note: str = ""


def test_record_hash_covers_a_subclass_s_own_fields() -> None:
    first = _Annotated(document_id="a", body="x", permission_scope="team", note="1")
    second = _Annotated(document_id="a", body="x", permission_scope="team", note="2")
    assert record_hash(first) == _defined(first)
    assert record_hash(first) != record_hash(second)

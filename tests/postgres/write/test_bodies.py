"""A document's text is stored once: its row keeps no body its chunks hold exactly
(``engine/bodies.py``), and no path — a re-ingest, a deferred index job, a chunking switch,
a purge, a migration either way — loses or changes the text ``get_document`` returns."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
import pytest
from psycopg import sql

from context_search import ContextDocumentRecord, HashingEmbedder
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.migrations import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.operations.audit import audit

pytestmark = pytest.mark.integration

_LONG = " ".join(
    f"Sentence {i} of the turbine runbook names bearing {i % 7} and 极光服务 {i}. 🚀"
    for i in range(60)
)

#: doc id -> (body, whether its chunks hold it under the default chunking)
_BODIES = {
    "one-chunk": ("Aurora restarts after a bearing fault.", True),
    "many-chunks": (_LONG, True),
    "trailing-newline": (_LONG[:900] + "\n", False),  # the chunks leave the newline out
    "leading-space": ("  indented first line, then text", False),
}
#: A masked body is stored blank (never its text), and blank it stays.
_MASKED = ContextDocumentRecord(
    document_id="masked",
    title="T masked",
    body="Private notes on the bearing fault.",
    field_mask=("body",),
    permission_scope="team",
)


def _records() -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(document_id=d, title=f"T {d}", body=b, permission_scope="team")
        for d, (b, _) in _BODIES.items()
    ] + [_MASKED]


def _expected() -> dict[str, str]:
    return {**{d: b for d, (b, _) in _BODIES.items()}, "masked": ""}


def _stored(dsn: str, schema: str) -> dict[str, str | None]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT doc_id, body FROM {}.documents").format(sql.Identifier(schema))
        ).fetchall()
    return {str(d): b for d, b in rows}


def _texts(
    store: PostgresSearchConnector, ids: Iterable[str] = (*_BODIES, "masked")
) -> dict[str, str]:
    out = {}
    for d in ids:
        doc = store.get_document(d, ["team"])
        assert doc is not None
        out[d] = doc.body
    return out


def test_rows_keep_only_the_bodies_their_chunks_do_not_hold(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(_records())
    stored = _stored(context_search_dsn, context_search_schema)
    for d, (body, held) in _BODIES.items():
        assert stored[d] == (None if held else body), d
    assert stored["masked"] == ""
    assert _texts(store) == _expected()
    report = audit(store.engine)
    assert report.consistent, report.violations
    # A re-ingest with other text moves the copy as the new chunks require.
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="one-chunk", body=" now indented", permission_scope="team"
            ),
            ContextDocumentRecord(
                document_id="leading-space", body="no longer", permission_scope="team"
            ),
        ]
    )
    stored = _stored(context_search_dsn, context_search_schema)
    assert stored["one-chunk"] == " now indented" and stored["leading-space"] is None
    assert _texts(store, ["one-chunk", "leading-space"]) == {
        "one-chunk": " now indented",
        "leading-space": "no longer",
    }


def test_a_body_held_only_by_chunks_that_lose_it_is_reported(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    """The audit is what would catch a write path that drops a body's last copy."""
    store.upsert(_records())
    assert audit(store.engine).violations["body_without_copy"] == 0
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DELETE FROM {}.chunks WHERE doc_id = 'many-chunks'").format(
                sql.Identifier(context_search_schema)
            )
        )
    assert audit(store.engine).violations["body_without_copy"] == 1


def test_deferred_indexing_keeps_the_body_in_the_row_until_its_chunks_exist(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(_records())
    changed = _LONG.replace("turbine", "compressor")
    store.upsert(
        [ContextDocumentRecord(document_id="many-chunks", body=changed, permission_scope="team")],
        defer_indexing=True,
    )
    # The old chunks still answer searches; the new text is in the row.
    assert _stored(context_search_dsn, context_search_schema)["many-chunks"] == changed
    assert _texts(store, ["many-chunks"]) == {"many-chunks": changed}
    assert store.reindex().done >= 1
    assert _stored(context_search_dsn, context_search_schema)["many-chunks"] is None
    assert _texts(store, ["many-chunks"]) == {"many-chunks": changed}
    assert audit(store.engine).consistent


def test_a_chunking_switch_carries_every_body_and_keeps_those_its_chunks_leave(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    """Without overlap the chunker leaves the whitespace between chunks out: bodies the live
    chunks held must come back into the rows of the new configuration."""
    store.upsert(_records())
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        chunk_bytes=200,
        chunk_overlap=0,
        reconfigure=True,
    ) as switched:
        assert _texts(switched) == _expected()
        stored = _stored(context_search_dsn, context_search_schema)
        assert stored["many-chunks"] == _LONG  # gaps between its new chunks
        assert stored["one-chunk"] is None  # one chunk, no gap
        assert audit(switched.engine).consistent


def test_a_purge_blanks_a_body_its_chunks_held(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(_records())
    assert store.delete_or_supersede("many-chunks")
    store.reindex()
    assert _stored(context_search_dsn, context_search_schema)["many-chunks"] == ""
    assert store.get_document("many-chunks", ["team"]) is None
    assert audit(store.engine).consistent


def test_the_migration_moves_bodies_out_of_rows_and_back(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(_records())
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        downgrade(engine, schema=context_search_schema, revision="0015")  # type: ignore[arg-type]
        assert _stored(context_search_dsn, context_search_schema) == _expected()
        migrate(engine, schema=context_search_schema)  # type: ignore[arg-type]
        assert current_revision(engine, schema=context_search_schema) == head_revision()  # type: ignore[arg-type]
    finally:
        close_store_engine(engine)
    stored = _stored(context_search_dsn, context_search_schema)
    for d, (body, held) in _BODIES.items():
        assert stored[d] == (None if held else body), d
    assert stored["masked"] == ""
    assert _texts(store) == _expected()

"""Embeddings stored as ``halfvec``: half the bytes per dimension, HNSW over half precision.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

A 384-d ``vector`` is 1,544 bytes in every chunk row and again in every HNSW element; as
16-bit floats it is 776. Sentence embeddings are unit vectors whose components sit far
inside half precision's range, and the cosine between two of them moves by about 1e-3 at
most: the neighbours a search returns do not change in any way the quality suites can see
(nDCG and filtered recall before and after are in BENCHMARKS.md's footprint section). The
query vector is cast to ``halfvec`` too, so the HNSW index (``halfvec_cosine_ops``) and
the exact path compare like with like.

PostgreSQL changes a column's type by rewriting the table under an exclusive lock, so the
upgrade is not online: every chunk row is rewritten once and the vector index is built
again (with the memory and workers a bulk load's build gets). An index whose vector build
was deferred by an interrupted load keeps its note, rewritten to the new operator class.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

from context_search.postgres.indexes.builds import DEFERRED_NOTE, build_settings

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _convert(new_type: str, old_ops: str, new_ops: str) -> None:
    bind = op.get_bind()
    dimension = bind.execute(
        text(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = CAST('chunks' AS regclass) "
            "AND attname = 'embedding'"
        )
    ).scalar_one()
    rows = bind.execute(text("SELECT reltuples FROM pg_class WHERE oid = 'chunks'::regclass"))
    estimate = max(0, int(rows.scalar_one() or 0))
    indexes = bind.execute(
        text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'chunks' AND indexdef LIKE :ops"
        ),
        {"ops": f"%{old_ops}%"},
    ).all()
    for name, _ in indexes:
        op.execute(f'DROP INDEX "{name}"')
    op.execute(
        f"ALTER TABLE chunks ALTER COLUMN embedding TYPE {new_type}({dimension}) "
        f"USING embedding::{new_type}({dimension})"
    )
    # A type change resets the column's storage to the type's default (EXTERNAL): keep the
    # vector in the row (migration 0010).
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE MAIN")
    if indexes:
        mem_mb, workers = build_settings(estimate, int(dimension))
        op.execute(f"SET LOCAL maintenance_work_mem = '{int(mem_mb)}MB'")
        op.execute(f"SET LOCAL max_parallel_maintenance_workers = {int(workers)}")
    for _, definition in indexes:
        # On a partitioned table the parent's definition reads "ON ONLY": built from the
        # parent, the index is made on every partition too.
        op.execute(definition.replace(old_ops, new_ops).replace(" ON ONLY ", " ON "))
    note = bind.execute(text("SELECT obj_description('chunks'::regclass, 'pg_class')")).scalar()
    if note and note.startswith(DEFERRED_NOTE) and old_ops in note:
        bind.execute(
            text("SELECT set_config('cs.note', :n, true)"),
            {"n": note.replace(old_ops, new_ops)},
        )
        op.execute(
            "DO $$ BEGIN EXECUTE format('COMMENT ON TABLE chunks IS %L', "
            "current_setting('cs.note')); END $$"
        )


def upgrade() -> None:
    _convert("halfvec", "vector_cosine_ops", "halfvec_cosine_ops")


def downgrade() -> None:
    _convert("vector", "halfvec_cosine_ops", "vector_cosine_ops")

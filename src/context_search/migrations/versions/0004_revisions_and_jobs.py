"""Config revisions as content hashes; the job queue with leases, backoff and propagation times.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

``index_configs.config_id`` is a stable hash of everything that shapes an index entry
(chunker version and parameters, embedding model and dimension, text-search configuration):
two processes with the same settings agree on the revision without coordinating, and going
back to an old configuration makes the entries built under it fresh again.

``index_jobs`` becomes a queue that several workers drain with ``FOR UPDATE SKIP LOCKED``:
a claimed job holds a lease (``lease_until``); a worker that dies stops renewing it and the
job is claimed again once it expires. Failures go back to ``pending`` with ``run_after``
pushed out exponentially, and end in ``failed`` with their error once attempts run out.
``requested_at`` / ``visible_at`` / ``done_at`` measure propagation: when the change was
asked for, when search behaviour changed, and when the physical work finished. ``scopes``
are the permission scopes the job concerns, so the reader role sees (and counts) only jobs
about documents it may see.
"""

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from context_search.migrations.target import target_schema

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = "COALESCE(NULLIF(current_setting('context_search.allowed_scopes', true), ''), '{}')"


def _config_id(model: str, dimension: int, chunk_bytes: int, overlap: int, ts: str) -> str:
    # A frozen copy of contract.index_config_revision: a migration must not import code
    # that can change after it shipped.
    blob = json.dumps(
        {
            "chunk_bytes": chunk_bytes,
            "chunk_overlap": overlap,
            "chunker": "utf8-window-v1",
            "dimension": dimension,
            "embedding_model": model,
            "text_search_config": ts,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "cfg:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def upgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    op.add_column("index_configs", sa.Column("config_id", sa.Text(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT revision, embedding_model, dimension, chunk_bytes, chunk_overlap, "
            "text_search_config FROM index_configs"
        )
    ).all()
    seen: set[str] = set()
    for r in rows:
        cid = _config_id(r[1], r[2], r[3], r[4], r[5])
        if cid in seen:  # duplicates of one configuration: keep them apart, oldest wins
            cid = f"{cid}-r{r[0]}"
        seen.add(cid)
        bind.execute(
            sa.text("UPDATE index_configs SET config_id = :c WHERE revision = :r"),
            {"c": cid, "r": r[0]},
        )
    op.alter_column("index_configs", "config_id", nullable=False)
    op.create_unique_constraint("uq_index_configs_config_id", "index_configs", ["config_id"])

    op.alter_column("index_jobs", "enqueued_at", new_column_name="requested_at")
    op.alter_column("index_jobs", "finished_at", new_column_name="done_at")
    op.add_column("index_jobs", sa.Column("visible_at", sa.DateTime(timezone=True)))
    op.add_column(
        "index_jobs",
        sa.Column(
            "run_after", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.add_column("index_jobs", sa.Column("lease_until", sa.DateTime(timezone=True)))
    op.add_column("index_jobs", sa.Column("worker_id", sa.Text()))
    op.add_column(
        "index_jobs",
        sa.Column("scopes", pg.ARRAY(sa.Text()), nullable=False, server_default="{}"),
    )
    op.add_column(
        "index_jobs", sa.Column("payload", pg.JSONB(), nullable=False, server_default="{}")
    )
    op.execute(
        "UPDATE index_jobs j SET scopes = ARRAY[d.permission_scope], visible_at = j.requested_at "
        "FROM documents d WHERE d.doc_id = j.doc_id"
    )
    op.drop_index("ix_index_jobs_status_job_id", table_name="index_jobs")
    op.create_index("ix_index_jobs_status_run_after", "index_jobs", ["status", "run_after"])
    op.create_index(
        "ux_index_jobs_pending_index",
        "index_jobs",
        ["doc_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'index' AND status = 'pending'"),
    )
    op.execute(f'GRANT SELECT ON "{schema}".index_jobs TO "{role}"')
    op.execute(f'ALTER TABLE "{schema}".index_jobs ENABLE ROW LEVEL SECURITY')
    op.execute(
        f'CREATE POLICY index_jobs_scope_read ON "{schema}".index_jobs FOR SELECT '
        f'TO "{role}" USING (scopes && CAST({_SCOPES} AS text[]))'
    )


def downgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    op.execute(f'DROP POLICY IF EXISTS index_jobs_scope_read ON "{schema}".index_jobs')
    op.execute(f'ALTER TABLE "{schema}".index_jobs DISABLE ROW LEVEL SECURITY')
    op.execute(f'REVOKE ALL ON "{schema}".index_jobs FROM "{role}"')
    op.drop_index("ux_index_jobs_pending_index", table_name="index_jobs")
    op.drop_index("ix_index_jobs_status_run_after", table_name="index_jobs")
    op.create_index("ix_index_jobs_status_job_id", "index_jobs", ["status", "job_id"])
    for column in ("payload", "scopes", "worker_id", "lease_until", "run_after", "visible_at"):
        op.drop_column("index_jobs", column)
    op.alter_column("index_jobs", "done_at", new_column_name="finished_at")
    op.alter_column("index_jobs", "requested_at", new_column_name="enqueued_at")
    op.drop_constraint("uq_index_configs_config_id", "index_configs", type_="unique")
    op.drop_column("index_configs", "config_id")

"""Row-level security: a reader role that only sees rows in its per-transaction scopes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03

Searches run as ``<schema>_reader`` (``SET LOCAL ROLE``) with the caller's scopes in the
transaction-local setting ``context_search.allowed_scopes`` (a text[] literal). The policies
read that setting, so even a query that forgot its scope predicate returns nothing outside
the caller's scopes. An unset or empty setting means no rows. Writers keep using the owning
role, which RLS does not restrict (the role owns the tables).
"""

from collections.abc import Sequence

from alembic import op

from context_search.migrations.target import target_schema

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = "COALESCE(NULLIF(current_setting('context_search.allowed_scopes', true), ''), '{}')"
_POLICY = f"permission_scope = ANY (CAST({_SCOPES} AS text[]))"


def upgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    op.execute(  # schema names are validated identifiers ([a-z_][a-z0-9_]*)
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                CREATE ROLE "{role}" NOLOGIN NOSUPERUSER NOINHERIT NOBYPASSRLS;
            END IF;
        END
        $$
        """
    )
    op.execute(f'GRANT "{role}" TO CURRENT_USER')
    op.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
    op.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
    for table in ("documents", "chunks"):
        op.execute(f'GRANT SELECT ON "{schema}".{table} TO "{role}"')
        op.execute(f'ALTER TABLE "{schema}".{table} ENABLE ROW LEVEL SECURITY')
        op.execute(
            f'CREATE POLICY {table}_scope_read ON "{schema}".{table} FOR SELECT '
            f'TO "{role}" USING ({_POLICY})'
        )
    op.execute(f'GRANT SELECT ON "{schema}".index_configs TO "{role}"')


def downgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    for table in ("documents", "chunks"):
        op.execute(f'DROP POLICY IF EXISTS {table}_scope_read ON "{schema}".{table}')
        op.execute(f'ALTER TABLE "{schema}".{table} DISABLE ROW LEVEL SECURITY')
        op.execute(f'REVOKE ALL ON "{schema}".{table} FROM "{role}"')
    op.execute(f'REVOKE ALL ON "{schema}".index_configs FROM "{role}"')
    op.execute(f'REVOKE USAGE ON SCHEMA "{schema}" FROM "{role}"')
    op.execute(f'REVOKE USAGE ON SCHEMA public FROM "{role}"')
    op.execute(f'DROP ROLE IF EXISTS "{role}"')

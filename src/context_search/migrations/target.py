"""The schema a running migration writes to.

DDL that names its schema (functions, triggers, policies) cannot rely on ``search_path``: a
function body is resolved when it runs, in whatever path the caller has. The runner passes
the index's schema (``config.attributes`` from the library, ``-x schema=…`` from the alembic
command line); without one it is the package default.
"""

from alembic import context

__all__ = ["target_schema"]


def target_schema() -> str:
    schema = context.config.attributes.get("schema") or context.get_x_argument(
        as_dictionary=True
    ).get("schema", "context_search")
    return str(schema)

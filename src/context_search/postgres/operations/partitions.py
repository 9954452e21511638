"""Chunks partitioned by permission scope: a search graph of its own per scope.

One global HNSW graph serves a selective scope badly: the iterative scan walks the graph
until enough in-scope chunks turn up, and what it finds is further from the exact answer
(``python -m benchmarks partitions``: a narrow scope is both slower and less exact through the
global graph than in a partition of its own; figures in BENCHMARKS.md). So an index can give
its large or heavily searched scopes partitions of their own::

    connector.partition_scopes(["tenant-a", "tenant-b"])

``chunks`` becomes LIST-partitioned by ``permission_scope``: one partition
per named scope, each with its own HNSW graph, and a DEFAULT
partition holding every other scope (which is where the existing rows stay: converting an
index renames its tables into the default partitions and reuses their search indexes; only
the keys' B-trees are built again, now with the scope in them). A search names its scopes
as values, so the planner reads only the caller's partitions. Every other statement is
unchanged: inserts are routed by scope, and a rescope that changes partition moves the rows
within its own transaction, so no reader ever sees a chunk under its old scope after the
commit.

What PostgreSQL requires of a partitioned table, and what it costs here:

- every primary and unique key includes the partition key: ``chunks`` is keyed by
  ``(chunk_id, permission_scope)``. ``chunk_id`` still comes from one identity sequence, and a
  chunk's scope is its document's, so the key is as unique as before;
- triggers with transition tables live on the partitioned table only (the postings
  triggers are recreated there). Posting blocks stay one table: their B-tree is ordered by
  scope within each lexeme already, and rows moved between partitions keep their ids, so
  their postings stay as they are;
- ``CREATE INDEX CONCURRENTLY`` does not apply to partitioned indexes, so large loads into
  a partitioned index maintain the HNSW graphs row by row instead of building them
  afterwards (see ``indexes/builds.py``);
- converting, or giving a scope its partition later (its rows move out of the default
  partition into a new table, indexed in bulk, then attached), holds ``chunks`` locked
  for the whole transaction: every search and every write waits. A
  search whose snapshot was taken before the move committed and that then waited for the
  lock does not see the moved rows (PostgreSQL's caveat for rows rewritten into new tables,
  as with ``TRUNCATE``): partition scopes when the index is created or in a quiet moment;
- partition bounds and each partition's comment name its scope, and the statistics views
  count its rows: any database role can read the catalogs, so the scopes' names and sizes
  are visible to whoever can log in (not to the library's callers).

Asking again for scopes that already have partitions takes no lock. Everything else is
one transaction: a failure leaves the tables as they were.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy import Engine, text

from context_search.errors import InvalidConfigError, InvalidInputError, SchemaNotReadyError
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.pause import give_way
from context_search.postgres.indexes.builds import (
    IS_PARTITIONED,
    VECTOR_INDEX_NEXT,
    build_settings,
    index_states,
    load_lock_key,
    pending_builds,
    tables_partitioned,
)
from context_search.postgres.write.gate import GATE, lock_key
from context_search.validation import validate_scope

__all__ = [
    "PARTITIONED_TABLES",
    "is_partitioned",
    "partition_by_scope",
    "partition_index",
    "scope_partitions",
]

#: The tables partitioned by scope, in lock order (the order writers touch them).
PARTITIONED_TABLES = ("chunks",)
_KEY = "permission_scope"
_DEFAULT = "{}_default"
_IDENTITY_SEQUENCE = "chunks_chunk_id_seq"


@dataclass(frozen=True, slots=True)
class _TableDefinition:
    """What a table's conversion recreates on the partitioned table, read from the catalog
    (so it follows whatever the migrations made, not a copy of them)."""

    keys: list[tuple[str, str]]  # primary and unique constraints: (name, definition)
    foreign_keys: list[tuple[str, str]]
    indexes: list[tuple[str, str]]  # name, CREATE INDEX statement
    triggers: list[tuple[str, str]]  # name, CREATE TRIGGER statement
    policies: list[sql.Composed]
    grants: list[tuple[str, str]]  # grantee, privilege
    row_security: tuple[bool, bool]  # enabled, forced
    identity: str | None  # the identity column
    owner: str


def is_partitioned(engine: Engine) -> bool:
    """Whether the index's tables are partitioned by scope (read when a connector opens)."""
    with translate_errors("open"), engine.connect() as conn:
        return bool(conn.execute(text(IS_PARTITIONED)).scalar_one())


def scope_partitions(raw: Any) -> tuple[str, ...] | None:
    """The scopes with a partition of their own, in name order, or ``None`` when the
    index's tables are not partitioned (``raw``: a psycopg connection on the schema)."""
    if not tables_partitioned(raw):
        return None
    rows = raw.execute(
        "SELECT obj_description(i.inhrelid, 'pg_class') FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = CAST('chunks' AS regclass) "
        "AND NOT pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'"
    ).fetchall()
    return tuple(sorted(str(r[0]) for r in rows))


def partition_index(
    engine: Engine, scopes: Sequence[str], *, lock_wait: LockWait | None = None
) -> tuple[str, ...]:
    """:func:`partition_by_scope` on a connection of ``engine`` (whose ``search_path`` is the
    index's schema), with no statement time limit: moving a large scope takes a while."""
    with autocommit_session(engine, "partition scopes") as raw:
        raw.execute("SET statement_timeout = 0")
        try:
            return partition_by_scope(raw, scopes, lock_wait=lock_wait)
        finally:
            raw.execute("RESET statement_timeout")


@dataclass(frozen=True)
class LockWait:
    """How the move waits for its exclusive lock on the tables.

    While a ``LOCK TABLE`` waits for the searches and writes in flight, every search that
    arrives after it queues behind it: one long transaction on the tables would stall all
    searches for as long as it runs. So the move waits at most ``wait_s`` for each table's
    lock (two tables: a search may wait up to twice that), then gives up its place (the
    queued searches run), pauses and tries again, ``attempts`` times in all, before it
    fails with ``BACKEND_ERROR`` (SQLSTATE 55P03, nothing moved).
    """

    wait_s: float = 2.0
    attempts: int = 10
    pause_s: float = 0.5

    def __post_init__(self) -> None:
        if not (self.wait_s > 0 and self.attempts >= 1 and self.pause_s >= 0):
            raise InvalidConfigError(
                "a lock wait needs wait_s > 0, attempts >= 1 and pause_s >= 0",
                details={"field": "lock_wait"},
            )


def partition_by_scope(
    raw: Any, scopes: Sequence[str], *, lock_wait: LockWait | None = None
) -> tuple[str, ...]:
    """Give each of ``scopes`` a partition of its own (partitioning the tables first if they
    are not), in one transaction behind the write gate; returns every partitioned scope.

    Idempotent: a scope that already has its partition is left as it is. ``raw`` is a
    psycopg connection in autocommit whose ``search_path`` is the index's schema.
    ``lock_wait`` bounds each wait for the tables' lock (:class:`LockWait`).
    """
    wanted = _checked(scopes)
    existing = scope_partitions(raw)
    if existing is not None and set(wanted) <= set(existing):
        return existing  # nothing to move: no lock taken, no reader or writer waits
    waits = lock_wait or LockWait()
    return give_way(
        lambda: _move(raw, wanted, waits.wait_s), attempts=waits.attempts, pause_s=waits.pause_s
    )


def _move(raw: Any, wanted: list[str], wait_s: float) -> tuple[str, ...]:
    """One attempt of :func:`partition_by_scope`; ``LockNotAvailable`` when the tables'
    lock was not granted within ``wait_s`` (the transaction rolled back, nothing moved)."""
    with raw.transaction():
        # A bulk load holds this key while it has search indexes dropped (indexes/builds.py):
        # wait for it to finish (before the gate, which its batches pass), so it never meets
        # a partitioned table it cannot rebuild its indexes on.
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (load_lock_key(raw),))
        # Writers wait at the gate before touching any table, so none holds a document row
        # lock while waiting for the tables locked here (which would deadlock).
        schema = raw.execute("SELECT current_schema()").fetchone()[0]
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(raw, schema, GATE),))
        # Bounded: searches arriving while this waits queue behind it (``LockWait``).
        raw.execute(
            sql.SQL("SET LOCAL lock_timeout = {}").format(
                sql.Literal(f"{max(1, round(wait_s * 1000))}ms")
            )
        )
        raw.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in PARTITIONED_TABLES)
            )
        )
        raw.execute("SET LOCAL lock_timeout TO DEFAULT")  # held: the session's own again
        if scope_partitions(raw) is None:
            _refuse_pending_builds(raw)
            for table in PARTITIONED_TABLES:
                _convert(raw, table)
        have = set(scope_partitions(raw) or ())
        new = [s for s in wanted if s not in have]
        for scope in new:
            for table in PARTITIONED_TABLES:
                _carve(raw, table, scope)
        if new:
            # New partitions have no statistics: planned as empty, a search would sort a
            # scope's chunks by distance instead of walking its graph.
            raw.execute(
                sql.SQL("ANALYZE {}").format(
                    sql.SQL(", ").join(map(sql.Identifier, PARTITIONED_TABLES))
                )
            )
        return tuple(sorted(have | set(wanted)))


def _checked(scopes: Sequence[str]) -> list[str]:
    """The scopes as a write takes them; a bare string is refused, not split into letters
    (a partition, once made, stays)."""
    if isinstance(scopes, (str, bytes)) or not isinstance(scopes, (Sequence, set, frozenset)):
        raise InvalidInputError(
            "scopes must be a sequence of permission scopes", details={"field": "scopes"}
        )
    checked = {validate_scope(s, name="scopes[]") for s in scopes}
    if any(not s.strip() for s in checked):
        raise InvalidInputError("a scope must not be blank", details={"field": "scopes[]"})
    return sorted(checked)


def _refuse_pending_builds(raw: Any) -> None:
    """A load that dropped search indexes to build them afterwards notes them in the comment
    of ``chunks``; converting would lose the note, so the indexes must exist first."""
    pending = pending_builds(raw)
    if index_states(raw, [VECTOR_INDEX_NEXT]):  # a vector graph conversion killed midway
        pending[VECTOR_INDEX_NEXT] = "conversion"
    if pending:
        raise SchemaNotReadyError(
            "a bulk load has search indexes still to build; let it finish (or open the "
            "connector, which builds them) before partitioning",
            details={"indexes": sorted(pending)},
        )


def _indexes(raw: Any, table: str) -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of ``table``'s indexes that back no constraint."""
    rows = raw.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = CAST(%s AS regclass) "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) "
        "ORDER BY c.relname",
        (table,),
    ).fetchall()
    return [(str(n), str(d)) for n, d in rows]


def _partition_name(table: str, scope: str) -> str:
    # Scopes are arbitrary text; partition names are identifiers, so a digest names them
    # and the partition's comment holds the scope itself.
    return f"{table}_s_{hashlib.sha256(scope.encode()).hexdigest()[:16]}"


def _definition(raw: Any, table: str) -> _TableDefinition:
    oid = sql.SQL("CAST({} AS regclass)").format(sql.Literal(table))

    def rows(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        statement = sql.SQL(query).format(oid=oid)
        return [tuple(r) for r in raw.execute(statement, params).fetchall()]

    constraints = rows(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = {oid} AND contype IN ('p', 'u', 'f') ORDER BY conname"
    )
    triggers = rows(
        "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
        "WHERE tgrelid = {oid} AND NOT tgisinternal ORDER BY tgname"
    )
    policies = []
    for name, permissive, roles, command, qual, check in rows(
        "SELECT policyname, permissive, roles, cmd, qual, with_check FROM pg_policies "
        "WHERE schemaname = current_schema() AND tablename = %s ORDER BY policyname",
        (table,),
    ):
        statement = sql.SQL("CREATE POLICY {} ON {} AS {} FOR {} TO {}").format(
            sql.Identifier(name),
            sql.Identifier(table),
            sql.SQL(permissive),
            sql.SQL(command),
            sql.SQL(", ").join(
                sql.SQL("PUBLIC") if r == "public" else sql.Identifier(r) for r in roles
            ),
        )
        if qual is not None:
            statement = sql.Composed([statement, sql.SQL(" USING ({})").format(sql.SQL(qual))])
        if check is not None:
            statement = sql.Composed(
                [statement, sql.SQL(" WITH CHECK ({})").format(sql.SQL(check))]
            )
        policies.append(statement)
    grants = rows(
        "SELECT r.rolname, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
        "JOIN pg_roles r ON r.oid = a.grantee WHERE c.oid = {oid} AND a.grantee <> c.relowner"
    )
    flags = rows(
        "SELECT relrowsecurity, relforcerowsecurity, pg_get_userbyid(relowner) "
        "FROM pg_class WHERE oid = {oid}"
    )
    identity = rows("SELECT attname FROM pg_attribute WHERE attrelid = {oid} AND attidentity <> ''")
    return _TableDefinition(
        keys=[(str(n), str(d)) for n, t, d in constraints if t in ("p", "u")],
        foreign_keys=[(str(n), str(d)) for n, t, d in constraints if t == "f"],
        indexes=_indexes(raw, table),
        triggers=[(str(n), str(d)) for n, d in triggers],
        policies=policies,
        grants=[(str(g), str(p)) for g, p in grants],
        row_security=(bool(flags[0][0]), bool(flags[0][1])),
        identity=str(identity[0][0]) if identity else None,
        owner=str(flags[0][2]),
    )


def _with_key(definition: str) -> str:
    """``PRIMARY KEY (a, b)`` -> ``PRIMARY KEY (a, b, permission_scope)``."""
    head, _, columns = definition.partition("(")
    names = [c.strip() for c in columns.rstrip(")").split(",")]
    if _KEY not in names:
        names.append(_KEY)
    return f"{head}({', '.join(names)})"


def _convert(raw: Any, table: str) -> None:
    """``table`` becomes a LIST-partitioned table whose DEFAULT partition is the old table,
    rows and indexes included."""
    found = _definition(raw, table)
    old = sql.Identifier(_DEFAULT.format(table))
    new = sql.Identifier(table)
    run = raw.execute
    run(sql.SQL("ALTER TABLE {} RENAME TO {}").format(new, old))
    # Names are schema-wide for indexes: the old table's take a suffix, and the partitioned
    # table's indexes of the same definition adopt them instead of building new ones.
    for name, _ in found.indexes:
        run(
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(name), sql.Identifier(f"{name}_default")
            )
        )
    # Keys without the partition key cannot stay (one primary key per table); the
    # partitioned table's own keys and foreign keys apply to the partition when attached.
    for name, _ in (*found.foreign_keys, *found.keys):
        run(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(old, sql.Identifier(name)))
    for name, _ in found.triggers:  # transition tables are not allowed on a partition
        run(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(name), old))
    next_id = None
    if found.identity is not None:
        column = sql.Identifier(found.identity)
        next_id = run(
            sql.SQL("SELECT GREATEST((SELECT max({}) FROM {}), {}) + 1").format(
                column,
                old,
                sql.SQL("(SELECT last_value FROM {})").format(sql.Identifier(_IDENTITY_SEQUENCE)),
            )
        ).fetchone()[0]
        run(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP IDENTITY").format(old, column))
    run(
        sql.SQL(
            "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING STORAGE INCLUDING COMPRESSION) PARTITION BY LIST ({})"
        ).format(new, old, sql.Identifier(_KEY))
    )
    # The index keeps its owner whoever partitions it (an operator's role, say): the
    # application's role keeps every right on its tables.
    run(sql.SQL("ALTER TABLE {} OWNER TO {}").format(new, sql.Identifier(found.owner)))
    if found.identity is not None:
        run(
            sql.SQL(
                "ALTER TABLE {} ALTER COLUMN {} ADD GENERATED BY DEFAULT AS IDENTITY "
                "(SEQUENCE NAME {} START WITH {})"
            ).format(
                new,
                sql.Identifier(found.identity),
                sql.Identifier(_IDENTITY_SEQUENCE),
                sql.Literal(int(next_id or 1)),
            )
        )
    for name, definition in found.keys:
        run(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                new, sql.Identifier(name), sql.SQL(_with_key(definition))
            )
        )
    run(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} DEFAULT").format(new, old))
    for name, definition in found.foreign_keys:
        run(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                new, sql.Identifier(name), sql.SQL(definition)
            )
        )
    for _, statement in (*found.indexes, *found.triggers):
        run(statement)  # read before the rename: they name the partitioned table now
    enabled, forced = found.row_security
    if enabled:
        run(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(new))
    if forced:
        run(sql.SQL("ALTER TABLE {} FORCE ROW LEVEL SECURITY").format(new))
    for policy in found.policies:
        run(policy)
    for grantee, privilege in found.grants:
        role = sql.Identifier(grantee)
        run(sql.SQL("GRANT {} ON {} TO {}").format(sql.SQL(privilege), new, role))
        # Readers go through the partitioned table (and its policies) only.
        run(sql.SQL("REVOKE {} ON {} FROM {}").format(sql.SQL(privilege), old, role))
    run(sql.SQL("COMMENT ON TABLE {} IS NULL").format(old))


def _carve(raw: Any, table: str, scope: str) -> None:
    """Move ``scope``'s rows of ``table`` out of the default partition into its own: copied
    into a new table, indexed in bulk (an HNSW graph built at once, with the load path's
    memory and workers, instead of one insertion per row), then attached."""
    run = raw.execute
    default = sql.Identifier(_DEFAULT.format(table))
    part = sql.Identifier(_partition_name(table, scope))
    where = sql.SQL("{} = {}").format(sql.Identifier(_KEY), sql.Literal(scope))
    run(
        sql.SQL(
            "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING STORAGE INCLUDING COMPRESSION)"
        ).format(part, sql.Identifier(table))
    )
    run(sql.SQL("COMMENT ON TABLE {} IS {}").format(part, sql.Literal(scope)))
    owner = run(
        "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = CAST(%s AS regclass)",
        (table,),
    ).fetchone()[0]
    run(sql.SQL("ALTER TABLE {} OWNER TO {}").format(part, sql.Identifier(owner)))
    # Nobody is granted the partition itself; with row security on and no policy, a grant
    # made by mistake still shows no row (readers go through the partitioned table).
    run(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(part))
    # Direct reads and writes of the partitions: the statement triggers of the partitioned
    # table do not fire, so the per-scope counters stay as they are (the rows are the same).
    moved = run(
        sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE {}").format(part, default, where)
    ).rowcount
    run(sql.SQL("DELETE FROM {} WHERE {}").format(default, where))
    dimension = run(
        "SELECT max(atttypmod) FROM pg_attribute "
        "WHERE attrelid = CAST(%s AS regclass) AND atttypid = CAST('halfvec' AS regtype)",
        (table,),
    ).fetchone()[0]
    mem_mb, workers = build_settings(max(1, moved), int(dimension or 0))
    run(sql.SQL("SET LOCAL maintenance_work_mem = {}").format(sql.Literal(f"{mem_mb}MB")))
    run(sql.SQL("SET LOCAL max_parallel_maintenance_workers = {}").format(sql.Literal(workers)))
    for _, definition in _indexes(raw, table):
        # "CREATE INDEX name ON ONLY schema.table USING ..." -> the same index on the new
        # table (named by the server); attaching adopts it for the partitioned index.
        method = definition.split(" USING ", 1)[1]
        run(sql.SQL("CREATE INDEX ON {} USING {}").format(part, sql.SQL(method)))
    run(
        sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES IN ({})").format(
            sql.Identifier(table), part, sql.Literal(scope)
        )
    )

"""Postings in impact-ordered blocks: the lexical arm's index at a fraction of a row each.

A posting as a row (chunk id, lexeme, scope, lifecycle, tf, impact, plus a tuple header and
its copy in a covering index) cost ~110 bytes; a chunk has ~70. Here the postings of one
(lexeme, scope, lifecycle) group are cut into blocks of :data:`BLOCK_SIZE`, strongest first:
one row holds the chunk ids and impacts of up to 128 postings (12 bytes each) and the
block's largest impact, and one B-tree entry per block orders a group's blocks by it.

Writes never rewrite a block. Every statement that writes chunks appends blocks for the
chunks it created, and marks the postings of the chunks it removed dead in a per-group
tombstone list: statement triggers on ``chunks`` do both, and keep ``term_stats`` (document
frequencies, and how many blocks each group has) in the same transaction, whatever path
wrote the chunks. A chunk that changes scope or lifecycle takes a new ``chunk_id`` (the
trigger refuses a relabel in place): its old postings die under the old id, its new ones are
born in the new group, and a chunk id is never reused, so a dead posting can never come back.

Each write appends at most one partial block per group it touches (the rest of its postings
fill whole blocks), so many small writes leave a tail of partial blocks, and tombstones
grow. Merges (``indexes/blocks.py``, run after writes and by the job queue) come in two
sizes, as in a log-structured index: a *tail merge* recuts only a group's partial blocks
into full ones, at a cost in proportion to what was written since; a *full merge* rewrites
the group into disjoint full blocks without its dead postings once the postings written
since its last full merge (``term_stats.fresh``) are as many as the rest, so a posting is
rewritten a bounded number of times however large its group grows. A search reads a group
exactly whatever its state (``read/sql/lexical.py``): a group in one sorted run
(``fresh`` 0, :data:`UNSORTED_GROUPS`) from its first blocks alone, any other through a
threshold, the bound-th strongest live posting among its first blocks, reading every block
whose maximum exceeds it.

The SQL here is the one definition of a block: the triggers (created by migration 0014) and
the merge cut blocks with :func:`cut_blocks`; the schema's models and the search statement
read their constants from here.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = [
    "BLOCK_SIZE",
    "BUILD_DEFERRED_STEPS",
    "CUT_TABLE",
    "DEFERRING",
    "DEFER_SETTING",
    "GROUP",
    "IMPACT",
    "LIVE_POSTINGS",
    "PARTIAL_DUE",
    "TOKEN_COUNT",
    "TOMBSTONES_DUE",
    "UNSORTED_GROUPS",
    "build_deferred",
    "cut_blocks",
    "due",
    "fragmented",
    "full_due",
    "listed_cut",
    "trigger_function",
]

#: Postings per block: 128 chunk ids and impacts are ~1.6 kB, so a block row stays under
#: PostgreSQL's TOAST threshold (~2 kB) and is read with its page, uncompressed.
BLOCK_SIZE = 128

#: BM25's term-frequency part against a 200-token reference length (k1=1.2, b=0.75): it only
#: orders postings; scores are computed exactly at query time. ``r``: the chunk row, ``t.tf``
#: the lexeme's term frequency in it. In double precision: the same expression in numeric
#: (what plain decimal literals make it) costs a numeric operation per step for every posting
#: a write or a load's cut makes, and rounds to the same ``real`` for every tf (1 to 256, the
#: most a tsvector keeps) and length up to 10,000 tokens (``test_posting_blocks.py``).
#: Migration 0018 puts it in the trigger of indexes created before.
IMPACT = (
    "CAST(t.tf * float8 '2.2' / (t.tf + float8 '1.2' * "
    "(float8 '0.25' + float8 '0.75' * r.token_count / float8 '200')) AS real)"
)


#: A chunk's length in tokens (what BM25 normalises by) from ``v.tsv``: every position of
#: every lexeme. The sum of each lexeme's position count is the same figure as a count of
#: the unnested positions, at one set-returning call per chunk instead of one per lexeme
#: (the nested count was a large part of a chunk insert's time after ``to_tsvector``).
TOKEN_COUNT = "COALESCE((SELECT sum(cardinality(u.positions)) FROM unnest(v.tsv) AS u), 0)"  # noqa: S105


def fragmented(blocks: str = "blocks", df: str = "df") -> str:
    """Whether a group with ``blocks`` blocks and ``df`` live postings (SQL expressions) is due
    for a merge as migration 0014 decided it (until 0017 replaced it with :func:`due`): more
    than twice a merged layout's blocks, and four more. Counting blocks, it rewrote a whole
    group for a tail of partial blocks holding a few postings each."""
    return f"({blocks}) > 2 * (({df}) + {BLOCK_SIZE - 1}) / {BLOCK_SIZE} + 4"


#: A group's partial blocks (under :data:`BLOCK_SIZE` postings) are recut into full ones once
#: they are more than this many: a search may read each of them (their maxima are not
#: ordered against the group's other blocks), so they are bounded, and a tail merge costs
#: only the postings they hold.
PARTIAL_DUE = 8


def full_due(fresh: str, df: str) -> str:
    """Whether a group is due for a full merge: the postings written into it since its last
    full merge (``fresh``) are at least a block and as many as the rest of its ``df`` live
    postings. Each full merge then rewrites at most twice what was written since the last,
    so a posting is rewritten a bounded number of times on average."""
    return f"(({fresh}) >= {BLOCK_SIZE} AND 2 * ({fresh}) > ({df}))"


def due(partial: str, fresh: str, df: str) -> str:
    """``term_stats.due``: a tail merge (more than :data:`PARTIAL_DUE` partial blocks) or a
    full one (:func:`full_due`) is due. Only a change of verdict touches the partial index
    ``ix_term_stats_due``, so the counters' updates stay HOT."""
    return f"(({partial}) > {PARTIAL_DUE} OR {full_due(fresh, df)})"


#: ``term_stats.fresh`` (row ``s``) after a statement appended its ``df`` delta of postings to
#: the group: a group that had no blocks now has one sorted run, as a full merge leaves it.
_FRESH_AFTER = "CASE WHEN s.blocks = 0 THEN s.fresh ELSE s.fresh + EXCLUDED.df END"
#: ``term_stats.due`` after an upsert adds ``EXCLUDED``'s counts to the row's.
_DUE_AFTER = due("s.partial + EXCLUDED.partial", _FRESH_AFTER, "s.df + EXCLUDED.df")

#: ... after one that changes only ``df`` (chunks removed, or an initial load's listed ones).
_DUE_DF = due("s.partial", "s.fresh", "s.df + EXCLUDED.df")
#: Before migration 0017 (no ``partial``/``fresh``): blocks against a merged layout's.
_DUE_AFTER_0014 = fragmented("s.blocks + EXCLUDED.blocks", "s.df + EXCLUDED.df")

#: A group's tombstones are purged once they are 64, or an eighth of its live postings: a
#: search compares every posting it reads with its group's tombstones.
TOMBSTONES_DUE = "cardinality(t.chunk_ids) >= LEAST(64, GREATEST(1, s.df / 8))"

GROUP = "lexeme, permission_scope, lifecycle"

#: A group whose ``term_stats.fresh`` is 0 holds one sorted run: its blocks were cut by one
#: statement (its first write, an initial load's cut or a full merge) and nothing was written
#: into it since. Its blocks are then the run's slices, all full but the last, and ordered
#: as the run is by their largest impact and then their first chunk id (what
#: ``ix_posting_blocks_run`` orders them by), so a search reads a clean group's strongest
#: postings from its first blocks alone (``read/sql/lexical.py``). Migration 0020 and
#: the audit check it with this: the groups whose blocks, in that order, are not one run
#: (a block before another that is not full, or whose last posting does not rank before
#: the next block's first). It reads only the blocks' ends: the order inside a block, which
#: a search of a clean group slices without sorting, is every cut's own (``cut_blocks``).
UNSORTED_GROUPS = f"""
    SELECT DISTINCT lexeme, permission_scope, lifecycle
    FROM (SELECT lexeme, permission_scope, lifecycle, max_impact, head,
                 lag(n) OVER w AS prev_n, lag(low) OVER w AS prev_low,
                 lag(tail) OVER w AS prev_tail
          FROM (SELECT lexeme, permission_scope, lifecycle, max_impact,
                       chunk_ids[1] AS head, cardinality(chunk_ids) AS n,
                       impacts[cardinality(impacts)] AS low,
                       chunk_ids[cardinality(chunk_ids)] AS tail
                FROM posting_blocks) AS b
          WINDOW w AS (PARTITION BY {GROUP} ORDER BY max_impact DESC, head)) AS b
    WHERE prev_n < {BLOCK_SIZE} OR prev_low < max_impact
       OR (prev_low = max_impact AND prev_tail >= head)"""

#: Set while this thread's writes are an initial load's batches (``indexes/builds.py``):
#: each batch turns :data:`DEFER_SETTING` on in its transaction (``write/gate.py``).
DEFERRING: ContextVar[bool] = ContextVar("context_search_deferring_postings", default=False)

#: A transaction-local setting: on, the triggers list new chunks in ``posting_deferred``
#: instead of cutting their blocks (an initial load's batches; ``indexes/builds.py``).
DEFER_SETTING = "context_search.defer_postings"

#: The cut of every deferred chunk still listed, in one transaction: the list is locked first
#: (a writer removing a listed chunk waits, then finds it counted and tombstones it), the
#: blocks are cut into a transaction-local table, then appended with their groups' document
#: frequencies, and the list is emptied: of exactly the chunks locked, or the transaction is
#: tried again (``indexes/builds.py``). One sort per group instead of a partial block per
#: group and batch, which a merge would rewrite and leave as free space the size of the load.
#: The cut is a ``CREATE TABLE AS``: unlike an ``INSERT`` (or a statement with a writing
#: ``WITH``), it may read, unnest and group the postings in parallel workers, which at 100k
#: chunks is a third of the cut's time on two cores (BENCHMARKS.md#footprint). A chunk removed
#: before the lock is gone from ``chunks`` and from the list: its writer took it off, and
#: neither counted nor tombstoned it. Nothing else lists chunks meanwhile that the cut could
#: see: a load's own batches are done when it runs (``indexes/builds.py``), and a batch
#: written beside another (``write/ordered.py``) takes its entries off the list again
#: before it commits.
CUT_TABLE = "pg_temp.cs_deferred_cut"
BUILD_DEFERRED_STEPS = (
    "SELECT count(*) FROM (SELECT chunk_id FROM posting_deferred FOR UPDATE) AS l",
    f"""
    CREATE TEMP TABLE {CUT_TABLE.removeprefix("pg_temp.")} ON COMMIT DROP AS
    {{blocks}}""",
    f"""
    INSERT INTO posting_blocks ({GROUP}, max_impact, chunk_ids, impacts)
    SELECT {GROUP}, max_impact, chunk_ids, impacts FROM {CUT_TABLE}""",
    # The listed chunks' document frequencies are counted here: their postings, which are
    # all in the blocks just cut (a listed chunk's document is not deleted). The counters are
    # locked in the order every writer locks them, the database's collation (the cut's
    # columns compare in byte order).
    f"""
    INSERT INTO term_stats AS s ({GROUP}, df, blocks, partial)
    SELECT lexeme COLLATE "default", permission_scope COLLATE "default",
           lifecycle COLLATE "default", sum(cardinality(chunk_ids)), count(*),
           count(*) FILTER (WHERE cardinality(chunk_ids) < {BLOCK_SIZE})
    FROM {CUT_TABLE}
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ({GROUP}) DO UPDATE
    SET df = s.df + EXCLUDED.df, blocks = s.blocks + EXCLUDED.blocks,
        partial = s.partial + EXCLUDED.partial, fresh = {_FRESH_AFTER}, due = {_DUE_AFTER}""",
    "DELETE FROM posting_deferred",
)
#: The listed chunks' postings, as :func:`cut_blocks` takes them.
_DEFERRED_POSTINGS = f"""(
        SELECT r.chunk_id, u.lexeme, r.permission_scope, r.lifecycle, {IMPACT} AS impact
        FROM chunks AS r
        CROSS JOIN LATERAL unnest(r.tsv) AS u
        CROSS JOIN LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t
        WHERE r.chunk_id IN (SELECT chunk_id FROM posting_deferred)
          AND r.lifecycle <> 'deleted')"""

#: The live postings as rows (chunk_id, lexeme, impact, permission_scope, lifecycle): every
#: block's entries but its group's tombstones. The ``postings`` view (migration 0014).
LIVE_POSTINGS = """
    SELECT x.chunk_id, b.lexeme, x.impact, b.permission_scope, b.lifecycle
    FROM posting_blocks b
    CROSS JOIN LATERAL unnest(b.chunk_ids, b.impacts) AS x(chunk_id, impact)
    LEFT JOIN posting_tombstones t
           ON (t.lexeme, t.permission_scope, t.lifecycle)
              = (b.lexeme, b.permission_scope, b.lifecycle)
    WHERE t.chunk_ids IS NULL OR x.chunk_id <> ALL(t.chunk_ids)"""


def cut_blocks(postings: str, *, grouped_first: bool = False) -> str:
    """``SELECT`` of block rows (the columns of ``posting_blocks``) from ``postings``, a
    ``FROM`` item with ``lexeme, permission_scope, lifecycle, chunk_id, impact``: each
    group's postings in impact order (then chunk id, so the order is total), cut every
    :data:`BLOCK_SIZE`. One sort feeds both ordered aggregates and the arrays are sliced
    (a window numbering the postings cost a second sort and a pass per posting).

    ``grouped_first``: the postings are gathered into their groups (by hashing, as the
    planner usually does it), then each group's are sorted on their own. One sort of every
    posting spilled to disk and was merged in one process; many small sorts in memory
    are not, and in a load the grouping runs in parallel workers (a merge, a statement
    that writes, never runs in parallel). The blocks are the same (ad hoc,
    as ``CREATE TABLE AS`` with one worker: the postings of 100k chunks 8.4 against
    5.2-5.4 s; the same ten times over, under other chunk ids and with a third of the
    lexemes renamed, 63M postings, 91 against 58 s). Its memory is not bounded by
    ``work_mem``: PostgreSQL bounds how many groups a hash aggregate holds, not how large
    each group's arrays grow (ad hoc, those 63M postings: 125 MB per process, the sort
    7-17 MB), so only loads up to a size (``indexes/builds.py``) and tail merge rounds up
    to a bound (``GROUPED_TAIL_MAX`` in ``indexes/blocks.py``) take it. A write's cut, a
    full merge's and a tail round's past that bound sort once: at 1,000 chunks in one
    process that was 10 % faster for a write (at 5,000, grouping first was 7 % faster).

    The groups are sorted by byte order (``COLLATE "C"``): any order groups them, and the
    database's collation costs a locale comparison per pair of postings (without
    abbreviated keys, which PostgreSQL leaves off for libc locales other than C), more in a
    language's locale than in "C.UTF-8". Rows are inserted in any order: the blocks have no
    key, so no lock order depends on it."""
    group = """p.lexeme COLLATE "C" AS lexeme,
                     p.permission_scope COLLATE "C" AS permission_scope,
                     p.lifecycle COLLATE "C" AS lifecycle"""
    if grouped_first:
        groups = f"""(SELECT g.lexeme, g.permission_scope, g.lifecycle, s.chunk_ids, s.impacts
              FROM (SELECT {group},
                           array_agg(p.chunk_id) AS ids, array_agg(p.impact) AS impacts
                    FROM {postings} AS p
                    GROUP BY 1, 2, 3) AS g
              CROSS JOIN LATERAL (
                  SELECT array_agg(x.chunk_id ORDER BY x.impact DESC, x.chunk_id) AS chunk_ids,
                         array_agg(x.impact ORDER BY x.impact DESC, x.chunk_id) AS impacts
                  FROM unnest(g.ids, g.impacts) AS x(chunk_id, impact)) AS s)"""
    else:
        groups = f"""(SELECT {group},
                     array_agg(p.chunk_id ORDER BY p.impact DESC, p.chunk_id) AS chunk_ids,
                     array_agg(p.impact ORDER BY p.impact DESC, p.chunk_id) AS impacts
              FROM {postings} AS p
              GROUP BY 1, 2, 3)"""
    return f"""
        SELECT a.lexeme, a.permission_scope, a.lifecycle,
               a.impacts[k * {BLOCK_SIZE} + 1] AS max_impact,
               a.chunk_ids[k * {BLOCK_SIZE} + 1 : (k + 1) * {BLOCK_SIZE}] AS chunk_ids,
               a.impacts[k * {BLOCK_SIZE} + 1 : (k + 1) * {BLOCK_SIZE}] AS impacts
        FROM {groups} AS a
        CROSS JOIN LATERAL
            generate_series(0, (cardinality(a.chunk_ids) - 1) / {BLOCK_SIZE}) AS k"""


def _born(rows: str, schema: str, tiered: bool) -> str:
    """Blocks and document frequencies for the chunk rows ``rows`` (a transition table, or a
    subquery of one). Chunks of deleted documents are counted (the audit recounts every
    lifecycle) but get no blocks: no search reads them. In a transaction of an initial load
    (:data:`DEFER_SETTING` on), the chunks are only listed in ``posting_deferred``: each of the
    load's ``upsert`` calls cuts their blocks at once when it returns
    (:data:`BUILD_DEFERRED_STEPS`); so are those of a batch written alongside another, which
    cuts them itself on its turn (:func:`listed_cut`).
    ``tiered``: with the counters of migration 0017 (else as migration 0014 kept them)."""
    s = f'"{schema}"'
    # Listed chunks are counted in ``df`` when their blocks are cut (a count per group and
    # batch would cost a load as much as the cut); those of deleted documents get no blocks
    # and are counted now.
    listed_only, listed_due = (
        ("AND r.lifecycle = 'deleted'", _DUE_DF) if tiered else ("", _DUE_AFTER_0014)
    )
    return f"""
    IF current_setting('{DEFER_SETTING}', true) = 'on' THEN
        INSERT INTO {s}.posting_deferred (chunk_id)
        SELECT r.chunk_id FROM {rows} AS r WHERE r.lifecycle <> 'deleted';
        INSERT INTO {s}.term_stats AS s ({GROUP}, df)
        SELECT u.lexeme, r.permission_scope, r.lifecycle, count(*)
        FROM {rows} AS r CROSS JOIN LATERAL unnest(tsvector_to_array(r.tsv)) AS u(lexeme)
        WHERE TRUE {listed_only}
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT ({GROUP}) DO UPDATE SET df = s.df + EXCLUDED.df, due = {listed_due};
    ELSE
    {_cut(rows, f"{s}.", tiered)};
    END IF;"""


def _cut(rows: str, prefix: str, tiered: bool) -> str:
    """The statement cutting the blocks of the chunk rows ``rows`` and adding their counts
    to ``term_stats`` (tables named with ``prefix``, a schema and a dot, or nothing)."""
    if tiered:
        # A group's new postings are counted from the blocks cut for it (every posting is
        # in exactly one), not by grouping the postings a second time: that sort of every
        # posting was a fifth of a streamed chunk's trigger time. Only chunks of deleted
        # documents, which get no blocks, are counted one by one (read again from the
        # transition table, filtered before their tsvectors are unnested).
        materialized = "NOT MATERIALIZED"
        part = f", cardinality(chunk_ids) AS n, cardinality(chunk_ids) < {BLOCK_SIZE} AS part"
        counters = f"""
    INSERT INTO {prefix}term_stats AS s ({GROUP}, df, blocks, partial)
    SELECT {GROUP}, sum(df), sum(blocks), sum(part)
    FROM (SELECT {GROUP}, n AS df, 1 AS blocks, part::int AS part FROM b
          UNION ALL SELECT {GROUP}, 1, 0, 0 FROM p WHERE p.lifecycle = 'deleted') AS d
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ({GROUP})
    DO UPDATE SET df = s.df + EXCLUDED.df, blocks = s.blocks + EXCLUDED.blocks,
                  partial = s.partial + EXCLUDED.partial, fresh = {_FRESH_AFTER},
                  due = {_DUE_AFTER}"""
    else:
        materialized = "MATERIALIZED"
        part = ""
        counters = f"""
    INSERT INTO {prefix}term_stats AS s ({GROUP}, df, blocks, due)
    SELECT {GROUP}, sum(df), sum(blocks), {fragmented("sum(blocks)", "sum(df)")}
    FROM (SELECT {GROUP}, 1 AS df, 0 AS blocks FROM p
          UNION ALL SELECT {GROUP}, 0, 1 FROM b) AS d
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ({GROUP})
    DO UPDATE SET df = s.df + EXCLUDED.df, blocks = s.blocks + EXCLUDED.blocks,
                  due = {_DUE_AFTER_0014}"""
    return f"""
    WITH p AS {materialized} (
        SELECT r.chunk_id, u.lexeme, r.permission_scope, r.lifecycle, {IMPACT} AS impact
        FROM {rows} AS r
        CROSS JOIN LATERAL unnest(r.tsv) AS u
        CROSS JOIN LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t
    ), b AS (
        INSERT INTO {prefix}posting_blocks ({GROUP}, max_impact, chunk_ids, impacts)
        {cut_blocks("(SELECT * FROM p WHERE p.lifecycle <> 'deleted')")}
        RETURNING {GROUP}{part}
    ){counters}"""


def listed_cut() -> tuple[str, str]:
    """What a transaction does with the chunks ``:ids`` (``bigint[]``) it listed instead of
    cutting (a batch written alongside another, ``write/ordered.py``): their blocks and
    counts, as the trigger would have written them, then their entries off the list. Both
    run in the index's schema (its ``search_path``)."""
    rows = "(SELECT c.* FROM chunks AS c WHERE c.chunk_id = ANY(CAST(:ids AS bigint[])))"
    return (
        _cut(rows, "", tiered=True),
        "DELETE FROM posting_deferred WHERE chunk_id = ANY(CAST(:ids AS bigint[]))",
    )


def _died(rows: str, schema: str, tiered: bool) -> str:
    """Tombstones and document frequencies for the chunk rows ``rows`` that are gone (or
    live on under a new id). Tombstones first, then counters, each in key order: every
    writer and the merge lock them in that order."""
    s = f'"{schema}"'
    # A chunk still listed for an initial load's cut was never counted and has no blocks:
    # it leaves the list. Deleting the entry (not reading it) waits for a cut that took it
    # meanwhile, and then finds it gone, and the chunk counted.
    listed, counted = (
        (
            f"""listed AS (
        DELETE FROM {s}.posting_deferred x
        WHERE x.chunk_id IN (SELECT r.chunk_id FROM {rows} AS r) RETURNING x.chunk_id
    ), """,
            "WHERE NOT EXISTS (SELECT 1 FROM listed l WHERE l.chunk_id = r.chunk_id)",
        )
        if tiered
        else ("", "")
    )
    return f"""
    WITH {listed}d AS MATERIALIZED (
        SELECT r.chunk_id, u.lexeme, r.permission_scope, r.lifecycle
        FROM {rows} AS r CROSS JOIN LATERAL unnest(tsvector_to_array(r.tsv)) AS u(lexeme)
        {counted}
    ), t AS (
        INSERT INTO {s}.posting_tombstones AS t ({GROUP}, chunk_ids)
        SELECT {GROUP}, array_agg(chunk_id ORDER BY chunk_id)
        FROM d WHERE lifecycle <> 'deleted'
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT ({GROUP}) DO UPDATE SET chunk_ids = t.chunk_ids || EXCLUDED.chunk_ids
    )
    INSERT INTO {s}.term_stats AS s ({GROUP}, df)
    SELECT {GROUP}, -count(*) FROM d
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ({GROUP}) DO UPDATE SET df = s.df + EXCLUDED.df,
        due = {_DUE_DF if tiered else _DUE_AFTER_0014};"""


def build_deferred(*, grouped_first: bool = False) -> tuple[str, ...]:
    """:data:`BUILD_DEFERRED_STEPS` with the blocks cut by :func:`cut_blocks` (see its
    ``grouped_first``; ``indexes/builds.py`` chooses by the load's size)."""
    blocks = cut_blocks(_DEFERRED_POSTINGS, grouped_first=grouped_first)
    return tuple(
        step.format(blocks=blocks) if "{blocks}" in step else step for step in BUILD_DEFERRED_STEPS
    )


def trigger_function(schema: str, *, tiered: bool = True) -> str:
    """``CREATE OR REPLACE FUNCTION`` of the statement trigger on ``chunks`` that keeps
    postings, tombstones and ``term_stats`` (one function for the three events; each branch
    names only the transition tables its event has). ``tiered=False``: the function as
    migration 0014 created it, before ``term_stats`` had ``partial`` and ``fresh``."""
    gone = (
        "(SELECT o.* FROM old_rows o "
        "WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.chunk_id = o.chunk_id))"
    )
    came = (
        "(SELECT n.* FROM new_rows n "
        "WHERE NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.chunk_id = n.chunk_id))"
    )
    return f"""
CREATE OR REPLACE FUNCTION "{schema}".chunks_postings() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_born("new_rows", schema, tiered)}
    ELSIF TG_OP = 'DELETE' THEN
        {_died("old_rows", schema, tiered)}
    ELSE
        -- Postings live in their chunk's (scope, lifecycle) group, found by chunk id:
        -- a chunk moves to another group under a new id (SET chunk_id = DEFAULT).
        IF EXISTS (SELECT 1 FROM old_rows o JOIN new_rows n ON n.chunk_id = o.chunk_id
                   WHERE (o.permission_scope, o.lifecycle, o.tsv)
                         IS DISTINCT FROM (n.permission_scope, n.lifecycle, n.tsv)) THEN
            RAISE EXCEPTION 'a chunk changes scope, lifecycle or text only under a new chunk_id'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        {_died(gone, schema, tiered)}
        {_born(came, schema, tiered)}
    END IF;
    RETURN NULL;
END
$fn$
"""

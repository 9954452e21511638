"""The merges of posting blocks (the layout, and why, is in ``postgres/engine/postings.py``):
a tail merge recuts a group's partial blocks into full ones; a full merge rewrites the group
into disjoint full blocks with its dead postings purged.

A merge runs after every write commits (``statistics.refresh_statistics``) and after a job
drain, on the groups the writes left due (``term_stats.due``, found by a partial index) and
the ones whose tombstones are due. It is maintenance, never part of a write: searches read
unmerged groups exactly, only with more blocks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Engine

from context_search.errors import ContextSearchError
from context_search.postgres.engine.drivers import autocommit_session, lock_key
from context_search.postgres.engine.postings import (
    BLOCK_SIZE,
    GROUP,
    TOMBSTONES_DUE,
    cut_blocks,
    due,
    full_due,
)

__all__ = [
    "GROUPED_TAIL_MAX",
    "MERGE_LOCK",
    "ROUND_SETTINGS",
    "MergeReport",
    "merge_after_write",
    "merge_postings",
]

log = logging.getLogger(__name__)

#: The advisory lock a merge round holds for its transaction (``lock_key`` of the index's
#: schema and this): one merger at a time, and a configuration swap waits for the round in
#: progress instead of deadlocking with it (``operations/swap.py``).
MERGE_LOCK = "merge"

#: Each group's blocks by its index: the planner, guessing a handful of groups from the
#: arrays, would otherwise hash-join the whole table every round.
ROUND_SETTINGS = ("SET LOCAL enable_hashjoin = off", "SET LOCAL enable_mergejoin = off")

_LOCK_TOMBSTONED = f"""
    SELECT t.lexeme, t.permission_scope, t.lifecycle
    FROM posting_tombstones t
    JOIN term_stats s USING ({GROUP})
    WHERE {{due}}
    ORDER BY 1, 2, 3 LIMIT %(groups)s
    FOR UPDATE OF t SKIP LOCKED
"""

#: Due groups, whether each is due for a full merge (else its tail only), and its partial
#: blocks (what sizes a tail round: :data:`GROUPED_TAIL_MAX`).
_LOCK_DUE = """
    SELECT s.lexeme, s.permission_scope, s.lifecycle, {full} AS full, s.partial
    FROM term_stats s
    WHERE {due}
    ORDER BY 1, 2, 3 LIMIT %(groups)s
    FOR UPDATE SKIP LOCKED
"""

_LOCK_NAMED = f"""
    SELECT s.lexeme, s.permission_scope, s.lifecycle FROM term_stats s
    WHERE ({GROUP}) IN (SELECT * FROM unnest(%(lexemes)s::text[], %(scopes)s::text[],
                                              %(lifecycles)s::text[]))
    ORDER BY 1, 2, 3
    FOR UPDATE SKIP LOCKED
"""


def _merge(*, tail: bool, grouped_first: bool = False) -> str:
    """The statement of one merge round over the groups it is given (three arrays): a full
    merge rewrites every block of each group into disjoint full blocks and purges its
    tombstones; a tail merge (``tail``) recuts only the partial blocks into full ones (and
    at most one partial), leaving the full blocks and the tombstones as they are. Either
    drops the postings any of the round's tombstones name (one set: see ``live``) from what
    it rewrites, and settles every group it names, also one that had no blocks (its flag is
    cleared). ``grouped_first``: see
    :func:`~context_search.postgres.engine.postings.cut_blocks` and
    :data:`GROUPED_TAIL_MAX`."""
    partial_only = f"AND cardinality(b.chunk_ids) < {BLOCK_SIZE}" if tail else ""
    purge = (
        ""
        if tail
        else """, tomb AS (
        -- Runs once, to completion, though nothing reads it (a writing WITH always does).
        DELETE FROM posting_tombstones t USING g
        WHERE (t.lexeme, t.permission_scope, t.lifecycle)
              = (g.lexeme, g.permission_scope, g.lifecycle)
    )"""
    )
    settle = (
        f"due = {due('s.partial + d.p', 's.fresh', 's.df')}" if tail else "fresh = 0, due = false"
    )
    return f"""
    WITH g AS (
        -- Each named group with its tombstones, read by key once (every statement of this
        -- one sees them as the statement began, the full merge's purge included).
        SELECT g.*, t.chunk_ids AS dead
        FROM unnest(%(lexemes)s::text[], %(scopes)s::text[], %(lifecycles)s::text[])
            AS g({GROUP})
        LEFT JOIN LATERAL (
            SELECT t.chunk_ids FROM posting_tombstones t
            WHERE t.lexeme = g.lexeme AND t.permission_scope = g.permission_scope
              AND t.lifecycle = g.lifecycle
        ) AS t ON true
    ), old AS (
        DELETE FROM posting_blocks b USING g
        WHERE (b.lexeme, b.permission_scope, b.lifecycle)
              = (g.lexeme, g.permission_scope, g.lifecycle) {partial_only}
        RETURNING b.*
    ){purge}, live AS (
        -- A tombstoned chunk id is dead in every group: a chunk leaves a group only by
        -- being removed or taking a new id (a trigger refuses anything else), and ids are
        -- never reused (the audit's tombstoned_live_chunk checks it: were it broken, a
        -- tombstone naming a live id would drop that chunk from every group of the round,
        -- not only its own). So the round's tombstones are one set, looked up by hashing.
        -- Each block joined to its group's tombstones under the round's settings instead,
        -- then each posting compared with the group's whole list: a full merge of 2,000
        -- tombstoned groups (1.05M postings) took 11.0 s, this 2.9 s (ad hoc, EXPLAIN
        -- ANALYZE of one round).
        -- The blocks' arrays are unnested in the select list: as a function scan in FROM
        -- each block filled a tuple store of its own, twice the time per posting (0.31
        -- against 0.14 s for 1.37M postings, ad hoc).
        SELECT x.lexeme, x.permission_scope, x.lifecycle, x.chunk_id, x.impact
        FROM (SELECT o.lexeme, o.permission_scope, o.lifecycle,
                     unnest(o.chunk_ids) AS chunk_id, unnest(o.impacts) AS impact
              FROM old o) AS x
        WHERE x.chunk_id NOT IN (
            SELECT d.chunk_id FROM g CROSS JOIN LATERAL unnest(g.dead) AS d(chunk_id)
            WHERE d.chunk_id IS NOT NULL)
    ), made AS (
        INSERT INTO posting_blocks ({GROUP}, max_impact, chunk_ids, impacts)
        {cut_blocks("live", grouped_first=grouped_first)}
        RETURNING {GROUP}, cardinality(chunk_ids) < {BLOCK_SIZE} AS part
    ), delta AS (
        -- Every named group, with the blocks it lost and gained: one row each, found in
        -- term_stats by key. (Joining the named groups to the counted ones instead, with
        -- hash and merge joins off, rescanned the counts once per group: 11 of a 15 s
        -- tail merge of 5,662 groups, ad hoc.)
        SELECT {GROUP}, sum(n) AS n, sum(p) AS p
        FROM (SELECT {GROUP}, 0 AS n, 0 AS p FROM g
              UNION ALL
              SELECT {GROUP}, -1, -(cardinality(chunk_ids) < {BLOCK_SIZE})::int FROM old
              UNION ALL SELECT {GROUP}, 1, part::int FROM made) AS x
        GROUP BY 1, 2, 3
    )
    UPDATE term_stats s SET blocks = s.blocks + d.n, partial = s.partial + d.p, {settle}
    FROM delta d
    WHERE (s.lexeme, s.permission_scope, s.lifecycle)
          = (d.lexeme, d.permission_scope, d.lifecycle)
"""


_REWRITE = _merge(tail=False)
_RECUT_TAIL = _merge(tail=True)
_RECUT_TAIL_GROUPED = _merge(tail=True, grouped_first=True)

#: A tail merge round gathers each group's postings first and sorts each group's alone
#: (``cut_blocks(grouped_first=True)``) when its groups' partial blocks can hold at most
#: this many postings (128 per partial block, an upper bound). Ad hoc, a round of 2,000
#: groups streamed into a 100k index (bound 2,972,032; 297,768 postings in fact): 0.54
#: against 0.92 s, the backend's peak resident memory 28 against 18 MB above where it
#: started, about 33 bytes per posting. A hash aggregate's arrays are not bounded by
#: ``work_mem``, so a round of nearly full partial blocks at the bound could take about
#: 130 MB, once per index (one merger at a time: ``MERGE_LOCK``), as a load's grouped cut
#: may; a larger round, and every full merge, whose groups may hold any share of the
#: index, sorts all its postings at once within ``work_mem``.
GROUPED_TAIL_MAX = 4_000_000


def _columns(groups: Any) -> dict[str, list[str]]:
    """Groups as the three parallel arrays the statements unnest."""
    return {
        "lexemes": [str(g[0]) for g in groups],
        "scopes": [str(g[1]) for g in groups],
        "lifecycles": [str(g[2]) for g in groups],
    }


@dataclass(frozen=True, slots=True)
class MergeReport:
    """What one :func:`merge_postings` call rewrote."""

    groups: int  # (lexeme, scope, lifecycle) groups rewritten
    rounds: int  # transactions it took


def merge_postings(
    raw: Any, *, full: bool = False, groups_per_round: int = 2000, max_rounds: int | None = None
) -> MergeReport:
    """Merge the groups that are due: a full merge (disjoint full blocks, dead postings
    purged) where :func:`~context_search.postgres.engine.postings.full_due` says so or the
    tombstones are due, a tail merge (partial blocks recut) elsewhere; with ``full``, a full
    merge of every group not in merged form.

    ``raw``: a psycopg connection in autocommit on the index's schema. Each round is one
    transaction of at most ``groups_per_round`` groups, locked with ``SKIP LOCKED`` in the
    order writers lock them (tombstones, then counters): a merge never waits for a writer,
    and a group a writer holds is merged by a later round. Rows written concurrently are
    untouched (the rewrite deletes only the blocks its snapshot saw), so a merge can be
    killed at any point: its transaction rolls back, and the blocks are as they were.
    """
    stale = f"s.blocks > (s.df + {BLOCK_SIZE - 1}) / {BLOCK_SIZE}" if full else "s.due"
    whole = "TRUE" if full else full_due("s.fresh", "s.df")
    purge = "TRUE" if full else TOMBSTONES_DUE
    merged = rounds = 0
    key = lock_key(raw, raw.execute("SELECT current_schema()").fetchone()[0], MERGE_LOCK)
    while max_rounds is None or rounds < max_rounds:
        with raw.transaction():
            # One merger at a time: two would rewrite the same groups twice.
            if not raw.execute("SELECT pg_try_advisory_xact_lock(%s)", (key,)).fetchone()[0]:
                break
            tombstoned = raw.execute(
                sql.SQL(_LOCK_TOMBSTONED).format(due=sql.SQL(purge)),
                {"groups": groups_per_round},
            ).fetchall()
            locked = raw.execute(
                sql.SQL(_LOCK_DUE).format(due=sql.SQL(stale), full=sql.SQL(whole)),
                {"groups": groups_per_round},
            ).fetchall()
            wholes = {tuple(g[:3]) for g in locked if g[3]}
            partials = {tuple(g[:3]): int(g[4]) for g in locked if not g[3]}
            tails = set(partials)
            if tombstoned:
                wholes.update(raw.execute(_LOCK_NAMED, _columns(tombstoned)).fetchall())
            tails -= wholes
            if not wholes and not tails:
                break
            for setting in ROUND_SETTINGS:
                raw.execute(setting)
            if wholes:
                raw.execute(_REWRITE, _columns(sorted(wholes)))
            if tails:
                tail_postings = BLOCK_SIZE * sum(partials[g] for g in tails)
                recut = _RECUT_TAIL_GROUPED if tail_postings <= GROUPED_TAIL_MAX else _RECUT_TAIL
                raw.execute(recut, _columns(sorted(tails)))
        groups = wholes | tails
        merged += len(groups)
        rounds += 1
        if len(groups) < groups_per_round:
            break
    return MergeReport(groups=merged, rounds=rounds)


def merge_after_write(engine: Engine, action: str) -> MergeReport | None:
    """A merge after a write commits (``action``: the write, for error messages): the groups
    it left due, never an error for the write's caller (a failure is logged; the next merge
    picks the groups up, and searches read unmerged groups exactly)."""
    try:
        with autocommit_session(engine, action) as raw:
            return merge_postings(raw)
    except (psycopg.Error, ContextSearchError) as exc:
        log.warning("postings not merged after %s: %s", action, exc)
        return None

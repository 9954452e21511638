"""The search indexes around writes: built once after a large load instead of row by row
(``builds``), planner statistics and visibility right after bulk writes
(``statistics``), and the upkeep a connector runs beside its writes (``maintenance``)."""

from context_search.postgres.indexes.builds import defer_index_builds, ensure_indexes

__all__ = ["defer_index_builds", "ensure_indexes"]

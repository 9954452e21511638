"""The search indexes around writes: built once after a large load instead of row by row
(``builds``), and planner statistics and visibility right after bulk writes
(``statistics``)."""

from context_search.postgres.indexes.builds import defer_index_builds, ensure_indexes
from context_search.postgres.indexes.statistics import refresh_statistics

__all__ = ["defer_index_builds", "ensure_indexes", "refresh_statistics"]

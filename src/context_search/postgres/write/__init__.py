"""A write in call order: records prepared without I/O (``records``), how large a load is
(``sizing``), the write calls (``writes``), the gate a switch closes (``gate``), overwrite
checks (``overwrites``), the batch writer (``batch``) and its COPY path (``copy``),
visibility changes (``visibility``) and the index job queue (``jobs``)."""

from context_search.postgres.write.jobs import JobWorker, queue_status
from context_search.postgres.write.writes import Writes

__all__ = ["JobWorker", "Writes", "queue_status"]

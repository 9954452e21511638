"""Operator work on whole indexes: the active configuration (``config``), a configuration
switch built beside and swapped in (``switch``, ``swap``), partitions by scope
(``partitions``), the consistency audit (``audit``) and dropping an index (``admin``)."""

from context_search.postgres.operations.admin import drop_index
from context_search.postgres.operations.audit import AuditReport, audit
from context_search.postgres.operations.partitions import partition_by_scope
from context_search.postgres.operations.switch import switch_configuration

__all__ = ["AuditReport", "audit", "drop_index", "partition_by_scope", "switch_configuration"]

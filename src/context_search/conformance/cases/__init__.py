"""The conformance cases, one module per part of the SearchConnector contract.

They sit apart from the registry, runner and corpus so that adding a rule means adding a
case here and nothing else. Importing this package registers every case: each module's
``@case`` functions join ``CASES`` as the module is imported, in this import order, which
is the order the suite runs them in.
"""

from context_search.conformance.cases import (
    access,
    highlights,
    input,
    knowledge,
    lifecycle,
    overwrites,
    pages,
    query,
    results,
    revisions,
)

__all__ = [
    "access",
    "highlights",
    "input",
    "knowledge",
    "lifecycle",
    "overwrites",
    "pages",
    "query",
    "results",
    "revisions",
]

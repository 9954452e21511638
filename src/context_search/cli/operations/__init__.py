"""Commands for running and checking the system rather than its documents: index
administration (``migrate``, ``partition``, ``drop``, ``status``), the embedded server,
the MCP gateway, and the demo, conformance and benchmark runs.

An operator reaches for these; a caller searching or feeding an index never needs them.
"""

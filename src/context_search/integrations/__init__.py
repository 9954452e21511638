"""Retrievers for the frameworks services already assemble RAG and agents with.

:mod:`context_search.integrations.langchain` (extra ``langchain``) and
:mod:`context_search.integrations.llama_index` (extra ``llama-index``) wrap any
:class:`~context_search.contract.SearchConnector`. Each submodule imports its framework, so
importing this package (or ``context_search``) never requires either; what both share — the
caller's fixed search settings, the citation id and the per-hit metadata — lives in
:mod:`context_search.integrations.evidence`, so a citation means the same in both.
"""

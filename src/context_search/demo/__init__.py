"""The bundled demo corpus (``corpus.jsonl``), read by ``context-search demo``."""

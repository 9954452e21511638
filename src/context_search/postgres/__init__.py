"""PostgreSQL + pgvector backend: server resolution, schema and retrieval."""

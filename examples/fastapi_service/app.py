"""A small FastAPI service on AsyncPostgresSearchConnector.

- ``GET /search?q=...``: hybrid search as the caller; the scopes come from the caller's
  credentials (here a bearer token looked up in ``TOKENS``), never from the request.
- ``POST /tickets``: a business row (``tickets``) and its index entry written in one
  transaction: both are visible after the commit, neither after a failure.

Run it with ``uvicorn examples.fastapi_service.app:app`` (``CONTEXT_SEARCH_DSN`` or the
embedded server; schema ``support_demo``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from context_search import ContextSearchError, Embedder
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.postgres import (
    AsyncPostgresSearchConnector,
    close_async_store_engine,
    create_async_store_engine,
)
from context_search.postgres.engine.server import resolve_server

#: Demo credentials: token -> the scopes its holder may read and write.
TOKENS: dict[str, frozenset[str]] = {
    "alice-token": frozenset({"support"}),
    "bob-token": frozenset({"sales"}),
    "carol-token": frozenset({"support", "sales"}),
}

#: HTTP status per stable error code; anything else is a 500.
_STATUS = {"INVALID_QUERY": 422, "INVALID_RECORD": 422, "INVALID_FILTER": 422, "CANCELLED": 504}


class Ticket(BaseModel):
    id: str
    title: str
    body: str
    scope: str


def caller_scopes(authorization: Annotated[str, Header()] = "") -> frozenset[str]:
    """The caller's scopes from its credentials (401 without valid ones)."""
    scopes = TOKENS.get(authorization.removeprefix("Bearer ").strip())
    if scopes is None:
        raise HTTPException(status_code=401, detail="unknown token")
    return scopes


Scopes = Annotated[frozenset[str], Depends(caller_scopes)]


def create_app(
    dsn: str | None = None, *, schema: str = "support_demo", embedder: Embedder | None = None
) -> FastAPI:
    """The service: one engine and one connector for the process, opened in the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await create_async_store_engine(resolve_server(dsn).dsn, schema=schema)
        try:
            connector = await AsyncPostgresSearchConnector.open(
                engine=engine, schema=schema, embedder=embedder
            )
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "CREATE TABLE IF NOT EXISTS tickets "
                        "(id text PRIMARY KEY, title text NOT NULL, scope text NOT NULL)"
                    )
                )
            app.state.engine, app.state.index = engine, connector
            yield
            await connector.close()
        finally:
            await close_async_store_engine(engine)

    app = FastAPI(lifespan=lifespan)

    @app.exception_handler(ContextSearchError)
    async def contract_error(request: Request, exc: ContextSearchError) -> JSONResponse:
        return JSONResponse({"code": exc.code}, status_code=_STATUS.get(exc.code, 500))

    @app.get("/search")
    async def search(request: Request, q: str, scopes: Scopes, k: int = 5) -> dict[str, Any]:
        index: AsyncPostgresSearchConnector = request.app.state.index
        response = await index.search(SearchQuery(query=q, allowed_scopes=sorted(scopes), top_k=k))
        return {
            "hits": [{"id": h.doc_id, "title": h.title, "score": h.score} for h in response.hits]
        }

    @app.post("/tickets", status_code=201)
    async def create_ticket(request: Request, ticket: Ticket, scopes: Scopes) -> dict[str, str]:
        if ticket.scope not in scopes:
            raise HTTPException(status_code=403, detail="scope not granted")
        index: AsyncPostgresSearchConnector = request.app.state.index
        async with request.app.state.engine.connect() as conn:
            await conn.execute(
                text("INSERT INTO tickets (id, title, scope) VALUES (:id, :title, :scope)"),
                {"id": ticket.id, "title": ticket.title, "scope": ticket.scope},
            )
            # Same transaction: an error here (bad record, server failure) rolls back the row.
            await index.upsert(
                [
                    ContextDocumentRecord(
                        document_id=ticket.id,
                        title=ticket.title,
                        body=ticket.body,
                        permission_scope=ticket.scope,
                    )
                ],
                connection=conn,
            )
            await conn.commit()
        return {"id": ticket.id}

    return app


app = create_app(os.environ.get("CONTEXT_SEARCH_DSN") or None)

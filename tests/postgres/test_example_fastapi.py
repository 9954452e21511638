"""examples/fastapi_service through httpx's ASGI transport against the real server: scopes
from the caller's token, the business row and index entry in one transaction, and 200
concurrent requests answered correctly on one event loop."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import httpx

from context_search import Embedder

_APP = Path(__file__).parents[2] / "examples" / "fastapi_service" / "app.py"


def _service() -> Any:
    spec = importlib.util.spec_from_file_location("fastapi_service_example", _APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_service_scopes_transactions_and_200_concurrent_requests(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    app = _service().create_app(
        context_search_dsn, schema=context_search_schema, embedder=context_search_embedder
    )

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://service") as client,
        ):
            for i in range(20):
                scope = "support" if i % 2 == 0 else "sales"
                token = "alice-token" if scope == "support" else "bob-token"
                created = await client.post(
                    "/tickets",
                    json={
                        "id": f"t{i}",
                        "title": f"Ticket {i}",
                        "body": f"printer{i} jammed on floor{i} again",
                        "scope": scope,
                    },
                    headers=_auth(token),
                )
                assert created.status_code == 201, created.text
            # A record the index refuses (NUL in the body) rolls the business row back too.
            refused = await client.post(
                "/tickets",
                json={"id": "bad", "title": "Bad", "body": "x\u0000y", "scope": "support"},
                headers=_auth("alice-token"),
            )
            assert refused.status_code == 422 and refused.json() == {"code": "INVALID_RECORD"}
            async with app.state.engine.connect() as conn:
                ids = {r[0] for r in await conn.exec_driver_sql("SELECT id FROM tickets")}
            assert ids == {f"t{i}" for i in range(20)}
            assert (
                await client.post(
                    "/tickets",
                    json={"id": "x", "title": "X", "body": "b", "scope": "sales"},
                    headers=_auth("alice-token"),
                )
            ).status_code == 403
            assert (await client.get("/search", params={"q": "printer"})).status_code == 401

            async def ask(n: int) -> tuple[int, list[str]]:
                i = n % 20
                token = ("alice-token", "bob-token", "carol-token")[n % 3]
                response = await client.get(
                    "/search", params={"q": f"printer{i} floor{i}", "k": 3}, headers=_auth(token)
                )
                assert response.status_code == 200, response.text
                return n, [h["id"] for h in response.json()["hits"]]

            answers = await asyncio.gather(*(ask(n) for n in range(200)))
            for n, hits in answers:
                i, caller = n % 20, n % 3
                readable = {0: i % 2 == 0, 1: i % 2 == 1, 2: True}[caller]
                allowed = {
                    f"t{j}" for j in range(20) if {0: j % 2 == 0, 1: j % 2 == 1, 2: True}[caller]
                }
                assert set(hits) <= allowed, (n, hits)
                if readable:
                    assert hits[0] == f"t{i}", (n, hits)
                else:
                    assert f"t{i}" not in hits

    asyncio.run(main())

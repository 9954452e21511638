"""Chinese, Japanese, Korean and mixed Chinese/English text on both connectors: real
sentences are found by their own words, offsets are UTF-8 bytes of the stored body, and a
Latin-only embedder never lets its vectors outrank the lexical match of a CJK query."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from context_search import (
    ContextDocumentRecord,
    HashingEmbedder,
    InMemorySearchConnector,
    SearchConnector,
    SearchQuery,
)
from context_search.postgres import PostgresSearchConnector

DOCS = {
    "zh": "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
    "zh-ops": "极光服务每天夜间自动重启，重启失败时请联系值班工程师。",
    "ja": "東京は日本の首都であり、世界有数の大都市です。桜の季節には多くの観光客が訪れます。",
    "ko": "서울은 대한민국의 수도이며 한강이 도시를 가로질러 흐른다.",
    "mixed": "我们使用 Kubernetes 调度 Pod，并用 Prometheus 监控集群的 CPU 使用率。",
    "en": "Kubernetes schedules pods onto nodes; Prometheus scrapes their metrics.",
}

PROBES = [
    ("中华人民共和国的首都", "zh"),
    ("夜间自动重启", "zh-ops"),
    ("日本の首都", "ja"),
    ("桜の季節", "ja"),
    ("대한민국의 수도", "ko"),
    ("한강", "ko"),
    ("调度 Pod", "mixed"),
    ("集群 CPU 使用率", "mixed"),
    ("Prometheus 监控", "mixed"),
]


@pytest.fixture(params=["memory", "postgres"])
def connector(
    request: pytest.FixtureRequest,
) -> Iterator[SearchConnector]:
    embedder = HashingEmbedder(scripts=["Latin"])
    if request.param == "memory":
        with InMemorySearchConnector(embedder=embedder) as c:
            yield c
        return
    dsn = request.getfixturevalue("context_search_dsn")
    schema = request.getfixturevalue("context_search_schema")
    with PostgresSearchConnector.open(dsn, schema=schema, embedder=embedder) as c:
        yield c


def _load(c: SearchConnector) -> None:
    c.upsert(  # type: ignore[attr-defined]
        [
            ContextDocumentRecord(document_id=k, body=v, permission_scope="team")
            for k, v in DOCS.items()
        ]
    )


@pytest.mark.parametrize(("query", "expected"), PROBES)
def test_cjk_and_mixed_queries_find_their_document_first(
    connector: SearchConnector, query: str, expected: str
) -> None:
    _load(connector)
    resp = connector.search(SearchQuery(query=query, allowed_scopes=["team"], top_k=3))
    assert resp.hits and resp.hits[0].doc_id == expected, [h.doc_id for h in resp.hits]
    for hit in resp.hits:
        body = DOCS[hit.doc_id].encode("utf-8")
        assert body[hit.start_byte : hit.end_byte].decode("utf-8") == hit.snippet


def test_english_words_inside_chinese_text_match_english_queries(
    connector: SearchConnector,
) -> None:
    _load(connector)
    resp = connector.search(SearchQuery(query="Prometheus", allowed_scopes=["team"], top_k=5))
    lexical = {e.doc_id for e in resp.rank_log.entries if e.lexical_rank is not None}
    assert {"mixed", "en"} <= lexical
    assert resp.rank_log.params["vector_weight"] == 1.0

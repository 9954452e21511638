"""The standard fixture corpus every case ingests.

Distinctive words (``aurora``, ``basalt``, ``cobalt``…) make each document findable by one
term regardless of the backend's scoring, so cases test rules, not ranking quality.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from context_search.contract import ContextDocumentRecord, Lifecycle

__all__ = [
    "PUBLIC",
    "RESTRICTED",
    "TEAM",
    "NoiseEmbedder",
    "passage_corpus",
    "standard_corpus",
    "ts",
]

TEAM = "team"
RESTRICTED = "restricted"
PUBLIC = "public"


def ts(day: int) -> datetime:
    return datetime(2026, 1, day, 12, 0, tzinfo=UTC)


def standard_corpus() -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id="doc-team-aurora",
            source_revision="wiki@42",
            title="Aurora runbook",
            body="The aurora service restarts nightly. Operators page the aurora on-call "
            "engineer when the restart fails twice.",
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="wiki://team/aurora-runbook",
            owner="alice",
            department="sre",
            project="aurora",
            tags=("runbook", "ops"),
            updated_at=ts(10),
            created_at=ts(1),
            metadata={"tier": 1, "region": "eu"},
        ),
        ContextDocumentRecord(
            document_id="doc-restricted-aurora",
            source_revision="wiki@7",
            title="Aurora incident zanzibar postmortem",
            body="Confidential: the aurora outage was caused by the zanzibar credential "
            "rotation. Salaries of the aurora team are listed in the appendix.",
            permission_scope=RESTRICTED,
            source_system="vault",
            source_uri="vault://restricted/zanzibar-postmortem",
            owner="mallory",
            department="security",
            project="zanzibar",
            tags=("incident", "secret"),
            updated_at=ts(11),
            created_at=ts(2),
            metadata={"tier": 0, "region": "us"},
        ),
        ContextDocumentRecord(
            document_id="doc-team-basalt",
            title="Basalt storage design",
            body="Basalt stores object chunks on three replicas. Basalt compaction runs "
            "weekly and the aurora service reads from basalt.",
            permission_scope=TEAM,
            source_system="git",
            source_uri="git://repo/docs/basalt.md",
            owner="bob",
            department="storage",
            project="basalt",
            tags=("design",),
            updated_at=ts(12),
            created_at=ts(3),
            metadata={"tier": 2, "region": "eu"},
        ),
        ContextDocumentRecord(
            document_id="doc-public-cobalt",
            title="Cobalt public FAQ",
            body="Cobalt is the public status page. Customers read cobalt for outages.",
            permission_scope=PUBLIC,
            source_system="web",
            source_uri="https://example.org/cobalt",
            owner="carol",
            department="support",
            project="cobalt",
            tags=("faq", "ops"),
            updated_at=ts(13),
            created_at=ts(4),
            metadata={"tier": 3, "region": "us"},
        ),
        ContextDocumentRecord(
            document_id="doc-team-aurora-old",
            title="Aurora runbook (2024)",
            body="Old aurora procedure: restart the aurora service by hand every morning.",
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="wiki://team/aurora-runbook-2024",
            owner="alice",
            department="sre",
            project="aurora",
            lifecycle=Lifecycle.SUPERSEDED,
            updated_at=ts(5),
            created_at=ts(1),
        ),
        ContextDocumentRecord(
            document_id="doc-team-dolomite",
            title="Dolomite pipeline notes",
            body="Dolomite ingests aurora logs into the warehouse every hour.",
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="wiki://team/dolomite",
            owner="dave",
            department="data",
            project="dolomite",
            tags=("pipeline",),
            updated_at=ts(14),
            created_at=ts(5),
            metadata={"tier": 2, "region": "apac"},
        ),
        ContextDocumentRecord(
            document_id="doc-team-chinese",
            title="极光服务手册",
            body="极光服务每天夜间重启。如果重启连续失败两次，请联系值班工程师。🚀 aurora",
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="wiki://team/aurora-zh",
            owner="li",
            department="sre",
            project="aurora",
            updated_at=ts(15),
            created_at=ts(6),
        ),
    ]


class NoiseEmbedder:
    """An embedder whose vectors carry no signal: a unit vector drawn from a generator seeded
    by the text's hash. It indexes and searches like any embedder and knows nothing, which
    is what a service's own model looks like to fusion on text it cannot read."""

    scripts = None

    def __init__(self, dimension: int = 64) -> None:
        self.dimension = dimension
        self.model_id = f"noise-v1-{dimension}"

    def _embed(self, text: str) -> npt.NDArray[np.float32]:
        seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest())
        v = np.random.default_rng(seed).standard_normal(self.dimension)
        return (v / np.linalg.norm(v)).astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._embed(t) for t in texts])

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self._embed(text)


_WORDS = [
    "harbor",
    "lantern",
    "meadow",
    "copper",
    "violin",
    "glacier",
    "orchard",
    "saddle",
    "timber",
    "beacon",
    "canyon",
    "falcon",
    "garnet",
    "hollow",
    "island",
    "jasmine",
    "kettle",
    "lagoon",
    "marble",
    "nectar",
    "oyster",
    "pebble",
    "quarry",
    "ribbon",
    "summit",
    "thistle",
    "umbrella",
    "valley",
    "walnut",
    "yonder",
    "zephyr",
    "anchor",
    "bramble",
    "cedar",
    "dune",
    "ember",
    "fjord",
    "grove",
    "heron",
    "ivory",
    "juniper",
    "kelp",
    "linen",
    "mosaic",
    "nutmeg",
    "opal",
    "prairie",
    "quiver",
    "raven",
    "saffron",
    "tundra",
    "urchin",
    "velvet",
    "willow",
    "almond",
    "breeze",
    "cactus",
    "delta",
    "egret",
]


def passage_corpus(n: int = 40, words: int = 14) -> list[ContextDocumentRecord]:
    """``n`` passages of ``words`` distinct words each from one shared vocabulary, so a
    query of one passage's words also matches many others in part: the lexical arm ranks
    that passage first and a vector arm decides the rest."""
    size = len(_WORDS)
    return [
        ContextDocumentRecord(
            document_id=f"passage-{i:02d}",
            body=" ".join(_WORDS[(7 * i + 11 * j) % size] for j in range(words)) + ".",
            permission_scope=TEAM,
        )
        for i in range(n)
    ]

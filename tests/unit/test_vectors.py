"""The one vector codec speaks pgvector's own formats: what pgvector-python encodes and
decodes is what the connector sends, in binary (COPY) and in text (bound parameters)."""

from __future__ import annotations

import numpy as np
from pgvector import HalfVector, Vector

from context_search.postgres.engine.vectors import (
    _half_texts,
    halfvec_literal,
    halfvec_rows,
    vector_literal,
    vector_rows,
)


def _vectors() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((5, 384)).astype(np.float32)


def test_binary_rows_are_pgvectors_wire_format() -> None:
    vectors = _vectors()
    rows = vector_rows(vectors)
    assert [bytes(row) for row in rows] == [Vector(v).to_binary() for v in vectors]
    assert np.array_equal(Vector.from_binary(rows[2]).to_numpy(), vectors[2])


def test_text_literal_is_pgvectors_text_form_to_seven_digits() -> None:
    vectors = _vectors()
    literal = vector_literal(vectors[0])
    decoded = Vector.from_text(literal).to_numpy()
    assert decoded.shape == (384,)
    assert np.allclose(decoded, vectors[0], rtol=1e-6, atol=0)
    assert vector_literal(vectors[0].tolist()) == literal  # a list and an array alike


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_halfvec_rows_are_pgvectors_halfvec_wire_format() -> None:
    vectors = _unit(_vectors())
    rows = halfvec_rows(vectors)
    assert [bytes(row) for row in rows] == [HalfVector(v).to_binary() for v in vectors]
    decoded = HalfVector.from_binary(rows[1]).to_numpy()
    assert np.array_equal(decoded, vectors[1].astype(np.float16))


def test_any_scale_is_stored_at_unit_length_without_overflow_or_underflow() -> None:
    """Cosine ignores length; half precision does not (65504 at most, 6e-8 at least)."""
    vectors = _vectors()
    unit = [bytes(r) for r in halfvec_rows(vectors)]
    for scale in (1e6, 1e-7):
        rows = halfvec_rows(vectors * scale)
        assert [bytes(r) for r in rows] == unit
        decoded = np.array([HalfVector.from_binary(r).to_numpy() for r in rows], np.float32)
        assert np.isfinite(decoded).all()
        assert np.allclose(np.linalg.norm(decoded, axis=1), 1.0, atol=2e-3)
        text = Vector.from_text(halfvec_literal(vectors[0] * scale)).to_numpy()
        assert np.array_equal(text.astype(np.float16), decoded[0].astype(np.float16))
    zero = halfvec_rows(np.zeros((1, 384), dtype=np.float32))[0]
    assert not HalfVector.from_binary(zero).to_numpy().any()  # left to the embedder's guard


def test_halfvec_literal_names_the_same_half_precision_values_as_the_binary_rows() -> None:
    """Text (row path, query) and binary (COPY) must store identical bits."""
    vectors = _unit(_vectors())  # components near 0.05: many fall between half steps
    for v in vectors:
        text = np.array(Vector.from_text(halfvec_literal(v)).to_numpy(), dtype=np.float32)
        # Parsed as float32 and rounded to half precision (what the server does), the
        # text names the value COPY sends.
        assert np.array_equal(text.astype(np.float16), v.astype(np.float16))


def test_every_half_precision_value_is_named_so_it_parses_back_to_its_own_bits() -> None:
    """The text of each finite half-precision value, read back as a float32 and rounded to
    half precision (as the server reads it), is that value again, signed zeros included;
    and every value's text is what formatting it to seven digits always gave."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(np.float16)
    finite = np.isfinite(values)
    literal = halfvec_literal(np.ones(4, dtype=np.float32))  # warms the table
    assert literal == "[0.5,0.5,0.5,0.5]"
    texts = _half_texts()
    parsed = np.array(texts[finite].tolist(), dtype=np.float32).astype(np.float16)
    assert np.array_equal(parsed.view(np.uint16), bits[finite])
    assert texts[0x8000] == "-0"
    assert texts.tolist() == ["%.7g" % v for v in values.astype(np.float64).tolist()]  # noqa: UP031

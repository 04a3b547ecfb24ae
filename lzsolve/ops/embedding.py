"""Table lookups: token embeddings and learned positions.

embedding: table[ids], times scale when the signature is `scaled` (Gemma multiplies by
sqrt(hidden), rounded to the activation dtype; the call passes scale=None otherwise).
posenc.learned: x + table[positions] (GPT-2's wpe).
"""
from __future__ import annotations

from lzsolve.ops.base import OpContract, itemsize


def embedding(ids, table, scale):
    rows = table[ids]
    return rows if scale is None else rows * scale


def learned_positions(x, positions, table):
    return x + table[positions]


def lookup_bytes(row_tensors: int):
    """Per token: its ids, and row_tensors (hidden,) rows read or written."""
    return lambda sig, dims: float(dims["tokens"] * (8 + itemsize(sig) * row_tensors * sig.dim("hidden")))


def embedding_flops(sig, dims):
    return float(dims["tokens"] * sig.dim("hidden")) if "scaled" in sig.flags else 0.0


def learned_flops(sig, dims):
    return float(dims["tokens"] * sig.dim("hidden"))


EMBEDDING = OpContract("embedding", embedding, embedding_flops, lookup_bytes(2),
                       (({"vocab": 1000, "hidden": 256}, (), {"tokens": 9}),
                        ({"vocab": 3000, "hidden": 640}, ("scaled",), {"tokens": 5})))
LEARNED = OpContract("posenc.learned", learned_positions, learned_flops, lookup_bytes(3),
                     (({"hidden": 768}, (), {"tokens": 9}), ({"hidden": 96}, (), {"tokens": 1})))

CONTRACTS = (LEARNED, EMBEDDING)

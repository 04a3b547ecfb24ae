"""Table lookups: token embeddings and learned positions.

embedding: table[ids], times scale when the signature is `scaled` (Gemma multiplies by
sqrt(hidden), rounded to the activation dtype; the call passes scale=None otherwise).
posenc.learned: x + table[positions] (GPT-2's wpe).
"""
from __future__ import annotations

import torch

from .base import OpContract, itemsize, randn

MAX_POSITIONS = 1024  # GPT-2's n_positions
TABLE_SCALE = 0.02  # GPT-2's init std: trained embedding rows are small


def embedding_inputs(sig, dims, device, gen):
    vocab, hidden = sig.dim("vocab"), sig.dim("hidden")
    ids = torch.randint(0, vocab, (dims["tokens"],), generator=gen, device=device)
    table = randn((vocab, hidden), sig, device, gen, scale=TABLE_SCALE)
    scale = hidden ** 0.5 if "scaled" in sig.flags else None
    return ids, table, scale


def embedding(ids, table, scale):
    rows = table[ids]
    return rows if scale is None else rows * scale


def learned_inputs(sig, dims, device, gen):
    tokens, hidden = dims["tokens"], sig.dim("hidden")
    x = randn((tokens, hidden), sig, device, gen, scale=TABLE_SCALE)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen, device=device)
    return x, positions, randn((MAX_POSITIONS, hidden), sig, device, gen, scale=TABLE_SCALE)


def learned_positions(x, positions, table):
    return x + table[positions]


def lookup_bytes(row_tensors: int):
    """Per token: its ids, and row_tensors (hidden,) rows read or written."""
    return lambda sig, dims: float(dims["tokens"] * (8 + itemsize(sig) * row_tensors * sig.dim("hidden")))


def embedding_flops(sig, dims):
    return float(dims["tokens"] * sig.dim("hidden")) if "scaled" in sig.flags else 0.0


def learned_flops(sig, dims):
    return float(dims["tokens"] * sig.dim("hidden"))


EMBEDDING = OpContract("embedding", embedding_inputs, embedding, embedding_flops, lookup_bytes(2))
LEARNED = OpContract("posenc.learned", learned_inputs, learned_positions, learned_flops, lookup_bytes(3))

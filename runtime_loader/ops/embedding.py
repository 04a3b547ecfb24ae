"""Lookups: the token embedding (with Gemma's scale) and learned positions (GPT-2's wpe). Their
records, how a call is read, example inputs and eager kernels. Contract: lzsolve.ops.embedding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES
from ..inputs import randn
from ..specs import BOTH, KernelSpec
from .base import OpSchema, Signature, promoted, rows_op


def embedding_front(ids: Tensor, table: Tensor, scale: float | None = None):
    """table[ids] (ids int64), times scale rounded to the table's dtype when given (Gemma's sqrt(hidden))."""
    return (ids.shape, ids.dtype, table.shape, table.dtype, table.is_cuda, scale is None), (ids, table, scale)


def embedding_call(ids, table, scale=None):
    if table.dim() != 2 or table.dtype not in DTYPE_NAMES or ids.dtype != torch.int64:
        return None
    vocab, hidden = table.shape
    flags = ("scaled",) if scale is not None else ()
    return (Signature.make("embedding", {"vocab": vocab, "hidden": hidden}, flags, DTYPE_NAMES[table.dtype]),
            {"tokens": ids.numel()})


def embedding_fake(ids: Tensor, table: Tensor, *args) -> Tensor:
    return table.new_empty((*ids.shape, table.shape[-1]))


def learned_positions_front(x: Tensor, positions: Tensor, table: Tensor):
    """x + table[positions] (GPT-2's wpe); positions broadcast against x's leading dims."""
    return (x.shape, x.dtype, table.dtype, x.is_cuda), (x, positions, table)


def learned_positions_fake(x: Tensor, positions: Tensor, table: Tensor) -> Tensor:
    """Like x, in the dtype of GPT-2's inputs_embeds + position_embeds (an fp32 table with bf16 x: fp32)."""
    return torch.empty_like(x, dtype=promoted(x, table))


# --- example inputs ---------------------------------------------------------------------------------
MAX_POSITIONS = 1024  # GPT-2's n_positions
TABLE_SCALE = 0.02  # GPT-2's init std: trained embedding rows are small


def embedding_inputs(sig, dims, device, gen):
    vocab, hidden = sig.dim("vocab"), sig.dim("hidden")
    ids = torch.randint(0, vocab, (dims["tokens"],), generator=gen, device=device)
    table = randn((vocab, hidden), sig, device, gen, scale=TABLE_SCALE)
    scale = hidden ** 0.5 if "scaled" in sig.flags else None
    return ids, table, scale


def learned_positions_inputs(sig, dims, device, gen):
    tokens, hidden = dims["tokens"], sig.dim("hidden")
    x = randn((tokens, hidden), sig, device, gen, scale=TABLE_SCALE)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen, device=device)
    return x, positions, randn((MAX_POSITIONS, hidden), sig, device, gen, scale=TABLE_SCALE)


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def scaled(rows, scale: float | None):
    """Gemma's embedding scale: sqrt(hidden) rounded to the table's dtype, then multiplied in."""
    return rows if scale is None else rows * torch.tensor(scale, dtype=rows.dtype)


# F.embedding, as transformers' nn.Embedding computes them: it refuses an id outside [0, rows), where
# table[ids] read -1 as the last row
def embedding(ids, table, scale: float | None):
    return scaled(F.embedding(ids, table), scale)


def learned_positions(x, positions, table):
    return x + F.embedding(positions, table)


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    # table: tuned in x's dtype (OpSchema.same_dtype)
    rows_op("posenc.learned", "hidden", "eager.learned_positions", "learned_positions", learned_positions_front,
            learned_positions_inputs, ("table",), learned_positions_fake),
    OpSchema("embedding", ("vocab", "hidden"), ("scaled",), ("tokens",), "eager.embedding", method="embedding",
             front=embedding_front, call=embedding_call, inputs=embedding_inputs, fake=embedding_fake, fusible=True),
)


SPECS = [
    KernelSpec("eager.embedding", frozenset({"embedding"}), "torch", embedding, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"scaled"}), graph_safe=True, deterministic=True),
    KernelSpec("eager.learned_positions", frozenset({"posenc.learned"}), "torch", learned_positions,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
]

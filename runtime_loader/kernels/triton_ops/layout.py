"""Views shared by the row-wise kernels (norms and activations)."""
from __future__ import annotations

import torch


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, last dim), every leading dim a row. A 2-D x is taken as it is, whatever its
    row stride (gate and up arrive as the two halves of one gate_up buffer), and the kernels
    read it through its strides; reshape copies only leading dims that cannot be merged."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def row_tile(n_cols: int, block: int) -> int:
    """The tile a row-per-program kernel walks a row of n_cols in: the configuration's block, or the
    power of two that holds the row where that is narrower. A row in one tile is read once (a wider
    one is read again in chunks, once per pass), and lanes past the row are masked work: so one
    configuration, block=8192, serves every row up to 8192 in one tile of its own width."""
    return min(block, 1 << max(n_cols - 1, 0).bit_length())


def row_tiling(n_cols: int, block: int) -> dict:
    """The row kernels' tile constexprs for rows of n_cols: BLOCK (row_tile) and ONE_TILE, which must
    agree with it (a row in one tile is read once, kept in registers)."""
    tile = row_tile(n_cols, block)
    return {"BLOCK": tile, "ONE_TILE": n_cols <= tile}

"""Views shared by the row-wise kernels (norms and activations)."""
from __future__ import annotations

import torch


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, last dim), every leading dim a row. A 2-D x is taken as it is, whatever its
    row stride (gate and up arrive as the two halves of one gate_up buffer), and the kernels
    read it through its strides; reshape copies only leading dims that cannot be merged."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])

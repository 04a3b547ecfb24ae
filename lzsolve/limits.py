"""Bounds on what a tune may be asked for, checked before anything is allocated.

A config or workload file is input someone typed or generated: `hidden_size` 10**9 would
make the worker allocate hundreds of terabytes, `vocab_size` 10**400 overflows every C
integer on its way, a file nested 100,000 deep exhausts the stack. Each check here ends in
one LzError line naming the value and what it would need.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from lzsolve.errors import LzError
from runtime_loader import safeio

MAX_CONFIG_BYTES = 4 << 20  # a Hugging Face config.json is a few KB
MAX_CONFIG_DEPTH = 32  # multimodal configs nest text_config / vision_config a few levels
MAX_WORKLOAD_BYTES = 64 << 20  # a recording holds one entry per distinct (signature, dims)
MAX_WORKLOAD_DEPTH = 16
MAX_LAYERS = 4096  # the capture builds every layer as a module (the largest real models have ~128)
INT64_MAX = 2 ** 63 - 1  # torch shapes, Parquet columns and C code all stop here


def read_json_input(path: str | Path, max_bytes: int, max_depth: int, what: str):
    """A JSON input file (config, workload): a regular file within `max_bytes`, nested at most
    `max_depth` deep, every integer within 64 bits; else one LzError line."""
    value = safeio.read_json(path, max_bytes, max_depth, LzError, what=what)
    check_ints(value, what)
    return value


def check_ints(value, where: str) -> None:
    """Refuse any integer in JSON-like data that does not fit 64 bits, naming its key."""
    stack = [(value, "")]
    while stack:
        item, key = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, f"{key}.{k}" if key else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{key}[{i}]") for i, v in enumerate(item))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > INT64_MAX:
            digits = len(str(abs(item)))
            raise LzError(f"{where}: '{key}' is a {digits}-digit integer, beyond 64 bits; fix the value")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def memory_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes, what) of the memory one tensor on `device` must fit in: the GPU's, or the host's."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, f"{props.name}'s memory"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host's memory"
    except (ValueError, OSError, AttributeError):  # not a POSIX host: no bound we can tell
        return INT64_MAX, "this host's memory"


def check_fits(what: str, shape: tuple[int, ...], itemsize: int, device: torch.device, fix: str) -> None:
    """Refuse one tensor of `shape` that could not exist in `device`'s memory."""
    need = math.prod(shape) * itemsize
    have, where = memory_bytes(device)
    if need > have:
        raise LzError(f"{what}: one tensor of shape {tuple(shape)} would need {need:,} bytes "
                      f"({human_bytes(need)}), more than {where} ({human_bytes(have)}); {fix}")


def _config_ints(config, name: str) -> list[int]:
    """config.<name> where it is an int; for a field its layers set apart (Gemma 4's head_dim), the
    global and every layer's value."""
    values = [getattr(config, name, None)]
    if name in (getattr(config, "per_layer_attributes", None) or ()):
        layers = config.per_layer_config
        values += [getattr(layers[i], name, None) for i in range(len(layers))]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _config_int(config, name: str) -> int | None:
    """The largest of _config_ints."""
    return max(_config_ints(config, name), default=None)


# Sizes a model divides by or allocates with: 0 (or less) fails in the capture, the inputs' makers or
# the workers, each with a traceback of its own (issue 55), so they are refused first
POSITIVE_SIZES = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                  "num_hidden_layers", "head_dim")
# Norm epsilons under the names transformers' configs use: a norm divides by sqrt(mean + eps)
NORM_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")


def check_config_values(config, where: str) -> None:
    """A transformers config's sizes positive, its norm epsilons positive, and its key/value
    heads a divisor of its attention heads (grouped-query attention shares each kv head among
    the same number of query heads); else one LzError line naming the field."""
    for name in POSITIVE_SIZES:
        low = min(_config_ints(config, name), default=None)
        if low is not None and low <= 0:
            raise LzError(f"{where}: {name} is {low}, not a positive integer; fix the config")
    for name in NORM_EPSILONS:
        eps = getattr(config, name, None)
        if isinstance(eps, (int, float)) and not isinstance(eps, bool) and not (math.isfinite(eps) and eps > 0):
            raise LzError(f"{where}: {name} is {eps}, not a positive number (1e-6 is usual); fix the config")
    heads, kv_heads = _config_int(config, "num_attention_heads"), _config_int(config, "num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise LzError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}; "
                      "fix the config")


def check_config_sizes(config, itemsize: int, where: str) -> None:
    """A transformers config's sizes, before the capture builds anything from them (it builds
    each layer as a module, and runs each norm class once on the host at the model's width):
    a bounded number of layers, and every single weight within the host's memory."""
    layers = _config_int(config, "num_hidden_layers")
    if layers is not None and layers > MAX_LAYERS:
        raise LzError(f"{where}: num_hidden_layers {layers:,} is over {MAX_LAYERS:,}; fix the config")
    hidden, heads = _config_int(config, "hidden_size"), _config_int(config, "num_attention_heads")
    head_dim = _config_int(config, "head_dim") or (hidden // heads if hidden and heads else None)
    weights = {
        "vocab_size x hidden_size (the embedding)": (_config_int(config, "vocab_size"), hidden),
        "intermediate_size x hidden_size (an MLP projection)": (_config_int(config, "intermediate_size"), hidden),
        "num_attention_heads * head_dim x hidden_size (the query projection)":
            (heads * head_dim if heads and head_dim else None, hidden),
    }
    host = torch.device("cpu")
    for name, shape in weights.items():
        if all(isinstance(n, int) and n > 0 for n in shape):
            check_fits(f"{where}: {name}", shape, itemsize, host, "fix the config")

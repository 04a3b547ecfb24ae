"""The Dispatcher: replays a dispatch table with a dict lookup per call.

A call's key is built from shapes, dtype and device (no allocation, no
formatting); the first call with a new key derives the op signature, walks the
tree and stores the chosen callable under that key. Anything the table does not
cover goes to the op's fallback, which keeps the plain PyTorch semantics.
"""
from __future__ import annotations

import warnings

from . import registry
from .hardware import device_info
from .ops import attention_call, linear_call, rms_norm_call, rope_call, swiglu_call
from .table import Leaf, Split, Table, choose, leaves

MAX_CACHED_KEYS = 8192  # past this, new keys are resolved per call instead of cached


class Dispatcher:
    def __init__(self, table: Table | None = None):
        self.table = table
        self.device_type = table.hardware["device"] if table else None
        self._trees: dict[str, Leaf | Split] = {}
        self._usable: set[str] = set()
        if table is not None:
            here = device_info(self.device_type if self.device_type == "cpu" else "cuda")
            for sig, tree in table.trees.items():
                self._trees[str(sig)] = tree
                for leaf in leaves(tree):
                    local = registry.get(leaf.kernel_id).local_reasons(here)
                    if local:
                        warnings.warn(f"lzsolve: {leaf.kernel_id} is not usable here ({local[0]}); "
                                      f"{sig} uses the fallback where the table chose it", RuntimeWarning,
                                      stacklevel=3)
                    else:
                        self._usable.add(leaf.kernel_id)
        self._cache: dict[tuple, tuple] = {}

    # --- resolution (first call of a key) ------------------------------------
    def _resolve(self, key: tuple, call, fallback_op: str, device_type: str) -> tuple:
        spec = registry.fallback(fallback_op)
        if call is not None and device_type == self.device_type:
            sig, dims = call
            tree = self._trees.get(str(sig))
            if tree is not None:
                kernel_id = choose(tree, dims)
                if kernel_id in self._usable:
                    spec = registry.get(kernel_id)
        entry = (spec.kernel_id, spec.impl)
        if len(self._cache) < MAX_CACHED_KEYS:
            self._cache[key] = entry
        return entry

    # --- entries: (kernel_id, callable) for a call ------------------------------
    def _attention_entry(self, q, k, v, causal):
        key = ("attention", q.shape, k.shape, v.shape, q.dtype, q.device.type, causal)
        entry = self._cache.get(key)
        return entry or self._resolve(key, attention_call(q, k, v, causal), "attention.prefill", q.device.type)

    def _rms_norm_entry(self, x, weight):
        key = ("norm.rms", x.shape, x.dtype, x.device.type)
        entry = self._cache.get(key)
        return entry or self._resolve(key, rms_norm_call(x, weight), "norm.rms", x.device.type)

    def _rope_entry(self, q, k, interleaved):
        key = ("posenc.rope", q.shape, k.shape, q.dtype, q.device.type, interleaved)
        entry = self._cache.get(key)
        return entry or self._resolve(key, rope_call(q, k, interleaved), "posenc.rope", q.device.type)

    def _swiglu_entry(self, gate):
        key = ("act.swiglu", gate.shape, gate.dtype, gate.device.type)
        entry = self._cache.get(key)
        return entry or self._resolve(key, swiglu_call(gate), "act.swiglu", gate.device.type)

    def _linear_entry(self, x, weight, bias):
        key = ("linear", x.shape, weight.shape, bias is None, x.dtype, x.device.type)
        entry = self._cache.get(key)
        return entry or self._resolve(key, linear_call(x, weight, bias), "linear", x.device.type)

    # --- the public ops ----------------------------------------------------------
    def attention(self, q, k, v, causal: bool = True, scale: float | None = None):
        """SDPA semantics, layout (batch, heads, seq, head_dim); GQA when kv heads divide q heads."""
        return self._attention_entry(q, k, v, causal)[1](q, k, v, causal, scale)

    def rms_norm(self, x, weight, eps: float = 1e-6):
        return self._rms_norm_entry(x, weight)[1](x, weight, eps)

    def rope(self, q, k, cos, sin, interleaved: bool = False):
        """Rotary embedding of q (batch, hq, seq, d) and k (batch, hkv, seq, d) with cos/sin
        of shape (batch or 1, seq, d) as Hugging Face builds them; returns (q, k)."""
        return self._rope_entry(q, k, interleaved)[1](q, k, cos, sin, interleaved)

    def swiglu(self, gate, up):
        return self._swiglu_entry(gate)[1](gate, up)

    def linear(self, x, weight, bias=None):
        return self._linear_entry(x, weight, bias)[1](x, weight, bias)

    def kernel_for(self, op: str, *args, **kwargs) -> str:
        """The kernel id a call of `op` ('attention', 'rms_norm', ...) with these args would use."""
        entries = {
            "attention": lambda q, k, v, causal=True, scale=None: self._attention_entry(q, k, v, causal),
            "rms_norm": lambda x, weight, eps=1e-6: self._rms_norm_entry(x, weight),
            "rope": lambda q, k, cos, sin, interleaved=False: self._rope_entry(q, k, interleaved),
            "swiglu": lambda gate, up: self._swiglu_entry(gate),
            "linear": lambda x, weight, bias=None: self._linear_entry(x, weight, bias),
        }
        return entries[op](*args, **kwargs)[0]

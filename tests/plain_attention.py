"""A plugin with an attention kernel that declares GQA and causal but not qk_norm: the kind of kernel
written for Qwen2 that a Qwen3 attention op must never get (lzsolve tune --plugin tests.plain_attention)."""
import dataclasses

from runtime_loader.registry import get, register

register(dataclasses.replace(get("sdpa.default"), kernel_id="plain.attention",
                             features=frozenset({"causal", "gqa"}), notes="no qk_norm declared"))

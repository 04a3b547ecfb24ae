"""Hugging Face transformers: the Dispatcher as an attention implementation.

    from runtime_loader.integrations.transformers import register
    register(d)                          # name "lzsolve"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="lzsolve")

The common serving cases (no explicit mask, no dropout, prefill with
seq_q == kv_len or single-token decode) go through torch.ops.lzsolve.attention,
so torch.compile(fullgraph=True) sees one node; everything else (padding masks,
chunked prefill, softcap, paged caches...) is handed to transformers' own SDPA
implementation unchanged, so results never differ from attn_implementation="sdpa".
Masks are built as for "sdpa", except that with no padding mask at all a plain
causal mask is left implicit (is_causal) even under torch.compile, where
transformers (before torch 2.14) would materialise it and lose the fast path.
One case still gets a mask under torch.compile: use_cache=False without an
attention_mask, where transformers checks position_ids for packed sequences; such
calls take the SDPA path (same results, not the table).
"""
from __future__ import annotations

from ..dispatcher import Dispatcher
from .. import library

NAME = "lzsolve"


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seq_q, kv_len = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    simple = (attention_mask is None and dropout == 0.0 and not kwargs.get("output_attentions")
              and kwargs.get("softcap") is None and kwargs.get("position_bias") is None
              and kwargs.get("cache") is None and kwargs.get("sliding_window") is None
              and query.shape[1] % key.shape[1] == 0 and (seq_q == kv_len or seq_q == 1))
    if not simple:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = bool(is_causal) and seq_q > 1  # transformers' rule: a single query attends to every key
    qk_norm = getattr(module, "q_norm", None) is not None  # Qwen3 / Gemma 3: tuned as qk_norm signatures
    out = library.attention(query, key, value, causal, scaling, qk_norm)
    return out.transpose(1, 2).contiguous(), None


def causal_or_sdpa_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """None (is_causal) for a pure causal mask with no padding; sdpa's mask otherwise."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = mask_function or causal_mask_function
    plain = (allow_is_causal_skip and attention_mask is None and local_size is None
             and mask_function is causal_mask_function and isinstance(q_offset, int) and isinstance(kv_offset, int)
             and isinstance(q_length, int) and isinstance(kv_length, int) and (q_length == 1 or q_length == kv_length))
    if plain:
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def register(dispatcher: Dispatcher, name: str = NAME) -> str:
    """Make `dispatcher` the active one and register it with transformers under `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    library.activate(dispatcher)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, causal_or_sdpa_mask)
    return name

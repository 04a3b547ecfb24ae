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

import torch

from ..dispatcher import Dispatcher
from .. import library

NAME = "lzsolve"


def table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs):
    """(causal, window, softcap, qk_norm) for a call the table serves, None for one it hands to
    SDPA: a padding mask, dropout, attention weights asked for, or a query that is neither a
    whole prefill nor one decode token."""
    seq_q, kv_len = query.shape[2], key.shape[2]
    simple = (attention_mask is None and dropout == 0.0 and not kwargs.get("output_attentions")
              and kwargs.get("position_bias") is None and kwargs.get("cache") is None
              and query.shape[1] % key.shape[1] == 0 and (seq_q == kv_len or seq_q == 1))
    if not simple:
        return None
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(is_causal) and seq_q > 1  # transformers' rule: a single query attends to every key
    qk_norm = getattr(module, "q_norm", None) is not None  # Qwen3 / Gemma 3: tuned as qk_norm signatures
    return causal, int(kwargs.get("sliding_window") or 0), float(kwargs.get("softcap") or 0.0), qk_norm


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    call = table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs)
    if call is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal, window, softcap, qk_norm = call
    out = library.attention(query, key, value, causal, scaling, qk_norm, window, softcap)
    return out.transpose(1, 2).contiguous(), None


def _is_causal_window(mask_function, window: int) -> bool:
    """Whether mask_function is the causal mask, cut to `window` keys back when window > 0: tried
    at query-key distances around 0 and around the window (a few dozen pairs, elementwise, as
    transformers calls it), since models build it from composed closures; runs once per mask."""
    distances = [-2, -1, 0, 1, 2] + ([window - 1, window, window + 1] if window else [])
    pairs = [(q, q - d) for d in distances for q in (max(d, 0), max(d, 0) + 5)]
    q_idx, kv_idx = torch.tensor([q for q, _ in pairs]), torch.tensor([kv for _, kv in pairs])
    distance = q_idx - kv_idx
    expected = (distance >= 0) & ((distance < window) if window else True)
    try:
        got = mask_function(torch.tensor(0), torch.tensor(0), q_idx, kv_idx)
        return isinstance(got, torch.Tensor) and bool((got.expand_as(expected) == expected).all())
    except Exception:  # noqa: BLE001 - a mask function of another form: leave it to SDPA
        return False


def causal_or_sdpa_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """None for a causal mask (sliding or not) with no padding, whose last query is the last key:
    the attention call then says causal and window itself; sdpa's mask otherwise."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = mask_function or causal_mask_function
    ints = all(isinstance(v, int) for v in (q_length, kv_length, q_offset, kv_offset))
    plain = (allow_is_causal_skip and attention_mask is None and ints and (q_length == 1 or q_length == kv_length)
             and q_offset + q_length == kv_offset + kv_length
             and (mask_function is causal_mask_function and local_size is None
                  or _is_causal_window(mask_function, int(local_size or 0))))
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

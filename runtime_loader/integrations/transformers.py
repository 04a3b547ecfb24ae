"""Hugging Face transformers: the Dispatcher serving a model's modules.

    from runtime_loader.integrations.transformers import patch
    report = patch(model, d)             # attention, norms, RoPE, MLP activation, linears
    print(report)                        # what was replaced and what was left, by class

or, for attention alone:

    register(d)                          # name "lzsolve"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="lzsolve")

The common serving cases (no explicit mask, no dropout, prefill with
seq_q == kv_len or single-token decode) go through torch.ops.lzsolve.attention,
so torch.compile(fullgraph=True) sees one node; everything else (padding masks,
chunked prefill, a position bias, paged caches...) is handed to the implementation
the model ran, unchanged: transformers' SDPA, or for a model that ran its eager
attention (register's second name, "lzsolve_eager") that eager form with eager's mask.
Masks are built as for that implementation, except that with no padding mask at all a plain
causal mask is left implicit (is_causal) even under torch.compile, where
transformers (before torch 2.14) would materialise it and lose the fast path.
One case still gets a mask under torch.compile: use_cache=False without an
attention_mask, where transformers checks position_ids for packed sequences; such
calls take the SDPA path (same results, not the table).
"""
from __future__ import annotations

import ast
import functools
import inspect
import itertools
import sys
import textwrap
import types
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import custom_ops, registry
from ..dispatcher import (
    AUTOCAST,
    AUTOGRAD,
    MAX_MEMO_SHAPES,
    NOT_SERVED,
    OWN_CODE,
    Dispatcher,
    Entry,
    NotServed,
    _hand_back,
)
from ..dtypes import DTYPES
from ..ops import Signature
from ..ops.embedding import embedding as eager_embedding
from ..ops.linear import linear_call
from ..safeio import warn
from .modules import (
    GATED_OPS,
    PLAIN_OPS,
    Kind,
    classify,
    eps_of,
    expert_parallel,
    experts_arguments,
    is_experts,
    meta_functions,
    meta_twin,
    modelling_modules,
    own_parameters,
    prescaled_moe,
    rope_layout,
    sibling_groups,
)

NAME = "lzsolve"


def table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs):
    """(causal, window, softcap, sinks, qk_norm) for a call the table serves, None for one it hands
    to SDPA (or, with attention sinks, to the eager reference): a padding mask, dropout, attention
    weights asked for, a query that is neither a whole prefill nor one decode token, a call autograd
    records or one under autocast (_own_code_reason)."""
    seq_q, kv_len = query.shape[2], key.shape[2]
    sinks = kwargs.get("s_aux")  # GPT-OSS's attention sinks: one logit per q head
    simple = (attention_mask is None and dropout == 0.0 and not kwargs.get("output_attentions")
              and kwargs.get("position_bias") is None and kwargs.get("cache") is None
              and (sinks is None or isinstance(sinks, torch.Tensor) and sinks.shape == query.shape[1:2])
              and query.shape[1] % key.shape[1] == 0 and (seq_q == kv_len or seq_q == 1))
    if not simple or _own_code_reason(query, key, value, sinks):  # training, autocast: the model's own attention
        return None
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(is_causal) and seq_q > 1  # transformers' rule: a single query attends to every key
    # Qwen3 / Gemma 3 (q_norm, k_norm), Llama 4's RoPE layers (one weightless qk_norm): tuned as qk_norm signatures
    qk_norm = getattr(module, "q_norm", None) is not None or getattr(module, "qk_norm", None) is not None
    return causal, int(kwargs.get("sliding_window") or 0), float(kwargs.get("softcap") or 0.0), sinks, qk_norm


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """A model that ran SDPA: what the table serves (_serve), the rest as SDPA ran it."""
    call = table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs)
    if call is None:
        eager = kwargs.get("s_aux") is not None or kwargs.get("softcap")
        if attention_mask is None and (eager or kwargs.get("sliding_window")):
            # a causal mask left implicit (causal_or_sdpa_mask) that SDPA's is_causal cannot say: built here
            causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            attention_mask = _causal_mask(query.shape[2], key.shape[2], bool(causal) and query.shape[2] > 1,
                                          int(kwargs.get("sliding_window") or 0), query.dtype, query.device)
        # what SDPA cannot take (attention sinks, a logit soft cap): the model's own eager form,
        if eager:
            own = sys.modules[type(module).__module__].eager_attention_forward
            if attention_mask is not None and attention_mask.dtype == torch.bool:  # which adds its mask to the scores
                attention_mask = _additive(~attention_mask, query.dtype)
            return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    return _serve(query, key, value, scaling, call)


def attention_forward_eager(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                            is_causal=None, **kwargs):
    """A model that ran its eager attention (one that declares no SDPA, or a user's choice): what the
    table serves (_serve), the rest by that eager form, with the mask eager built (causal_or_eager_mask
    leaves a plain causal one out: built here), so that what SDPA would drop (a position bias, sinks
    of another form) or change (fully padded rows) is as it was."""
    call = table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs)
    if call is not None:
        return _serve(query, key, value, scaling, call)
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        attention_mask = _causal_mask(query.shape[2], key.shape[2], bool(causal), int(kwargs.get("sliding_window") or 0),
                                      query.dtype, query.device)
    own = sys.modules[type(module).__module__].eager_attention_forward
    return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _causal_mask(seq_q: int, kv_len: int, causal: bool, window: int, dtype, device):
    """The additive mask (1, 1, seq_q, kv_len) eager builds for a call with no padding whose last query
    is the last key: each query sees the keys up to its own (causal), the last `window` of them where
    window > 0; None where it sees every key."""
    if not causal and not window:
        return None
    distance = torch.arange(kv_len - seq_q, kv_len, device=device)[:, None] - torch.arange(kv_len, device=device)
    hidden = (distance < 0) if causal else torch.zeros_like(distance, dtype=torch.bool)
    if window:
        hidden |= distance >= window
    return _additive(hidden, dtype)[None, None]


def _additive(hidden, dtype):
    """A mask added to attention scores: 0 where a key is seen, the dtype's min where `hidden`."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill(hidden, torch.finfo(dtype).min)


def _serve(query, key, value, scaling, call):
    causal, window, softcap, sinks, qk_norm = call
    # the plain methods, not _table(): the mask was left to the call (causal_or_sdpa_mask), so a call the
    # table does not serve takes the op's fallback, which builds it, not transformers' own path
    out = _ops().attention(query, key, value, causal, scaling, window=window, softcap=softcap, sinks=sinks,
                           qk_norm=qk_norm)
    return out.transpose(1, 2).contiguous(), None


def _ops():
    """Eager: the active Dispatcher's methods themselves, which skip the custom-op dispatch
    (microseconds per call). torch.compile: the custom ops (one opaque graph node each), or with a
    traced Dispatcher (patch(traced=True)) its methods again, traced into the graph."""
    active = custom_ops.active()
    if torch.compiler.is_compiling():
        return active.traced_ops if active.traced else torch.ops.lzsolve
    return active


def _table():
    """_ops(), where a call the table does not serve returns NOT_SERVED (Dispatcher.served), for the
    caller to run its module's own code: what the unpatched model ran. Under torch.compile the custom
    ops never hand a call back (their node is in the graph; such calls take the op's fallback)."""
    active = custom_ops.active()
    if torch.compiler.is_compiling():
        ops = active.traced_served if active.traced else torch.ops.lzsolve
        # in grad mode a call autograd records runs the module's own code here too (the custom ops have
        # no backward), and under autocast every call; Dynamo reads the flags once per graph, as guards
        return _OwnCodeView(ops, counted=False) if torch.is_grad_enabled() or _autocast() else ops
    if torch.is_grad_enabled() or _autocast():  # (two flag reads on the inference path)
        return _own_code_view(active.served)
    return active.served


_autocast = torch._C._is_any_autocast_enabled  # whether torch.autocast is on for some device (Dynamo folds it)


def _own_code_reason(*args) -> str | None:
    """Why a patched module's call reading `args` runs the module's own code, not the table: under
    autocast (AUTOCAST: the unpatched model's GEMMs and attention ran in the autocast dtype, which a
    table kernel handed fp32 would not), or autograd records it (AUTOGRAD, _records). None: the
    table is asked."""
    if _autocast():
        return AUTOCAST
    return AUTOGRAD if _records(*args) else None


def _records(*args) -> bool:
    """Whether autograd records a call reading `args` (grad mode on, one of its tensors requiring
    grad). The table's kernels are forward-only (no autograd node) and the siblings' fused weight is
    detached from their parameters: such a call runs the module's own code, so that a patched model
    trains with the unpatched model's gradients. Inference (no_grad, inference_mode, or tensors that
    require no grad) is served as before."""
    if not (torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args)):
        return False
    global _told_records
    if not _told_records and not torch.compiler.is_compiling():  # a server that forgot no_grad loses the table's gains: say so, once
        _told_records = True
        warnings.warn("lzsolve: calls autograd records (grad mode on, a weight or input requiring grad) run the "
                      "model's own code, which the table does not serve: wrap inference in torch.inference_mode() "
                      "or torch.no_grad() to serve it", stacklevel=3)
    return True


_told_records = False


class _OwnCodeView:
    """Dispatcher.served (or, compiling, the ops _table gives there) for calls made in grad mode or
    under autocast: NOT_SERVED for a call autograd records or any under autocast
    (_own_code_reason), for the module's own code, counted under that reason (Dispatcher.hand_back:
    served would have counted it, handed back or not; not while compiling, where nothing is
    counted); any other call as served. Each method is wrapped on its first read and kept in __dict__."""

    def __init__(self, served, counted: bool = True):
        self.served, self.counted = served, counted

    def __getattr__(self, method: str):
        serve = getattr(self.served, method)
        dispatcher = self.served._dispatcher if self.counted else None

        def call(*args, **kwargs):
            if why := _own_code_reason(*args, *kwargs.values()):
                return NOT_SERVED if dispatcher is None else dispatcher.hand_back(method, why, args, kwargs)
            return serve(*args, **kwargs)

        self.__dict__[method] = call
        return call


_kept_view = _OwnCodeView(None)


def _own_code_view(served) -> _OwnCodeView:
    """The _OwnCodeView of the active Dispatcher's served methods (one kept: one dispatcher is active)."""
    global _kept_view
    if _kept_view.served is not served:
        _kept_view = _OwnCodeView(served)
    return _kept_view


def _own(module, *args):
    """The module's own forward, as its class had it before patch(): what the unpatched model ran
    (its serving class names that class; a meta twin's experts name a stand-in, _ShapesOnly)."""
    return type(module)._lzsolve_base.forward(module, *args)


@torch.compiler.assume_constant_result  # under torch.compile: run while tracing, its answer a constant
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


def _plain_causal(q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, local_size,
                  allow_is_causal_skip) -> bool:
    """Whether a mask asked for is causal (sliding or not) with no padding, whose last query is the last
    key: the attention call then says causal and window itself."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is None:  # not `or`: Dynamo cannot take the truth of a closure (torch 2.11: a graph break)
        mask_function = causal_mask_function
    ints = all(isinstance(v, int) for v in (q_length, kv_length, q_offset, kv_offset))
    return (allow_is_causal_skip and attention_mask is None and ints and (q_length == 1 or q_length == kv_length)
            and q_offset + q_length == kv_offset + kv_length
            and (mask_function is causal_mask_function and local_size is None
                 or _is_causal_window(mask_function, int(local_size or 0))))


def causal_or_sdpa_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """None for a plain causal mask (_plain_causal), sdpa's mask otherwise."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if _plain_causal(q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, local_size,
                     allow_is_causal_skip):
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=causal_mask_function if mask_function is None else mask_function,
                     attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def causal_or_eager_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                         attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """None for a plain causal mask (_plain_causal), eager's own mask otherwise (fully padded rows as
    eager has them, which sdpa's differ from)."""
    from transformers.masking_utils import causal_mask_function, eager_mask

    if _plain_causal(q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, local_size,
                     allow_is_causal_skip):
        return None
    return eager_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                      mask_function=causal_mask_function if mask_function is None else mask_function,
                      attention_mask=attention_mask, local_size=local_size, **kwargs)


# --- ALiBi attention modules (BLOOM's): q, k and v from one fused GEMM, its own score matmuls -----------------
def is_alibi_attention(module) -> bool:
    """BLOOM's attention module: its forward takes `alibi` (the biases its model builds from the
    attention mask) and computes q, k and v with one fused query_key_value (split by its _reshape),
    then its output projection `dense`."""
    cls = _base_class(module)
    try:
        takes = "alibi" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False
    return takes and all(hasattr(module, a) for a in ("query_key_value", "dense", "_reshape", "num_heads",
                                                         "inv_norm_factor", "hidden_dropout"))


def alibi_attention(module, hidden_states, residual, attention_mask, layer_past, attend, output_attentions=False,
                    kwargs=None):
    """BLOOM's attention with its scores computed by `attend(q, k, v, causal, scale)` (the table's
    attention with the alibi flag: slope_h * key position, the biases BLOOM builds for a batch
    without padding), its KV cache updated as its own forward does; None, before anything is
    computed, for a call it hands back to BLOOM's forward: a mask (padding, where BLOOM's biases
    count each row's positions from its first token, or a query other than a whole prefill or one
    decode token: causal_or_sdpa_mask leaves the mask out for those alone), attention weights asked
    for, a head mask, dropout while training, pretraining_tp's slow_but_exact output projection, or a
    call autograd records (_records: the table's kernels are forward-only, so its q/k/v and the
    layers below would get no gradient through them; the grad-mode flag read first, so inference
    builds no argument list for it)."""
    kwargs = kwargs or {}
    batch, q_length, _ = hidden_states.shape
    if (attention_mask is not None or output_attentions or kwargs.get("head_mask") is not None
            or module.training and getattr(getattr(module, "attention_dropout", None), "p", 0) > 0
            or getattr(module, "pretraining_tp", 1) > 1 and getattr(module, "slow_but_exact", False)
            or (torch.is_grad_enabled() or _autocast()) and _own_code_reason(hidden_states, *module.parameters())):
        return None
    q, k, v = module._reshape(module.query_key_value(hidden_states))
    if layer_past is not None:
        k, v = layer_past.update(k, v, module.layer_idx)
    if torch.compiler.is_compiling():  # the custom op's fake output is contiguous: so must its kernel's be, which
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # follows q's layout (here a view of the fused qkv)
    out = attend(q, k, v, q_length > 1, module.inv_norm_factor)  # one query sees every key (transformers' rule)
    out = module.dense(out.transpose(1, 2).reshape(batch, q_length, -1))
    dropout_add = sys.modules[_base_class(module).__module__].dropout_add
    return dropout_add(out, residual, module.hidden_dropout, module.training), None


def _additive_mask(attention_mask, hidden_states, layer_past, layer_idx):
    """The mask BLOOM's own forward adds to its scores: a boolean one (SDPA's form) as 0 and the
    dtype's min; none (a call with no padding) as the causal mask of a prefill, where the query's
    last row is the cache's last key (a decode token sees every key: none)."""
    if attention_mask is not None:
        return _additive(~attention_mask, hidden_states.dtype) if attention_mask.dtype == torch.bool else attention_mask
    q_length = hidden_states.shape[1]
    if q_length == 1:
        return None
    past = layer_past.get_seq_length(layer_idx) if layer_past is not None else 0
    return _causal_mask(q_length, past + q_length, True, 0, hidden_states.dtype, hidden_states.device)


def _alibi_attend(q, k, v, causal, scale):
    return _ops().attention(q, k, v, causal, scale, alibi=True)


def _alibi_attention_forward(self, hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
                             output_attentions=False, **kwargs):
    """A BloomAttention served by the table (alibi_attention), or handed back to its own forward with
    the mask it expects (_additive_mask)."""
    out = alibi_attention(self, hidden_states, residual, attention_mask, layer_past, _alibi_attend, output_attentions,
                          kwargs)
    if out is not None:
        return out
    mask = _additive_mask(attention_mask, hidden_states, layer_past, self.layer_idx)
    return _base_class(self).forward(self, hidden_states, residual, alibi, mask, layer_past, use_cache,
                                     output_attentions, **kwargs)


def set_attention(model, name: str) -> None:
    """Make `name` the model's attention implementation. BLOOM's model refuses one (its attention is
    its own module, which patch() serves: _alibi_attention_forward) but builds its causal mask by
    its config's implementation: set there, so that a call without padding gets none
    (causal_or_sdpa_mask), which the served forward reads as plain causal."""
    if any(is_alibi_attention(m) for m in model.modules()):
        model.config._attn_implementation = name
    else:
        model.set_attn_implementation(name)


def register(dispatcher: Dispatcher, name: str = NAME) -> str:
    """Make `dispatcher` the active one and register it with transformers under `name` (for a model
    that ran SDPA) and name + "_eager" (for one that ran its eager attention)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    custom_ops.activate(dispatcher)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, causal_or_sdpa_mask)
    AttentionInterface.register(name + EAGER, attention_forward_eager)
    AttentionMaskInterface.register(name + EAGER, causal_or_eager_mask)
    return name


EAGER = "_eager"  # register's second name, for a model that ran its eager attention


def _ran_eager(model, name: str) -> bool:
    """Whether the model ran its eager attention before patch (or a patch before this one saw it so)."""
    return model.config._attn_implementation in ("eager", name + EAGER)


def _reads_the_mask(cls) -> bool:
    """Whether cls.forward does more with its attention_mask than hand it to a call (or its source
    cannot be read): DeepSeek V4's pads a tensor mask with its compressed keys' bias and adds none
    to a mask left out. A model that ran eager attention always built such a module a tensor mask,
    so the None that says "plain causal" to the table is for modules that only hand it on."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(cls.forward))))
    except (OSError, TypeError, SyntaxError):
        return True
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == "attention_mask"):
            continue
        parent = parents[node]
        call = parents[parent] if isinstance(parent, ast.keyword) else parent
        handed_on = (isinstance(node.ctx, ast.Load) and isinstance(call, ast.Call) and node is not call.func
                     and not (isinstance(call.func, ast.Name) and call.func.id in ("isinstance", "getattr", "len")))
        if not handed_on:
            return True
    return False


# --- patch: every module the table serves ------------------------------------------------------------
# Forwards bound to module instances: each computes what the module's own forward computes
# (norms and activations were classified by running them; MLPs are checked by running both
# forwards once on the model's own weights), through the table.

def _remembered(serve):
    """The forward of a module of one input whose table call is `serve(self, x)`: its output where
    the table serves x, else (a NotServed) the module's own forward, the code the unpatched model
    ran. The shapes handed back are remembered per module (the Dispatcher's own_calls_memo, by x's
    shape and dtype), so later calls of those shapes run the module's own forward without the
    table's lookup, counted as before: 0.6 against 2.5 us a call on the CPU VM
    (benchmarks/fallback_cost.py), paid by every call past the tuned range or where the table's
    choice is the op's fallback. Not while Dynamo traces (the memo would become guards); a
    recording clears it and resolves every call itself."""
    def forward(self, x):
        compiling = torch.compiler.is_compiling()
        memo = self._lzsolve_own
        if not compiling:
            calls = memo.get((x.shape, x.dtype))
            if calls is not None:
                next(calls)
                return _own(self, x)
        out = serve(self, x)
        if not isinstance(out, NotServed):
            return out
        if out.calls is not None and not compiling and len(memo) < MAX_MEMO_SHAPES:
            memo[(x.shape, x.dtype)] = out.calls
        return _own(self, x)
    forward.__name__ = forward.__qualname__ = serve.__name__
    forward.__doc__ = serve.__doc__
    return forward


@_remembered
def _rms_forward(self, x):
    return _table().rms_norm(x, self.weight, self._lzsolve_eps, self._lzsolve_unit_offset)


def _rms_gated_forward(self, x, gate):
    """Qwen3.5's gated RMSNorm, weight * rms_norm(x) * silu(gate) over each value head's rows,
    as the table tuned it: the norm per row, then a SwiGLU per token over every head (gate, normed)."""
    normed = _table().rms_norm(x, self.weight, self._lzsolve_eps, False)
    if isinstance(normed, NotServed):
        return _own(self, x, gate)
    rows = (-1, x.shape[-1] * self._lzsolve_heads) if x.shape[0] % self._lzsolve_heads == 0 else x.shape
    out = _table().swiglu(gate.reshape(rows), normed.reshape(rows))
    return _own(self, x, gate) if isinstance(out, NotServed) else out.reshape(x.shape)


@_remembered
def _qk_norm_forward(self, x):
    # q_norm / k_norm: per head on (batch, seq, heads, d) (Qwen3) or on its transpose
    # (batch, heads, seq, d) (Gemma 3), the op's (..., heads, d) either way, so the signature
    # says heads as the tuned one does; over the whole projection (OLMo 2) on (..., d)
    eps, unit_offset = self._lzsolve_eps, self._lzsolve_unit_offset
    if x.shape[-1] != self.weight.shape[-1] or x.dim() != 4:
        out = _table().qk_norm(x.unsqueeze(-2), self.weight, eps, unit_offset)
        return out if isinstance(out, NotServed) else out.squeeze(-2)
    heads = self._lzsolve_heads
    if x.shape[1] == heads and (x.shape[2] != heads or x.stride(1) < x.stride(2)):
        out = _table().qk_norm(x.transpose(1, 2), self.weight, eps, unit_offset)
        return out if isinstance(out, NotServed) else out.transpose(1, 2)
    return _table().qk_norm(x, self.weight, eps, unit_offset)


@_remembered
def _layer_norm_forward(self, x):
    # a LayerNorm without a bias may have no bias attribute at all (Cohere's)
    return _table().layer_norm(x, self.weight, getattr(self, "bias", None), self._lzsolve_eps)


# --- the fused residual add --------------------------------------------------------------------------
# A decoder layer adds its sublayer's output into the residual stream, then norms that total:
#     hidden_states = residual + hidden_states
#     residual = hidden_states
#     hidden_states = self.post_attention_layernorm(hidden_states)
# (Llama, Qwen, Mistral; Gemma 3 before its pre_feedforward_layernorm). Where a layer's forward has
# those three lines and its norm is one the patch serves, the forward is compiled again from its
# own source with them as one call of _add_norm: norm.rms_add, one pass and one launch fewer. The
# layer's input may be a hidden state the caller keeps (output_hidden_states, the user's
# inputs_embeds), so the call asks for new tensors (keep_inputs) where serving engines, which own
# their residual stream, let a kernel write over it.
ADD_NORM = "_lzsolve_add_norm"  # the name the recompiled forwards call it by, in their module's globals


def _add_norm(norm, x, residual, residual_first: bool = True):
    """(norm(total), total) of the layer's `total = residual + x` (x + residual: residual_first
    False): one norm.rms_add call where the table serves it and both are contiguous, as a kernel's
    results are; else the add and the norm, as the layer's own lines did (their sum takes its first
    term's layout, which the layer's later lines may rely on: a .view() of Inkling's MoE did)."""
    if x.is_contiguous() and residual.is_contiguous():
        out = _table().rms_norm_add(x, residual, norm.weight, norm._lzsolve_eps, norm._lzsolve_unit_offset, True)
        if not isinstance(out, NotServed):
            return out
    total = residual + x if residual_first else x + residual
    return norm(total), total


def _add_norm_sites(body: list) -> list[tuple[int, str, str, str, str, bool]]:
    """(index, hidden name, residual name, norm attribute, addend name, residual first) of each
    `h = r + a; r = h; h = self.<norm>(h)` in a list of statements (the sum either way round; the
    addend a is h itself in most layers, the sublayer's output under a name of its own in Llama 4's)."""
    def name(node) -> str | None:
        return node.id if isinstance(node, ast.Name) else None

    def assigned(stmt) -> tuple[str | None, ast.expr | None]:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            return name(stmt.targets[0]), stmt.value
        return None, None

    sites = []
    for i in range(len(body) - 2):
        hidden, value = assigned(body[i])
        if hidden is None or not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
            continue
        terms = [name(value.left), name(value.right)]
        if None in terms or terms[0] == terms[1]:
            continue
        residual, total = assigned(body[i + 1])
        if residual not in terms or residual == hidden or name(total) != hidden:
            continue
        addend = terms[1 - terms.index(residual)]
        target, call = assigned(body[i + 2])
        if (target == hidden and isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords
                and name(call.args[0]) == hidden and isinstance(call.func, ast.Attribute)
                and name(call.func.value) == "self"):
            sites.append((i, hidden, residual, call.func.attr, addend, terms[0] == residual))
    return sites


class _FuseAddNorm(ast.NodeTransformer):
    """Each site of _add_norm_sites, in every statement list of the function, made one line."""

    def __init__(self, norms: set[str]):
        self.norms, self.fused = norms, []

    def generic_visit(self, node):
        super().generic_visit(node)
        for field_name in ("body", "orelse", "finalbody"):
            body = getattr(node, field_name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                setattr(node, field_name, self._fuse(body))
        return node

    def _fuse(self, body: list) -> list:
        for i, hidden, residual, norm, addend, residual_first in reversed(_add_norm_sites(body)):
            if norm not in self.norms:
                continue
            line = ast.parse(f"{hidden}, {residual} = {ADD_NORM}(self.{norm}, {addend}, {residual}, "
                             f"{residual_first})").body[0]
            body[i:i + 3] = [ast.copy_location(line, body[i])]
            self.fused.append(norm)
        return body


_fused_forwards: dict[tuple, tuple] = {}  # (class, norm attributes) -> (forward or None, norms fused)


def _fused_forward(cls, norms: frozenset[str]):
    """cls.forward compiled again with its add + norm lines as _add_norm calls, and the norms it
    fuses; (None, ()) where there are none, or its source cannot be read or recompiled as it is
    (a closure, or super(), would not survive): the layer keeps its forward."""
    key = (cls, norms)
    if key not in _fused_forwards:
        _fused_forwards[key] = _compile_fused(cls, norms)
    return _fused_forwards[key]


def _compile_fused(cls, norms: frozenset[str]):
    function = inspect.unwrap(cls.forward)  # under transformers' decorators, whose source line it keeps
    module = sys.modules.get(function.__module__)
    if not isinstance(function, types.FunctionType) or function.__code__.co_freevars or module is None:
        return None, ()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None, ()
    node = tree.body[0] if tree.body and isinstance(tree.body[0], ast.FunctionDef) else None
    if node is None or any(isinstance(n, ast.Name) and n.id == "super" for n in ast.walk(node)):
        return None, ()
    fuse = _FuseAddNorm(set(norms))
    fuse.visit(node)
    if not fuse.fused:
        return None, ()
    setattr(module, ADD_NORM, _add_norm)
    namespace: dict = {}
    # the module's own globals, so the forward reads what the original reads (and its decorators run again)
    exec(compile(ast.fix_missing_locations(tree), inspect.getsourcefile(function) or "<lzsolve>", "exec"),  # noqa: S102
         vars(module), namespace)
    return namespace[node.name], tuple(fuse.fused)


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    # transformers calls the experts with the router's choice: (tokens, hidden), (tokens, top_k) twice
    out = _table().moe_experts(hidden_states, top_k_index, top_k_weights, *experts_arguments(self, self._lzsolve_kind))
    return _own(self, hidden_states, top_k_index, top_k_weights) if isinstance(out, NotServed) else out


def _prescaled_moe_forward(self, hidden_states):
    # Llama 4's MoE layer: its own router (logits GEMM, top-k, sigmoid: no op computes that routing;
    # called as the module, so output_router_logits still records it), the routed experts through
    # moe.experts over each token's rows scaled by its weights (prescaled_moe), the shared expert as
    # its module (a gated MLP the patch may serve)
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    _, logits = self.router(x)
    routed = prescaled_moe(x, logits, self.router.top_k, self.experts, self._lzsolve_kind, _table())
    if isinstance(routed, NotServed):
        return _own(self, hidden_states)
    out = self.shared_expert(x) if "shared_expert" in self._modules else torch.zeros_like(x)
    out.add_(routed)
    return out, logits


def _router_forward(self, hidden_states):
    # the logits GEMM and the top-k choice through the table; each family's dtypes kept (Mixtral returns
    # float32 weights, Qwen casts them to the logits' dtype, GraniteMoE returns float32 logits)
    if self.weight.dtype != hidden_states.dtype:
        # a router weight kept in float32 in a bf16 model (DeepSeek's _keep_in_fp32_modules_strict): its own
        # forward, which takes the logits in float32 (a workload of one dtype records no float32 GEMM)
        return _own(self, hidden_states)
    rows = hidden_states.reshape(-1, hidden_states.shape[-1])
    logits = _table().linear(rows, self.weight, getattr(self, "bias", None))
    routed = NOT_SERVED if isinstance(logits, NotServed) else _table().moe_router(logits, self._lzsolve_top_k,
                                                                         self._lzsolve_renorm)
    if isinstance(routed, NotServed):
        return _own(self, hidden_states)
    weights, ids = routed
    return (logits.float() if self._lzsolve_float32_logits else logits,
            weights if self._lzsolve_float32_weights else weights.to(rows.dtype), ids)


@_remembered
def _embedding_forward(self, ids):
    return _table().embedding(ids, self.weight, self._lzsolve_scale)


def _embedding_scale(module) -> tuple[bool, float | None]:
    """(served, scale): a token embedding whose forward is weight[ids], times a constant scale
    where it has one (Gemma's embed_scale, sqrt(hidden) rounded to the weight's dtype: the
    embedding op's `scaled` flag). Checked by running both forwards on two token ids; one that
    renormalises rows (max_norm) changes its weight when run, and is left."""
    if getattr(module, "max_norm", None) is not None or module.weight.is_meta:
        return False, None
    buffer = getattr(module, "embed_scale", None)
    scale = None if buffer is None else float(buffer)  # once, at patch time: no device sync per call
    ids = torch.tensor([[0, module.weight.shape[0] - 1]], device=module.weight.device)
    with torch.no_grad():
        expected = type(module).forward(module, ids)
        got = eager_embedding(ids, module.weight, scale)  # the op's definition, not a table's kernel
    return expected.shape == got.shape and bool(torch.equal(got, expected)), scale


def _linear(x, weight, bias, ops=None):
    """The table's GEMM over x's rows (through `ops`, default _table()), x folded to (tokens, k)
    first: F.linear on a 3-D slice whose rows are not one matrix (the lm_head's hidden[:, -1:]) runs
    a batched GEMM reading the weight once per batch row unless autograd makes it fold (Gemma 3's
    lm_head at batch 4: 1.86 against 0.48 ms on the H100, benchmarks/hf_end_to_end.py); copying those few rows
    costs nothing."""
    out = (ops or _table()).linear(x.reshape(-1, x.shape[-1]), weight, bias)
    return out if isinstance(out, NotServed) else out.view(*x.shape[:-1], out.shape[-1])


@_remembered
def _linear_forward(self, x):
    return _linear(x, self.weight, self.bias)


class _Pending(NamedTuple):
    """The fused GEMM's outputs, kept for the members not yet called with the same input: x, its
    version counter and each member's weights' (_Siblings._version; None under compile), which
    members took theirs."""

    x: torch.Tensor
    version: int | None
    taken: tuple[bool, ...]
    outputs: tuple[torch.Tensor, ...]
    weight_versions: tuple[tuple, ...] | None


class _Siblings:
    """Linears that read one tensor (q/k/v, gate/up) served as one GEMM over their
    concatenated weights, the GEMM the table tuned (capture fuses them the same way). The first
    member called computes every member's output; the others take theirs when they are called
    with that same tensor object, unchanged since (_Pending), and compute the GEMM again otherwise
    (any order, any subset).
    Calls the table does not serve take the op's fallback on the fused weight (still one GEMM).
    The members' weights become views of the fused weight, so memory is not doubled; one whose
    storage has changed since (.to(), a new Parameter) makes the fused weight be built again."""

    def __init__(self, linears: list[torch.nn.Linear]):
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self.pending: _Pending | None = None
        self._fuse()

    def _fuse(self) -> None:
        # weights made under inference_mode stay inference tensors: a member whose data became a
        # normal tensor would keep the inference tensor's missing version counter (and fail to print)
        inference = any(linear.weight.is_inference() for linear in self.linears)
        with torch.inference_mode() if inference else torch.no_grad():
            self.weight = torch.cat([linear.weight for linear in self.linears])
            self.bias = torch.cat([linear.bias for linear in self.linears]) if self.linears[0].bias is not None else None
            for linear, weight in zip(self.linears, self.weight.split(self.sizes)):
                linear.weight.data = weight
            if self.bias is not None:
                for linear, bias in zip(self.linears, self.bias.split(self.sizes)):
                    linear.bias.data = bias
        self.storage = self._pointers()

    def _pointers(self) -> tuple:
        return tuple((m.weight.data_ptr(), m.bias is not None and m.bias.data_ptr()) for m in self.linears)

    def output(self, index: int, x):
        linear = self.linears[index]
        # training (the fused weight is detached), autocast: the member's own forward
        if why := _own_code_reason(x, linear.weight, linear.bias):
            self.pending = None
            if not torch.compiler.is_compiling():  # counted as a linear of its own is (_OwnCodeView), by its rows
                custom_ops.active().hand_back("linear", why, (x.reshape(-1, x.shape[-1]), linear.weight,
                                                              linear.bias), {})
            return _own(linear, x)
        pending, compiling = self.pending, torch.compiler.is_compiling()
        # the output computed for this member, unless x or its weights changed in place since (their
        # version counters: a member's parameter keeps its own, not the fused weight's; Dynamo cannot
        # guard on them, and a traced forward changes neither between its members' calls)
        if (pending is not None and pending.x is x and not pending.taken[index]
                and (compiling or pending.version == _counter(x)
                     and pending.weight_versions[index] == self._version(linear))):
            taken = tuple(done or i == index for i, done in enumerate(pending.taken))
            # once every member took its output, nothing holds the input or the outputs any longer
            self.pending = None if all(taken) else _Pending(x, pending.version, taken, pending.outputs,
                                                            pending.weight_versions)
            return pending.outputs[index]
        if not compiling and self._pointers() != self.storage:
            self._fuse()
        # the plain method: the fused GEMM computes what the members do whatever kernel serves it (the
        # op's fallback on the fused weight too: one GEMM where their own forwards are one each)
        outputs = _linear(x, self.weight, self.bias, _ops()).split(self.sizes, dim=-1)
        self.pending = _Pending(x, None if compiling else _counter(x), tuple(i == index for i in range(len(self.sizes))),
                                outputs, None if compiling else tuple(map(self._version, self.linears)))
        return outputs[index]

    @staticmethod
    def _version(linear) -> tuple:
        return _counter(linear.weight), linear.bias is not None and _counter(linear.bias)


def _counter(tensor) -> int | None:
    """The tensor's version counter, which every change in place moves on; None for a tensor made
    under torch.inference_mode, which keeps none: changes to it cannot be seen, so identity decides."""
    return None if tensor.is_inference() else tensor._version


def _sibling_forward(self, x):
    return self._lzsolve_siblings.output(self._lzsolve_index, x)


def _fusable(linears) -> bool:
    first = linears[0]
    return all(_base_class(m) is torch.nn.Linear and m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
               and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)
               and not m.weight.is_meta for m in linears)


@_remembered
def _gelu_forward(self, x):
    return _table().gelu(x)


def _gated(self, gate, up):
    """The MLP's gated activation through the table; where it does not serve, act(gate) * up as
    the MLP's own forward computes it (patch checked that it does, _same)."""
    out = getattr(_table(), self._lzsolve_gated)(gate, up)
    return getattr(self, self._lzsolve_act)(gate) * up if isinstance(out, NotServed) else out


def _gated_mlp_forward(self, x):
    return self.down_proj(_gated(self, self.gate_proj(x), self.up_proj(x)))


def _fused_gated_mlp_forward(self, x):  # Phi-3: one gate_up projection, halves gate and up
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(_gated(self, gate, up))


def _rope_function(original, layout: str):
    interleaved, once = layout == "interleaved", layout == "split_half_once"

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        # the common form: q, k (batch, heads, seq, d), cos/sin (batch or 1, seq, d), unsqueezed at dim 1
        # (GPT-OSS's: (..., d / 2), each angle once, which the op takes twice)
        plain = (not args and kwargs.get("unsqueeze_dim", 1) == 1 and set(kwargs) <= {"unsqueeze_dim"}
                 and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and cos.shape[-1] << once == q.shape[-1])
        if not plain:
            return original(q, k, cos, sin, *args, **kwargs)
        out = _table().rope(q, k, *((torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)) if once
                                    else (cos, sin)), interleaved)
        return original(q, k, cos, sin, *args, **kwargs) if isinstance(out, NotServed) else out
    apply_rotary_pos_emb.lzsolve_original = original
    return apply_rotary_pos_emb


def _packed(kwargs: dict) -> bool:
    """Whether a call carries packed sequences (cu_seqlens, seq_idx): the ops take one sequence per
    batch row. Other keywords the model passes along (use_cache) change nothing."""
    return any(v is not None for k, v in kwargs.items() if "cu_seq" in k or "seq_idx" in k)


def _deltanet_function(original):
    """torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule (Qwen3.5, Qwen3-Next): the
    op serves both (any chunk size computes the same); packed sequences and calls outside the
    table keep the original (transformers' choice: FLA's kernels where installed)."""
    def gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        served = NOT_SERVED if cu_seqlens is not None or _packed(kwargs) else _table().gated_deltanet(
            query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel)
        if isinstance(served, NotServed):
            return original(query, key, value, g=g, beta=beta, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            cu_seqlens=cu_seqlens, **kwargs)
        out, state = served
        return out, state if output_final_state else None
    gated_delta_rule.lzsolve_original = original
    return gated_delta_rule


def _conv_fn_function(original):
    """causal_conv1d_fn (a prompt): hidden_states (batch, channels, seq) as the op's (batch, seq,
    channels) view; other activations, packed sequences and calls outside the table keep the
    original (transformers' choice: causal-conv1d's kernel where installed). Explicit
    parameters (no signature bound per call): Qwen3.5's layers are host-bound at decode."""
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        x, silu = hidden_states.transpose(1, 2), activation is not None
        plain = activation in (None, "silu", "swish") and not _packed(kwargs) and weight.dim() == 2
        served = _table().causal_conv1d(x, weight, bias, None, silu) if plain else NOT_SERVED
        if isinstance(served, NotServed):
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        return served[0].transpose(1, 2)
    causal_conv1d_fn.lzsolve_original = original
    return causal_conv1d_fn


def _conv_update_function(original):
    """causal_conv1d_update (a decode step): the op rolls conv_state (a kernel may do it in place;
    else its new state is copied back, as the cache keeps that tensor)."""
    def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None):
        x, silu = hidden_states.transpose(1, 2), activation is not None
        plain = (activation in (None, "silu", "swish") and weight.dim() == 2 and hidden_states.shape[-1] == 1
                 and conv_state.shape[-1] == weight.shape[-1])
        served = _table().causal_conv1d(x, weight, bias, conv_state, silu) if plain else NOT_SERVED
        if isinstance(served, NotServed):
            return original(hidden_states, conv_state, weight, bias, activation)
        out, new_state = served
        if new_state is not conv_state:
            conv_state.copy_(new_state)
        return out.transpose(1, 2)
    causal_conv1d_update.lzsolve_original = original
    return causal_conv1d_update


# modelling-module functions patch() replaces, by name
FUNCTIONS = {"torch_chunk_gated_delta_rule": _deltanet_function, "torch_recurrent_gated_delta_rule": _deltanet_function,
             "causal_conv1d_fn": _conv_fn_function, "causal_conv1d_update": _conv_update_function}

_patched_functions: list[tuple] = []  # (modelling module, name, original function), for restore_functions


def restore_functions() -> None:
    """Put back the modelling-module functions patch() replaced (RoPE, Gated DeltaNet), for every model in
    this process; patched module instances keep their forwards."""
    while _patched_functions:
        module, name, original = _patched_functions.pop()
        setattr(module, name, original)


@dataclass
class PatchReport:
    """What patch() replaced and what it left, as module class -> count (functions by name)."""
    replaced: Counter = field(default_factory=Counter)
    left: dict[str, str] = field(default_factory=dict)  # class -> why
    fused: Counter = field(default_factory=Counter)  # "q_proj+k_proj+v_proj" -> groups served as one GEMM
    table: str = ""  # the table that serves (its file), or why none does

    def __str__(self) -> str:
        lines = [f"table: {self.table}"] if self.table else []
        lines.append("replaced: " + (", ".join(f"{name} x{n}" for name, n in sorted(self.replaced.items())) or "nothing"))
        if self.fused:
            lines.append("one GEMM: " + ", ".join(f"{name} x{n}" for name, n in sorted(self.fused.items())))
        lines += [f"left: {name}: {why}" for name, why in sorted(self.left.items())]
        return "\n".join(lines)


def _bind(module, forward, report: PatchReport, **attrs) -> None:
    _annotate(module, **attrs)
    _serve_with(module, forward)
    report.replaced[type(module).__name__] += 1


def _annotate(module, **attrs) -> None:
    for name, value in attrs.items():
        setattr(module, f"_lzsolve_{name}", value)


def _serve_with(module, forward) -> None:
    """Make `forward` the module's forward by giving the module a subclass of its class whose forward
    it is: under torch.compile, Dynamo guards a forward an instance holds itself on every call
    (about 100 guard lines a decoder layer, benchmarks/hf_end_to_end.py), a class's once with its type."""
    module.__class__ = _serving_class(_base_class(module), forward)


def _base_class(module) -> type:
    """The module's class before patch() gave it a serving subclass."""
    return type(module).__dict__.get("_lzsolve_base", type(module))


@functools.cache
def _serving_class(cls: type, forward) -> type:
    return type(cls.__name__, (cls,), {"forward": forward, "_lzsolve_base": cls, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def _mlp_form(module, kinds: dict, name: str):
    """(forward, gated op, the activation's attribute) when the module is a gated MLP of a form we
    serve, else None."""
    act_name = next((a for a in ("act_fn", "activation_fn") if f"{name}.{a}" in kinds), None)
    act = kinds.get(f"{name}.{act_name}")
    if act is None or act.op != "act" or act.act not in GATED_OPS:
        return None
    gated = GATED_OPS[act.act]
    if all(isinstance(getattr(module, a, None), torch.nn.Linear) for a in ("gate_proj", "up_proj", "down_proj")):
        return _gated_mlp_forward, gated, act_name
    if all(isinstance(getattr(module, a, None), torch.nn.Linear) for a in ("gate_up_proj", "down_proj")):
        return _fused_gated_mlp_forward, gated, act_name
    return None


def _same(module, forward, gated: str) -> bool:
    """Whether the module's own forward computes down(gated(gate(x), up(x))) with the op's definition
    (its fallback kernel), on one token through the module's own weights (meta weights cannot be
    run: the form is trusted there)."""
    weight = next(module.parameters())
    if weight.is_meta:
        return True
    gen = torch.Generator(device=weight.device).manual_seed(0)  # the model's own random stream is left alone
    x = torch.randn(1, 1, weight.shape[-1], device=weight.device, dtype=weight.dtype, generator=gen)

    def linear(name: str, t):
        return F.linear(t, getattr(module, name).weight, getattr(module, name).bias)

    with torch.no_grad():
        expected = _base_class(module).forward(module, x)
        gate, up = (linear("gate_up_proj", x).chunk(2, dim=-1) if forward is _fused_gated_mlp_forward
                    else (linear("gate_proj", x), linear("up_proj", x)))
        got = linear("down_proj", registry.fallback(gated).impl(gate, up))
    tol = 1e-5 if weight.dtype == torch.float32 else 2e-2
    return expected.shape == got.shape and bool(torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol))


def _warn_on_graph_table(dispatcher: Dispatcher) -> None:
    """A graph-mode table ranked kernels by GPU time alone; a model run eagerly also pays each
    call's launch and host work, where the ranking can differ (small shapes, decode)."""
    table = getattr(dispatcher, "table", None)
    if table is not None and table.raw.get("timing_mode") == "graph":
        warnings.warn("this table was tuned in graph mode (GPU time only); a model run eagerly also pays each "
                      "call's host cost: tune with --mode eager for it (or record the patched model and tune "
                      "--workload --mode eager), or keep this table for CUDA-graph serving", stacklevel=3)


def _replace(module, name: str, wrap, report: PatchReport) -> None:
    """module.name replaced by wrap(module.name), once: a function patched already (another model
    of this modelling module) keeps its replacement, and is counted again."""
    original = getattr(module, name)
    if not hasattr(original, "lzsolve_original"):
        _patched_functions.append((module, name, original))
        setattr(module, name, wrap(original))
    report.replaced[name] += 1


# --- what patch serves: planned from the model, observed on a meta twin, kept where the table serves -----

@dataclass
class _Plan:
    """What patch() would serve of a model, by module name: each module's serving forward and its
    attributes, the decoder layers whose residual add + norm become one call (forward, norms), the
    sibling linears served as one GEMM, whether attention goes through the table, and the modelling
    modules' functions replaced ((module, name) -> wrap). Nothing of the model is changed by making one."""
    bindings: dict[str, tuple] = field(default_factory=dict)
    layers: dict[str, tuple] = field(default_factory=dict)
    groups: list[tuple[str, ...]] = field(default_factory=list)
    attention: bool = True
    functions: dict[tuple, Callable] = field(default_factory=dict)


# the op each replaced modelling-module function calls, by name
FUNCTION_OPS = {"apply_rotary_pos_emb": "posenc.rope", "torch_chunk_gated_delta_rule": "recurrent.gated_deltanet",
                "torch_recurrent_gated_delta_rule": "recurrent.gated_deltanet",
                "causal_conv1d_fn": "conv.causal_depthwise", "causal_conv1d_update": "conv.causal_depthwise"}


def _plan(model, report: PatchReport) -> _Plan:
    """Every module an op covers, with the forward that serves it (what patch(all_ops=True) binds)."""
    plan = _Plan()
    kinds = classify(model)
    # activations inside a module served whole (a gated MLP, routed experts): no note that no op serves them alone
    parts: set[str] = {f"{module_name}.act_fn" for module_name, kind in kinds.items() if kind.op == "moe.experts"}
    for module_name, kind in kinds.items():  # Llama 4's: its router runs as its own module, said once
        if kind.op == "moe.prescaled":
            parts |= {f"{module_name}.router", f"{module_name}.experts.act_fn"}
            report.left[type(model.get_submodule(module_name).router).__name__] = \
                "a sigmoid of the top-k logits, not renormalised (moe.router is a softmax top-k): its own forward"
    for module_name, module in model.named_modules():
        form = _mlp_form(module, kinds, module_name)
        if form is None:
            continue
        forward, gated, act = form
        parts.add(f"{module_name}.{act}")
        if _same(module, forward, gated):
            plan.bindings[module_name] = (forward, {"gated": Dispatcher.METHODS[gated], "act": act})
        else:
            report.left[type(module).__name__] = "its forward is not down(act(gate(x)) * up(x))"
    text = model.config.get_text_config()
    heads = {"q_norm": _global(text, "num_attention_heads"),
             "k_norm": _global(text, "num_key_value_heads") or _global(text, "num_attention_heads"),
             "linear_v": _global(text, "linear_num_value_heads")}  # the gated norm's heads (Qwen3.5)
    served_classes = {type(module) for name, module in model.named_modules() if name in kinds}
    for module_name, module in model.named_modules():
        kind: Kind | None = kinds.get(module_name)
        cls = type(module).__name__
        if kind is None and type(module) in served_classes:  # (Gemma 4's v_norm: an RMSNorm with no weight)
            own = list(own_parameters(module))
            report.left[f"{cls} with parameters {own or 'none'}"] = "computes nothing an op serves (other " \
                f"{cls} modules do): its forward is its own"
        if kind is None and expert_parallel(module):
            report.left[cls] = "experts divided over ranks by transformers' expert parallelism (its forward runs " \
                               "them; a server calls moe_experts(..., ep=N) instead)"
        elif kind is None and is_experts(module):
            report.left[cls] = "experts in a form no op computes (an activation other than SwiGLU or GPT-OSS's, one " \
                               "bias without the other)"
        if kind is None or module_name in plan.bindings:
            continue
        binding, why = _module_binding(module_name, module, kind, heads)
        if binding is not None:
            plan.bindings[module_name] = binding
        elif module_name not in parts:
            report.left[cls] = why
    for module_name, module in model.named_modules():
        if is_alibi_attention(module):  # BLOOM's: its scores through the table's attention with the alibi flag
            plan.bindings[module_name] = (_alibi_attention_forward, {})
    for module_name, module in model.named_modules():
        norms = frozenset(name for name, child in module.named_children()
                          if plan.bindings.get(_child(module_name, name), (None,))[0] is _rms_forward)
        forward, fused = _fused_forward(_base_class(module), norms) if norms else (None, ())
        if forward is not None:  # with each fused norm's eps and offset, which _add_norm reads off the norm
            plan.layers[module_name] = (forward, {norm: plan.bindings[_child(module_name, norm)][1] for norm in fused})
    for module in modelling_modules(model):
        _plan_functions(module, plan, report)
    return plan


def _global(config, name: str):
    """config.name, or None where it is unset or differs by layer (a per-layer config raises for it,
    a RuntimeError: the QK-norm forward then finds the heads' axis without it)."""
    try:
        return getattr(config, name, None)
    except RuntimeError:
        return None


def _child(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _module_binding(module_name: str, module, kind: Kind, heads: dict) -> tuple:
    """((forward, attributes), None) for a module patch() serves, else (None, why it does not)."""
    if kind.op == "linear":
        if _base_class(module) is torch.nn.Linear:
            return (_linear_forward, {}), None
        if isinstance(module, torch.nn.Linear):
            return None, "a subclass of nn.Linear (quantized?): its forward is its own"
        return None, "stores its weight as (in, out) (Conv1D)"
    if kind.op == "norm.rms":
        role = module_name.rsplit(".", 1)[-1]
        attrs = {"eps": eps_of(module), "unit_offset": kind.unit_offset}
        if role in ("q_norm", "k_norm"):
            return (_qk_norm_forward, {**attrs, "heads": heads[role]}), None
        return (_rms_forward, attrs), None
    if kind.op == "norm.rms_gated":
        return (_rms_gated_forward, {"eps": eps_of(module), "heads": heads["linear_v"] or 1}), None
    if kind.op == "norm.layer":
        if getattr(module, "weight", None) is None:
            return None, "a LayerNorm without a weight"
        return (_layer_norm_forward, {"eps": eps_of(module)}), None
    if kind.op == "moe.experts":
        return (_experts_forward, {"kind": kind}), None
    if kind.op == "moe.prescaled":
        return (_prescaled_moe_forward, {"kind": kind}), None
    if kind.op == "moe.router":
        return (_router_forward, {"top_k": module.top_k, "renorm": kind.renorm, "float32_logits": kind.float32_logits,
                                  "float32_weights": kind.float32_weights}), None
    if kind.op == "act" and PLAIN_OPS.get(kind.act) == "act.gelu":
        return (_gelu_forward, {}), None
    if kind.op == "embedding":
        served, scale = _embedding_scale(module)
        if served:
            return (_embedding_forward, {"scale": scale}), None
        return None, "its forward is not weight[ids] times a constant (it renormalises rows, or its weight is not " \
                     "materialised)"
    return None, {"posenc.learned": "learned positions are left to torch",
                  "act": f"a {kind.act} activation outside a gated MLP: no op serves it"}.get(
                      kind.op, f"no serving forward for {kind.op}")


def _plan_functions(module, plan: _Plan, report: PatchReport) -> None:
    """The modelling module's functions the table may serve: RoPE (in a form an op computes, found by
    running it, once), and the Gated DeltaNet's conv and recurrence."""
    rope = getattr(module, "apply_rotary_pos_emb", None)
    if callable(rope):
        own = getattr(rope, "lzsolve_original", rope)
        layout = rope_layout(own)
        if layout is not None:
            plan.functions[(module, "apply_rotary_pos_emb")] = functools.partial(_rope_function, layout=layout)
        else:
            report.left[f"{module.__name__}.apply_rotary_pos_emb"] = "a RoPE form no op serves"
    for name, wrap in FUNCTIONS.items():
        if callable(getattr(module, name, None)):
            plan.functions[(module, name)] = wrap


class _Observer(Dispatcher):
    """The Dispatcher of a meta twin's run (_observe): it records, for each call, the signature and
    the module making it, and hands each call of Dispatcher.served back (NOT_SERVED), so that every
    patched forward also runs the code it falls back to, whose calls are recorded in turn (a fused add
    + norm's norm, an MLP's linears). Calls of the plain methods (attention) run the op's fallback."""

    def __init__(self):
        super().__init__(None)
        self.frames = [""]
        self.seen: dict[str, set[Signature]] = {}

    def _resolve(self, cache, key, call, op, kernel_args, hand_back=False):
        if call is not None:
            self.seen.setdefault(self.frames[-1], set()).add(call[0])
        if hand_back:
            return Entry(_hand_back, itertools.count(), op.name, OWN_CODE, False)
        spec, _, _ = self._choose(call, op, kernel_args)
        return Entry(spec.impl, itertools.count(), op.name, spec.kernel_id, False)


OBSERVER_NAME = "lzsolve_observe"  # the attention implementation a meta twin is observed through


class _ShapesOnly:
    """A meta twin's experts' own forward: an output of the right shape (their loop follows the routing's
    values, which meta tensors lack)."""

    def forward(self, hidden_states, *args, **kwargs):
        return torch.empty_like(hidden_states)


def observe(model) -> tuple[dict[str, set[Signature]], list[tuple[str, ...]]]:
    """What each module of `model` would call if patched (its op signatures, by module name; a
    modelling function's under the module calling it) and the sibling linears that read one tensor
    (q/k/v, gate/up), found on a meta twin of the model: what patch() serves or leaves is decided
    from this. Nothing of the model is changed."""
    return _observe(model, _plan(model, PatchReport()))


def _observe(model, plan: _Plan) -> tuple[dict[str, set[Signature]], list[tuple[str, ...]]]:
    """What each planned module of `model` calls, and which sibling linears read one tensor: found by
    running a meta twin of the model (built from its config, each weight in the model's dtype), served
    by `plan` and observed by an _Observer, for a short prefill and one decode step. Returns the
    signatures by calling module's name (functions under the module that calls them) and the
    sibling groups; raises what building or running the twin raised."""
    twin = meta_twin(model)
    observer, active = _Observer(), custom_ops.active()
    modules = dict(twin.named_modules())
    readers: dict[int, list[str]] = {}
    kept = []  # the linears' inputs, kept alive so that no two share an id

    def reader(module, args, name):
        if args:
            kept.append(args[0])
            readers.setdefault(id(args[0]), []).append(name)

    def leave(module, args, output) -> None:  # returns None: a forward hook's result would replace the output
        observer.frames.pop()

    with ExitStack() as stack, torch.no_grad():
        for name, (forward, attrs) in plan.bindings.items():
            if name in modules:
                _serve_with(modules[name], forward)
                _annotate(modules[name], own={}, **attrs)  # (the observer hands back without a counter)
        for name, (forward, _) in plan.layers.items():
            if name in modules:
                _serve_with(modules[name], forward)
        for name, module in modules.items():
            stack.callback(module.register_forward_pre_hook(lambda m, a, name=name: observer.frames.append(name)).remove)
            stack.callback(module.register_forward_hook(leave).remove)
            if _base_class(module) is torch.nn.Linear:
                stack.callback(module.register_forward_pre_hook(functools.partial(reader, name=name)).remove)
            if is_experts(module):  # their loop follows the routing's values, which meta tensors lack
                served = type(module) if name in plan.bindings else _serving_class(type(module), _ShapesOnly.forward)
                module.__class__ = type(served.__name__, (served,), {"_lzsolve_base": _ShapesOnly})
        stack.enter_context(meta_functions(twin))
        for (module, name), wrap in plan.functions.items():
            current = getattr(module, name)
            setattr(module, name, wrap(getattr(current, "lzsolve_original", current)))
            stack.callback(setattr, module, name, current)
        register(observer, OBSERVER_NAME)
        stack.callback(custom_ops.activate, active)
        set_attention(twin, OBSERVER_NAME)
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        # the calls the model makes outside an autocast: under one, every call is handed back
        # (_own_code_reason), and a patch made there would observe none and serve nothing
        for device_type in ("cpu", "cuda"):
            stack.enter_context(torch.autocast(device_type, enabled=False))
        ids = torch.zeros(1, 3, dtype=torch.long, device="meta")
        out = twin(input_ids=ids, use_cache=True)
        cache = getattr(out, "past_key_values", None)
        if cache is not None:  # one decode step over the prefill's cache (transformers 5.24 renamed the argument)
            argument = "cache" if "cache" in inspect.signature(twin.forward).parameters else "past_key_values"
            twin(input_ids=ids[:, :1], use_cache=True, **{argument: cache})
    return observer.seen, list(dict.fromkeys(sibling_groups(readers)))


def _fused_signature(linears, dtype: str) -> Signature | None:
    """The signature of the one GEMM sibling linears become, as linear_call names it."""
    first = linears[0]
    x = torch.empty(1, first.in_features, dtype=DTYPES[dtype], device="meta")
    weight = torch.empty(sum(m.out_features for m in linears), first.in_features, device="meta")
    call = linear_call(x, weight, None if first.bias is None else weight[:, 0])
    return call[0] if call else None


def _covered(model, plan: _Plan, seen: dict, groups: list, dispatcher: Dispatcher, report: PatchReport,
             attention_name: str = NAME) -> _Plan:
    """The part of `plan` the dispatcher serves: a module where it serves some call the twin saw the
    module make, a fused form where it serves the fused op, attention and each function where it
    serves one of their calls (attention of a model that ran eager only where no attention module
    reads its mask: _reads_the_mask). What is left is in the report, with why."""
    uncovered: dict[str, dict[str, str]] = {}  # class (or function) -> signature -> why

    def served(frame: str, label: str, op=None) -> bool:
        calls = [sig for sig in seen.get(frame, ()) if op is None or op(sig.op)]
        whys = {sig: dispatcher.uncovered(sig) for sig in calls}
        for sig, why in whys.items():
            if why is not None:
                uncovered.setdefault(label, {})[str(sig)] = why
        return any(why is None for why in whys.values())

    modules = dict(model.named_modules())
    kept = _Plan(attention=False)
    for name, binding in plan.bindings.items():
        if served(name, type(modules[name]).__name__):
            kept.bindings[name] = binding
    for name, layer in plan.layers.items():
        if served(name, f"{type(modules[name]).__name__} (residual add + norm)", lambda op: op == "norm.rms_add"):
            kept.layers[name] = layer
    for names in groups:
        first = seen.get(names[0], set())
        sig = _fused_signature([modules[n] for n in names], next(iter(first)).dtype) if first else None
        label = "+".join(n.rpartition(".")[2] for n in names) + " as one GEMM"
        if sig is not None:
            # served beyond the fallback, as a module is: one GEMM by the fallback was never timed against
            # the members' own GEMMs, and ran Gemma 3 slower, Llama 3 no faster (docs/benchmark-log.md §23)
            why = dispatcher.uncovered(sig)
            if why is None:
                kept.groups.append(names)
            else:
                uncovered.setdefault(label, {})[str(sig)] = why
    every = {sig for sigs in seen.values() for sig in sigs}
    attention = [sig for sig in every if sig.op.startswith("attention.")]
    kept.attention = any(dispatcher.covers(sig) for sig in attention)
    if attention and not kept.attention:
        uncovered["attention"] = {str(sig): dispatcher.uncovered(sig) for sig in attention}
    # (an attention module served whole, BLOOM's, reads no mask of ours: its forward is _alibi_attention_forward)
    readers = sorted({type(modules[frame]).__name__ for frame, sigs in seen.items()
                      if frame in modules and frame not in plan.bindings
                      and any(sig.op.startswith("attention.") for sig in sigs)
                      and _reads_the_mask(type(modules[frame]))})
    if kept.attention and readers and _ran_eager(model, attention_name):
        kept.attention = False
        report.left[readers[0]] = "reads its eager attention's mask, which a call the table serves goes without: " \
                                  "its attention as it was"
    for (module, name), wrap in plan.functions.items():
        calls = [sig for sig in every if sig.op == FUNCTION_OPS[name]]
        if any(dispatcher.covers(sig) for sig in calls):
            kept.functions[(module, name)] = wrap
        elif calls:
            uncovered[f"{module.__name__}.{name}"] = {str(sig): dispatcher.uncovered(sig) for sig in calls}
    for label, whys in uncovered.items():
        if label in report.left:
            continue
        sig, why = next(iter(sorted(whys.items())))
        more = f" (and {len(whys) - 1} more signatures)" if len(whys) > 1 else ""
        report.left[label] = f"{sig}: {why}{more}"
    return kept


def _nothing_served(model, dispatcher: Dispatcher) -> str | None:
    """Why the dispatcher serves no call of the model at all, if it serves none."""
    if dispatcher.policy.disable:
        return "policy: disabled (every call uses the fallback)"
    if dispatcher.table is None and not dispatcher.locks:
        return f"no table: {dispatcher.load_error}" if dispatcher.load_error else "no table (Dispatcher(None))"
    weight = next(model.parameters(), None)
    device = weight.device.type if weight is not None else "cpu"
    if dispatcher.device_type is not None and device != dispatcher.device_type:
        return f"the table was tuned on {dispatcher.device_type}, the model is on {device}"
    return None


def _apply(model, plan: _Plan, dispatcher: Dispatcher, name: str, report: PatchReport) -> None:
    """Serve `plan` in `model` from `dispatcher` (made the active one)."""
    modules = dict(model.named_modules())
    in_groups: set[str] = set()
    for names in plan.groups:
        linears = [modules[n] for n in names]
        if not _fusable(linears):
            continue
        siblings = _Siblings(linears)
        for index, linear in enumerate(linears):
            _bind(linear, _sibling_forward, report, siblings=siblings, index=index)
        report.fused["+".join(n.rpartition(".")[2] for n in names)] += 1
        in_groups.update(names)
    for module_name, (forward, attrs) in plan.bindings.items():
        if module_name not in in_groups:
            _bind(modules[module_name], forward, report, own=dispatcher.own_calls_memo(), **attrs)
    for module_name, (forward, norms) in plan.layers.items():
        for norm, attrs in norms.items():  # whether or not the norm is served alone, _add_norm reads these
            _annotate(modules[_child(module_name, norm)], **attrs)
            report.fused[f"residual add+{norm}"] += 1
        _bind(modules[module_name], forward, report)
    custom_ops.activate(dispatcher)
    if plan.attention:
        register(dispatcher, name)
        set_attention(model, name + EAGER if _ran_eager(model, name) else name)
    for (module, function), wrap in plan.functions.items():
        _replace(module, function, wrap, report)


def patch(model, dispatcher: Dispatcher, name: str = NAME, traced: bool = False, fuse: bool = True,
          all_ops: bool = False) -> PatchReport:
    """Serve each module of `model` whose calls the table serves from `dispatcher` (made the active
    one): attention (through register and attn_implementation `name`), RMSNorm, (1 + weight) RMSNorm,
    QK-norms, LayerNorm (with or without bias), RoPE (each modelling module's
    apply_rotary_pos_emb), gated MLPs (SwiGLU / GeGLU, fused gate_up too), tanh-GELU
    activations, token embeddings (with Gemma's scale), mixture-of-experts routers (softmax top-k)
    and experts (SwiGLU, as transformers stores them), Qwen3.5's linear attention (its conv1d, delta
    rules and gated norm), BLOOM's attention module (its scores by the attention op's alibi flag) and
    nn.Linear layers, lm_head included
    (its sliced input folded into one matrix); linears that read one tensor (q/k/v,
    gate/up) as one GEMM over their concatenated weights (their weights become views of it:
    patch after loading and moving the model, save before patching), and a decoder layer's residual
    add + norm as one call, where the table serves the fused op.

    What each module calls is found first, on a meta twin of the model (no memory, no weights): a
    module is replaced only where the table (or a policy lock) serves some of its calls, on the
    model's device. Everything else keeps its own forward; with no table at all, or one that failed
    to load, nothing is changed (one warning), and the report says what was left and why. A call
    of a replaced module that the table does not serve (past the tuned range, another dtype) runs the
    module's own forward, the code the unpatched model ran. Works eagerly and under
    torch.compile(fullgraph=True) (through torch.ops.lzsolve, whose calls outside the table take the
    op's fallback). The RoPE function is replaced in the modelling module, so other models of
    that module in this process call the dispatcher too (with the same results).

    all_ops=True replaces every module an op covers, served or not, and with no table too: for
    runtime_loader.record(), which then sees every call (while recording, a call outside the table
    takes the op's fallback, as what was recorded must be what runs); without a recording such calls
    run the modules' own code.

    traced=True: under torch.compile the table's calls are traced into the graph instead of staying
    opaque custom ops: the tree's choice is made while tracing (its thresholds become Dynamo
    guards) and Inductor sees the chosen kernel's torch ops (opaque custom ops kept the patched
    model slower compiled than eager on the H100, benchmarks/hf_end_to_end.py); calls the table does not
    serve trace the module's own code. Eager calls are the same.
    fuse (with traced=True): the modules and functions of ops whose torch form Inductor fuses with
    its neighbours (norms, activations, RoPE, the embedding: OpSchema.fusible) are left as they are,
    their own code in the graph (Dispatcher.uncovered: TRACED_FUSIBLE), and the table serves the rest
    (attention, linears, experts); with the table's kernels for them too, a compiled Llama ran 6-16%
    slower than compile alone (benchmarks/hf_end_to_end.py). fuse=False: the table's choice for every op."""
    if not isinstance(model, torch.nn.Module) or not isinstance(dispatcher, Dispatcher):
        raise TypeError(f"patch(model, dispatcher) got a {type(model).__name__} and a {type(dispatcher).__name__}: "
                        "pass the transformers model and runtime_loader.load(path) (or Dispatcher(None))")
    dispatcher.traced = traced
    dispatcher.traced_fuse = fuse
    report = PatchReport(table=dispatcher.table.source if dispatcher.table is not None else "none")
    nothing = None if all_ops else _nothing_served(model, dispatcher)
    if nothing is not None:
        report.table = nothing
        report.left["every module"] = f"{nothing}: the model runs as it was"
        warn(f"lzsolve: patch() changed nothing ({nothing}); the model runs as it was", stacklevel=2)
        return report
    try:
        plan = _plan(model, report)
    except Exception as e:  # noqa: BLE001 - a model of a form patch does not know: left whole, not broken
        why = f"its modules could not be planned ({type(e).__name__}: {str(e)[:200]})"
        report.left["every module"] = f"{why}; the model runs as it was"
        warn(f"lzsolve: patch() changed nothing: {why}", stacklevel=2)
        return report
    try:
        seen, plan.groups = _observe(model, plan)
    except Exception as e:  # noqa: BLE001 - a model whose twin cannot be built or run
        seen, why = None, f"a meta copy of the model did not run ({type(e).__name__}: {str(e)[:200]})"
        if not all_ops:
            report.left["every module"] = f"what its modules call is unknown: {why}; the model runs as it was"
            return report
        report.left["sibling linears"] = f"q/k/v and gate/up not fused: {why}"
    if not all_ops:
        plan = _covered(model, plan, seen, plan.groups, dispatcher, report, name)
    if not traced and (plan.bindings or plan.attention):  # a traced patch is for a compiled model, which a graph-mode table fits
        _warn_on_graph_table(dispatcher)
    _apply(model, plan, dispatcher, name, report)
    return report

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

import ast
import functools
import inspect
import sys
import textwrap
import types
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..dispatcher import Dispatcher
from .. import custom_ops
from ..kernels import eager
from .modules import (GATED_OPS, PLAIN_OPS, Kind, classify, eps_of, expert_parallel, experts_arguments, is_experts, modelling_modules,
                      own_parameters, read_together, rope_layout)

NAME = "lzsolve"


def table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs):
    """(causal, window, softcap, sinks, qk_norm) for a call the table serves, None for one it hands
    to SDPA (or, with attention sinks, to the eager reference): a padding mask, dropout, attention
    weights asked for, or a query that is neither a whole prefill nor one decode token."""
    seq_q, kv_len = query.shape[2], key.shape[2]
    sinks = kwargs.get("s_aux")  # GPT-OSS's attention sinks: one logit per q head
    simple = (attention_mask is None and dropout == 0.0 and not kwargs.get("output_attentions")
              and kwargs.get("position_bias") is None and kwargs.get("cache") is None
              and (sinks is None or isinstance(sinks, torch.Tensor) and sinks.shape == query.shape[1:2])
              and query.shape[1] % key.shape[1] == 0 and (seq_q == kv_len or seq_q == 1))
    if not simple:
        return None
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(is_causal) and seq_q > 1  # transformers' rule: a single query attends to every key
    qk_norm = getattr(module, "q_norm", None) is not None  # Qwen3 / Gemma 3: tuned as qk_norm signatures
    return causal, int(kwargs.get("sliding_window") or 0), float(kwargs.get("softcap") or 0.0), sinks, qk_norm


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    call = table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs)
    if call is None:
        if kwargs.get("s_aux") is not None:  # attention sinks, which SDPA cannot take: the model's own eager form,
            own = sys.modules[type(module).__module__].eager_attention_forward
            if attention_mask is not None and attention_mask.dtype == torch.bool:  # which adds its mask to the scores
                attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                    ~attention_mask, torch.finfo(query.dtype).min)
            return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal, window, softcap, sinks, qk_norm = call
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


def causal_or_sdpa_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """None for a causal mask (sliding or not) with no padding, whose last query is the last key:
    the attention call then says causal and window itself; sdpa's mask otherwise."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if mask_function is None:  # not `or`: Dynamo cannot take the truth of a closure (torch 2.11: a graph break)
        mask_function = causal_mask_function
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

    custom_ops.activate(dispatcher)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, causal_or_sdpa_mask)
    return name


# --- patch: every module the table serves ------------------------------------------------------------
# Forwards bound to module instances: each computes what the module's own forward computes
# (norms and activations were classified by running them; MLPs are checked by running both
# forwards once on the model's own weights), through the table.

def _rms_forward(self, x):
    return _ops().rms_norm(x, self.weight, self._lzsolve_eps, self._lzsolve_unit_offset)


def _rms_gated_forward(self, x, gate):
    """Qwen3.5's gated RMSNorm, weight * rms_norm(x) * silu(gate) over each value head's rows,
    as the table tuned it: the norm per row, then a SwiGLU per token over every head (gate, normed)."""
    normed = _ops().rms_norm(x, self.weight, self._lzsolve_eps, False)
    rows = (-1, x.shape[-1] * self._lzsolve_heads) if x.shape[0] % self._lzsolve_heads == 0 else x.shape
    return _ops().swiglu(gate.reshape(rows), normed.reshape(rows)).reshape(x.shape)


def _qk_norm_forward(self, x):
    # q_norm / k_norm: per head on (batch, seq, heads, d) (Qwen3) or on its transpose
    # (batch, heads, seq, d) (Gemma 3), the op's (..., heads, d) either way, so the signature
    # says heads as the tuned one does; over the whole projection (OLMo 2) on (..., d)
    eps, unit_offset = self._lzsolve_eps, self._lzsolve_unit_offset
    if x.shape[-1] != self.weight.shape[-1] or x.dim() != 4:
        return _ops().qk_norm(x.unsqueeze(-2), self.weight, eps, unit_offset).squeeze(-2)
    heads = self._lzsolve_heads
    if x.shape[1] == heads and (x.shape[2] != heads or x.stride(1) < x.stride(2)):
        return _ops().qk_norm(x.transpose(1, 2), self.weight, eps, unit_offset).transpose(1, 2)
    return _ops().qk_norm(x, self.weight, eps, unit_offset)


def _layer_norm_forward(self, x):
    # a LayerNorm without a bias may have no bias attribute at all (Cohere's)
    return _ops().layer_norm(x, self.weight, getattr(self, "bias", None), self._lzsolve_eps)


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


def _serves_rms(module) -> bool:
    """Whether patch() made `module` an RMSNorm the table serves (its forward is _rms_forward)."""
    return getattr(module.forward, "__func__", None) is _rms_forward


def _add_norm(norm, x, residual):
    """(norm(residual + x), residual + x): one norm.rms_add call where `norm` is an RMSNorm the patch
    serves and the table serves that call (a table tuned before the fusion has only the norm);
    else the add and the norm, as the layer's own lines did."""
    if _serves_rms(norm) and _served(
            "rms_norm_add", x, residual, norm.weight, norm._lzsolve_eps, norm._lzsolve_unit_offset, True):
        return _ops().rms_norm_add(x, residual, norm.weight, norm._lzsolve_eps, norm._lzsolve_unit_offset, True)
    total = residual + x
    return norm(total), total


def _add_norm_sites(body: list) -> list[tuple[int, str, str, str]]:
    """(index, hidden name, residual name, norm attribute) of each `h = r + h; r = h; h = self.<norm>(h)`
    in a list of statements (the sum either way round)."""
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
        if hidden not in terms or None in terms or terms[0] == terms[1]:
            continue
        residual = terms[1 - terms.index(hidden)]
        kept, total = assigned(body[i + 1])
        if kept != residual or name(total) != hidden:
            continue
        target, call = assigned(body[i + 2])
        if (target == hidden and isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords
                and name(call.args[0]) == hidden and isinstance(call.func, ast.Attribute)
                and name(call.func.value) == "self"):
            sites.append((i, hidden, residual, call.func.attr))
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
        for i, hidden, residual, norm in reversed(_add_norm_sites(body)):
            if norm not in self.norms:
                continue
            line = ast.parse(f"{hidden}, {residual} = {ADD_NORM}(self.{norm}, {hidden}, {residual})").body[0]
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
    return _ops().moe_experts(hidden_states, top_k_index, top_k_weights, *experts_arguments(self, self._lzsolve_kind))


def _router_forward(self, hidden_states):
    # the logits GEMM and the top-k choice through the table; each family's dtypes kept (Mixtral returns
    # float32 weights, Qwen casts them to the logits' dtype, GraniteMoE returns float32 logits)
    rows = hidden_states.reshape(-1, hidden_states.shape[-1])
    logits = _ops().linear(rows, self.weight, getattr(self, "bias", None))
    weights, ids = _ops().moe_router(logits, self._lzsolve_top_k, self._lzsolve_renorm)
    return (logits.float() if self._lzsolve_float32_logits else logits,
            weights if self._lzsolve_float32_weights else weights.to(rows.dtype), ids)


def _embedding_forward(self, ids):
    return _ops().embedding(ids, self.weight, self._lzsolve_scale)


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
        got = eager.embedding(ids, module.weight, scale)  # the op's definition, not a table's kernel
    return expected.shape == got.shape and bool(torch.equal(got, expected)), scale


def _linear(x, weight, bias):
    """The table's GEMM over x's rows, x folded to (tokens, k) first: F.linear on a 3-D slice whose
    rows are not one matrix (the lm_head's hidden[:, -1:]) runs a batched GEMM reading the weight
    once per batch row unless autograd makes it fold (Gemma 3's lm_head at batch 4: 1.86 against
    0.48 ms on the H100, BENCHMARKS §11.3); copying those few rows costs nothing."""
    out = _ops().linear(x.reshape(-1, x.shape[-1]), weight, bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def _linear_forward(self, x):
    return _linear(x, self.weight, self.bias)


class _Siblings:
    """Linears that read one tensor (q/k/v, gate/up) served as one GEMM over their
    concatenated weights, the GEMM the table tuned (capture fuses them the same way). The first
    member called computes every member's output; the others take theirs when they are called
    with that same tensor object, and compute the GEMM again otherwise (any order, any subset).
    The members' weights become views of the fused weight, so memory is not doubled; one whose
    storage has changed since (.to(), a new Parameter) makes the fused weight be built again."""

    def __init__(self, linears: list[torch.nn.Linear]):
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self.pending = None  # (input, taken per member, outputs per member)
        self._fuse()

    def _fuse(self) -> None:
        with torch.no_grad():
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
        pending = self.pending
        if pending is not None and pending[0] is x and not pending[1][index]:
            taken = tuple(done or i == index for i, done in enumerate(pending[1]))
            # once every member took its output, nothing holds the input or the outputs any longer
            self.pending = None if all(taken) else (x, taken, pending[2])
            return pending[2][index]
        if not torch.compiler.is_compiling() and self._pointers() != self.storage:
            self._fuse()
        outputs = _linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        self.pending = (x, tuple(i == index for i in range(len(self.sizes))), outputs)
        return outputs[index]


def _sibling_forward(self, x):
    return self._lzsolve_siblings.output(self._lzsolve_index, x)


def _fusable(linears) -> bool:
    first = linears[0]
    return all(_base_class(m) is torch.nn.Linear and m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
               and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)
               and not m.weight.is_meta for m in linears)


def _gelu_forward(self, x):
    return _ops().gelu(x)


def _gated_mlp_forward(self, x):
    gated = getattr(_ops(), self._lzsolve_gated)
    return self.down_proj(gated(self.gate_proj(x), self.up_proj(x)))


def _fused_gated_mlp_forward(self, x):  # Phi-3: one gate_up projection, halves gate and up
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(getattr(_ops(), self._lzsolve_gated)(gate, up))


def _rope_function(original, layout: str):
    interleaved, once = layout == "interleaved", layout == "split_half_once"

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        # the common form: q, k (batch, heads, seq, d), cos/sin (batch or 1, seq, d), unsqueezed at dim 1
        # (GPT-OSS's: (..., d / 2), each angle once, which the op takes twice)
        plain = (not args and kwargs.get("unsqueeze_dim", 1) == 1 and set(kwargs) <= {"unsqueeze_dim"}
                 and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and cos.shape[-1] << once == q.shape[-1])
        if not plain:
            return original(q, k, cos, sin, *args, **kwargs)
        if once:
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        return _ops().rope(q, k, cos, sin, interleaved)
    apply_rotary_pos_emb.lzsolve_original = original
    return apply_rotary_pos_emb


def _packed(kwargs: dict) -> bool:
    """Whether a call carries packed sequences (cu_seqlens, seq_idx): the ops take one sequence per
    batch row. Other keywords the model passes along (use_cache) change nothing."""
    return any(v is not None for k, v in kwargs.items() if "cu_seq" in k or "seq_idx" in k)


def _served(method: str, *args) -> bool:
    """Whether the active table serves this call (see Dispatcher.serves); always, while compiling
    (the choice is then the custom op's or the traced dispatcher's)."""
    return torch.compiler.is_compiling() or custom_ops.active().serves(method, *args)


def _deltanet_function(original):
    """torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule (Qwen3.5, Qwen3-Next): the
    op serves both (any chunk size computes the same); packed sequences and calls outside the
    table keep the original (transformers' choice: FLA's kernels where installed)."""
    def gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        if (cu_seqlens is not None or _packed(kwargs)
                or not _served("gated_deltanet", query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel)):
            return original(query, key, value, g=g, beta=beta, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            cu_seqlens=cu_seqlens, **kwargs)
        out, state = _ops().gated_deltanet(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel)
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
        if (activation not in (None, "silu", "swish") or _packed(kwargs) or weight.dim() != 2
                or not _served("causal_conv1d", x, weight, bias, None, silu)):
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        return _ops().causal_conv1d(x, weight, bias, None, silu)[0].transpose(1, 2)
    causal_conv1d_fn.lzsolve_original = original
    return causal_conv1d_fn


def _conv_update_function(original):
    """causal_conv1d_update (a decode step): the op rolls conv_state (a kernel may do it in place;
    else its new state is copied back, as the cache keeps that tensor)."""
    def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None):
        x, silu = hidden_states.transpose(1, 2), activation is not None
        if (activation not in (None, "silu", "swish") or weight.dim() != 2 or hidden_states.shape[-1] != 1
                or conv_state.shape[-1] != weight.shape[-1] or not _served("causal_conv1d", x, weight, bias,
                                                                           conv_state, silu)):
            return original(hidden_states, conv_state, weight, bias, activation)
        out, new_state = _ops().causal_conv1d(x, weight, bias, conv_state, silu)
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

    def __str__(self) -> str:
        lines = ["replaced: " + ", ".join(f"{name} x{n}" for name, n in sorted(self.replaced.items()))]
        if self.fused:
            lines.append("one GEMM: " + ", ".join(f"{name} x{n}" for name, n in sorted(self.fused.items())))
        lines += [f"left: {name}: {why}" for name, why in sorted(self.left.items())]
        return "\n".join(lines)


def _bind(module, forward, report: PatchReport, **attrs) -> None:
    for name, value in attrs.items():
        setattr(module, f"_lzsolve_{name}", value)
    _serve_with(module, forward)
    report.replaced[type(module).__name__] += 1


def _serve_with(module, forward) -> None:
    """Make `forward` the module's forward by giving the module a subclass of its class whose forward
    it is: under torch.compile, Dynamo guards a forward an instance holds itself on every call
    (about 100 guard lines a decoder layer, BENCHMARKS §11.9), a class's once with its type."""
    module.__class__ = _serving_class(_base_class(module), forward)


def _base_class(module) -> type:
    """The module's class before patch() gave it a serving subclass."""
    return type(module).__dict__.get("_lzsolve_base", type(module))


@functools.lru_cache(maxsize=None)
def _serving_class(cls: type, forward) -> type:
    return type(cls.__name__, (cls,), {"forward": forward, "_lzsolve_base": cls, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def _mlp_form(module, kinds: dict, name: str):
    """(forward, gated op) when the module is a gated MLP of a form we serve, else None."""
    act = kinds.get(f"{name}.act_fn") or kinds.get(f"{name}.activation_fn")
    if act is None or act.op != "act" or act.act not in GATED_OPS:
        return None
    gated = Dispatcher.METHODS[GATED_OPS[act.act]]  # act.swiglu -> swiglu, the method and the custom op
    if all(isinstance(getattr(module, a, None), torch.nn.Linear) for a in ("gate_proj", "up_proj", "down_proj")):
        return _gated_mlp_forward, gated
    if all(isinstance(getattr(module, a, None), torch.nn.Linear) for a in ("gate_up_proj", "down_proj")):
        return _fused_gated_mlp_forward, gated
    return None


def _same(module, forward, gated: str) -> bool:
    """Whether `forward` computes what the module's own forward does, on one token through the
    module's own weights (meta weights cannot be run: the form is trusted there)."""
    weight = next(module.parameters())
    if weight.is_meta:
        return True
    gen = torch.Generator(device=weight.device).manual_seed(0)  # the model's own random stream is left alone
    x = torch.randn(1, 1, weight.shape[-1], device=weight.device, dtype=weight.dtype, generator=gen)
    with torch.no_grad():
        expected = type(module).forward(module, x)
        module._lzsolve_gated = gated
        got = forward(module, x)
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


def _patch_functions(module, report: PatchReport) -> None:
    """The modelling module's functions the table serves: RoPE (in a form an op computes, found by
    running it, once), and the Gated DeltaNet's conv and recurrence."""
    rope = getattr(module, "apply_rotary_pos_emb", None)
    if callable(rope):
        patched = hasattr(rope, "lzsolve_original")
        layout = None if patched else rope_layout(rope)
        if patched or layout is not None:
            _replace(module, "apply_rotary_pos_emb", lambda original: _rope_function(original, layout), report)
        else:
            report.left[f"{module.__name__}.apply_rotary_pos_emb"] = "a RoPE form no op serves"
    for name, wrap in FUNCTIONS.items():
        if callable(getattr(module, name, None)):
            _replace(module, name, wrap, report)


def patch(model, dispatcher: Dispatcher, name: str = NAME, traced: bool = False, fuse: bool = True) -> PatchReport:
    """Serve every module of `model` the table covers from `dispatcher` (made the active one):
    attention (through register and attn_implementation `name`), RMSNorm, (1 + weight) RMSNorm,
    QK-norms, LayerNorm (with or without bias), RoPE (each modelling module's
    apply_rotary_pos_emb), gated MLPs (SwiGLU / GeGLU, fused gate_up too), tanh-GELU
    activations, token embeddings (with Gemma's scale), mixture-of-experts routers (softmax top-k)
    and experts (SwiGLU, as transformers stores them), Qwen3.5's linear attention (its conv1d, delta
    rules and gated norm; calls the table does not hold keep transformers' functions, which may be
    FLA's) and nn.Linear layers, lm_head included
    (its sliced input folded into one matrix); linears that read one tensor (q/k/v,
    gate/up) as one GEMM over their concatenated weights (their weights become views of it:
    patch after loading and moving the model, save before patching). Calls outside the table
    take each op's PyTorch fallback, which computes what the module did. Works eagerly and under
    torch.compile(fullgraph=True) (through torch.ops.lzsolve). Returns what it replaced and what
    it left, by class. The RoPE function is replaced in the modelling module, so other models of
    that module in this process call the dispatcher too (with the same results).

    traced=True: under torch.compile the table's calls are traced into the graph instead of staying
    opaque custom ops: the tree's choice is made while tracing (its thresholds become Dynamo
    guards) and Inductor sees the chosen kernel's torch ops (opaque custom ops kept the patched
    model slower compiled than eager on the H100, BENCHMARKS.md §11.4). Eager calls are the same.
    fuse (with traced=True): ops whose torch form Inductor fuses with its neighbours (norms,
    activations, RoPE, the embedding: OpSchema.fusible) keep that form in the graph, and the table
    serves the rest (attention, linears, experts); with the table's kernels for them too, a compiled
    Llama ran 6-16% slower than compile alone (§11.8). fuse=False: the table's choice for every op."""
    dispatcher.traced = traced
    dispatcher.traced_fuse = fuse
    register(dispatcher, name)
    report = PatchReport()
    model.set_attn_implementation(name)
    if not traced:  # a traced patch is for a compiled model, which a graph-mode table fits
        _warn_on_graph_table(dispatcher)
    kinds = classify(model)
    # activations inside a module served whole (a gated MLP, routed experts) are not served on their own
    mlp_parts: set[str] = {f"{module_name}.act_fn" for module_name, kind in kinds.items() if kind.op == "moe.experts"}
    for module_name, module in model.named_modules():
        form = _mlp_form(module, kinds, module_name)
        if form is None:
            continue
        forward, gated = form
        if _same(module, forward, gated):
            _bind(module, forward, report, gated=gated)
            mlp_parts.add(f"{module_name}.act_fn")
            mlp_parts.add(f"{module_name}.activation_fn")
        else:
            report.left[type(module).__name__] = "its forward is not down(act(gate(x)) * up(x))"
    text = model.config.get_text_config()
    heads = {"q_norm": getattr(text, "num_attention_heads", None),
             "k_norm": getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", None),
             "linear_v": getattr(text, "linear_num_value_heads", None)}  # the gated norm's heads (Qwen3.5)
    fused: set[str] = set()
    modules = dict(model.named_modules())
    try:
        groups = read_together(model)
    except Exception as e:  # noqa: BLE001 - a model we cannot twin keeps its linears separate, and says so
        groups = []
        report.left["sibling linears"] = (f"q/k/v and gate/up not fused: a meta copy of the model did not run "
                                          f"({type(e).__name__}: {e})")
    for names in groups:
        linears = [modules[name] for name in names]
        if _fusable(linears):
            siblings = _Siblings(linears)
            for index, (name, linear) in enumerate(zip(names, linears)):
                _bind(linear, _sibling_forward, report, siblings=siblings, index=index)
            report.fused["+".join(name.rpartition(".")[2] for name in names)] += 1
            fused.update(names)
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
        if kind is None or module_name in mlp_parts or module_name in fused:
            continue
        if kind.op == "linear":
            if _base_class(module) is torch.nn.Linear:
                _bind(module, _linear_forward, report)
            elif isinstance(module, torch.nn.Linear):
                report.left[cls] = "a subclass of nn.Linear (quantized?): its forward is its own"
            else:
                report.left[cls] = "stores its weight as (in, out) (Conv1D)"
        elif kind.op == "norm.rms":
            role = module_name.rsplit(".", 1)[-1]
            if role in ("q_norm", "k_norm"):
                _bind(module, _qk_norm_forward, report, eps=eps_of(module), unit_offset=kind.unit_offset,
                      heads=heads[role])
            else:
                _bind(module, _rms_forward, report, eps=eps_of(module), unit_offset=kind.unit_offset)
        elif kind.op == "norm.rms_gated":
            _bind(module, _rms_gated_forward, report, eps=eps_of(module), heads=heads["linear_v"] or 1)
        elif kind.op == "norm.layer":
            if getattr(module, "weight", None) is None:
                report.left[cls] = "a LayerNorm without a weight"
            else:
                _bind(module, _layer_norm_forward, report, eps=eps_of(module))
        elif kind.op == "moe.experts":
            _bind(module, _experts_forward, report, kind=kind)
        elif kind.op == "moe.router":
            _bind(module, _router_forward, report, top_k=module.top_k, renorm=kind.renorm,
                  float32_logits=kind.float32_logits, float32_weights=kind.float32_weights)
        elif kind.op == "act" and PLAIN_OPS.get(kind.act) == "act.gelu":
            _bind(module, _gelu_forward, report)
        elif kind.op == "embedding":
            served, scale = _embedding_scale(module)
            if served:
                _bind(module, _embedding_forward, report, scale=scale)
            else:
                report.left[cls] = "its forward is not weight[ids] times a constant (it renormalises rows, or " \
                                   "its weight is not materialised)"
        else:
            report.left[cls] = {"posenc.learned": "learned positions are left to torch",
                                "act": f"a {kind.act} activation outside a gated MLP: no op serves it"}.get(
                                    kind.op, f"no serving forward for {kind.op}")
    _fuse_residual_adds(model, report)
    for module in modelling_modules(model):
        _patch_functions(module, report)
    return report


def _fuse_residual_adds(model, report: PatchReport) -> None:
    """Decoder layers whose forward adds into the residual stream and norms the total with a norm
    served above: that forward, recompiled with the two as one call (see _add_norm)."""
    for module in model.modules():
        norms = frozenset(name for name, child in module.named_children()
                          if _serves_rms(child))
        forward, fused = _fused_forward(_base_class(module), norms) if norms else (None, ())
        if forward is not None:
            _bind(module, forward, report)
            for norm in fused:
                report.fused[f"residual add+{norm}"] += 1

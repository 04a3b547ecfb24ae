"""Capture: the ops a Hugging Face decoder runs, derived from the model itself.

The model is built by transformers from its config on the `meta` device (no weights, no
download) and run for a prefill and one decode step. What it computes is observed, not
described per family:

- modules are classified once per class by what they compute: linears (nn.Linear, Conv1D),
  embeddings, and norms and activations told apart by running a CPU copy on random inputs
  against each op's definition (so (1 + weight) norms, LayerNorm without a bias, tanh-GELU
  written out by hand are recognised whatever the class is called);
- a mixture-of-experts layer's routed experts (transformers' 3-D expert weights) are told
  apart the same way, and recorded instead of run: their eager loop depends on the routing's
  values, which meta tensors do not have;
- attention is observed through the same attention function the serving integration
  installs (`runtime_loader.integrations.transformers`), so capture and runtime derive the
  same signatures; RoPE through the modelling module's `apply_rotary_pos_emb`;
- a TorchDispatchMode sees the tensors flow between them, which gives the fusions servers
  run: sibling linears reading one tensor are one GEMM (q/k/v, gate/up), an activation
  whose output is multiplied by another tensor is a gated activation (SwiGLU, GeGLU), a
  norm whose input is a residual sum is the fused add + norm.

TP sharding is applied to the recorded signatures: a linear right after attention or an
activation is row-parallel (o_proj, down_proj), every other linear column-parallel; heads,
MLP widths and the vocab are divided. What no op covers is listed by module class with its
share of the parameters, never dropped silently.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import re
import warnings
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from lzsolve.errors import LzError
from lzsolve.limits import check_config_sizes, check_config_values
from lzsolve.models.catalogue import CATALOGUE
from lzsolve.models.config import fp8_scheme, read_config, refuse_unsupported
from runtime_loader.dtypes import DTYPES
from runtime_loader.integrations.modules import (
    GATED_OPS,
    META_FUNCTIONS,
    PLAIN_OPS,
    Kind,
    classify,
    experts_arguments,
    is_experts,
    modelling_modules,
    prescaled_arguments,
    rope_layout,
)
from runtime_loader.ops import Signature
from runtime_loader.ops.attention import attention_call
from runtime_loader.ops.base import rows_call
from runtime_loader.ops.conv import causal_conv1d_call
from runtime_loader.ops.embedding import embedding_call
from runtime_loader.ops.linear import linear_call
from runtime_loader.ops.moe import moe_experts_call, moe_router_call
from runtime_loader.ops.norm import qk_norm_call
from runtime_loader.ops.recurrent import deltanet_gates_call, gated_deltanet_call
from runtime_loader.ops.rope import rope_call
from runtime_loader.safeio import shown

# meta shapes: any sizes give the same signatures; odd ones, so a token count is never mistaken for a head count
BATCH, PREFILL_SEQ = 3, 7
NAME = "lzsolve_capture"

# notes on what is tuned but that patch() cannot reach (a server calling the Dispatcher can)
UNSERVED = "tuned, but runtime_loader's transformers integration cannot serve it"
ROW_PARALLEL_AFTER = ("attention", "act", "gate", "recurrent")  # a linear right after these reads sharded features
# multi-head latent attention (DeepSeek-V2/V3, lzsolve.models.config.MLA_TYPES): the projections down to
# the latents, replicated on every rank as servers hold them (vLLM's ReplicatedLinear: the kv latent and
# k's RoPE part are shared by every head), and the latents' RMSNorms, plain norm.rms, not q/k norms
MLA_DOWN_PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa")
MLA_LATENT_NORMS = ("q_a_layernorm", "kv_a_layernorm")


@dataclass(frozen=True)
class OpInstance:
    """One op signature a model runs: where it calls it and how often per forward pass."""
    signature: Signature
    roles: tuple[str, ...]  # the modules calling it, layer indices as *: "model.layers.*.self_attn", "lm_head"
    calls_per_forward: int


@dataclass(frozen=True)
class Captured:
    """A model as capture saw it: its op instances (per rank) and what no op covers."""
    name: str
    family: str  # the text model's model_type
    tp: int
    instances: tuple[OpInstance, ...]
    notes: tuple[str, ...]
    config_hash: str
    summary_line: str
    # the text model's, unsharded; None when no model was built (a recorded workload)
    layers: int | None = None
    parameters: int | None = None
    covered: float | None = None  # the share of the parameters held by modules an op covers

    def summary(self) -> str:
        return self.summary_line

    def sizes(self) -> dict[str, tuple[int, ...]]:
        """The model's sizes as its signatures show them, per rank, each the distinct values seen
        (more than one where layers differ): hidden and vocab from the embedding, heads ("hq",
        "hkv") and head dims ("d") from attention, the MLP width from the activations of modules
        named mlp (none for experts)."""
        def seen(op_prefix: str, dim: str, role_part: str = "") -> tuple[int, ...]:
            return tuple(sorted({i.signature.dim(dim) for i in self.instances if i.signature.op.startswith(op_prefix)
                                 and any(role_part in r for r in i.roles)}))
        return {"hidden": seen("embedding", "hidden"), "vocab": seen("embedding", "vocab"),
                "hq": seen("attention.prefill", "hq"), "hkv": seen("attention.prefill", "hkv"),
                "d": seen("attention.prefill", "d"), "mlp": seen("act.", "width", ".mlp.")}


# --- building the model ---------------------------------------------------------------------------

def text_config(cfg: dict, where: str):
    """The transformers config of the language model a config.json describes."""
    import transformers as tf
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise LzError(f"{where}: model_type {shown(model_type)} is not known to transformers {tf.__version__}; "
                      f"pass a Hugging Face config.json of a causal language model")
    try:
        with warnings.catch_warnings(), _quiet_transformers():
            warnings.simplefilter("ignore")
            config = CONFIG_MAPPING[model_type].from_dict(cfg)
            text = config.get_text_config(decoder=True)
    except Exception as e:  # noqa: BLE001 - transformers' own validation, in whatever form it takes
        raise LzError(f"{where}: transformers cannot read this config ({type(e).__name__}: {_one_line(e)}); "
                      "fix the config") from None
    if not isinstance(text, tf.PretrainedConfig):  # a text_config dict its model type has no class for
        raise LzError(f"{where}: 'text_config' is not a config transformers reads for model_type {shown(model_type)} "
                      "(it has no text model config of its own); put the text model's keys at the top level")
    if getattr(text, "per_layer_attributes", None):
        # layers that differ (Gemma 4's head_dim; transformers 5.2x): a read of the global value is
        # refused as ambiguous unless allowed. lzsolve reads it only to check sizes (which also take
        # each layer's, limits.py) and to shard heads; each layer's ops are what the capture observes.
        text.allow_global_per_layer_attribute_access = True
    if text.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise LzError(f"{where}: model_type {shown(text.model_type)} is not a causal language model in transformers "
                      f"{tf.__version__}; lzsolve tunes decoders")
    return text


# Defaults transformers' configs derive when a field is left out. A few default configs store None
# instead (ministral's head_dim, nemotron's num_key_value_heads), and their modules fail to build.
DERIVED_DEFAULTS = {
    "head_dim": ("hidden_size // num_attention_heads", lambda c: c.hidden_size // c.num_attention_heads),
    "num_key_value_heads": ("num_attention_heads", lambda c: c.num_attention_heads),
}


def fill_derived(text) -> list[str]:
    """Set the DERIVED_DEFAULTS fields the config holds as None; one note per field set."""
    notes = []
    for name, (rule, derive) in DERIVED_DEFAULTS.items():
        if name in text.to_dict() and getattr(text, name, 0) is None:
            setattr(text, name, derive(text))
            notes.append(f"{name} is null in the config: taken as {rule} = {getattr(text, name)}, "
                         "transformers' usual default")
    return notes


@contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def build_meta_model(text, dtype: str):
    """On the meta device, with the capture's attention function; a model that accepts only
    its own list of attention implementations (Falcon, GPT-J...) gets SDPA, observed at
    F.scaled_dot_product_attention."""
    from transformers import AutoModelForCausalLM
    _register_attention()
    with torch.device("meta"), warnings.catch_warnings(), _quiet_transformers():
        warnings.simplefilter("ignore")
        try:
            model = AutoModelForCausalLM.from_config(text, dtype=DTYPES[dtype], attn_implementation=NAME)
        except (KeyError, ValueError) as e:
            if NAME not in str(e):
                raise
            model = AutoModelForCausalLM.from_config(text, dtype=DTYPES[dtype], attn_implementation="sdpa")
    return model.eval()


# --- recording ----------------------------------------------------------------------------------

@dataclass
class Event:
    op: str
    module: str
    sig: Signature | None
    inputs: tuple = ()  # ids of the tensors read
    output: int = 0
    extra: dict = field(default_factory=dict)


class _Recorder(TorchDispatchMode):
    """Sees every aten op on the way: residual sums and products of activation outputs."""

    def __init__(self, tokens: int):
        super().__init__()
        self.tokens = tokens  # of the forward recorded
        self.events: list[Event] = []
        self.sums: set[int] = set()  # ids of tensors that are a + b of two same-shape tensors
        self.products: dict[int, int] = {}  # id of an activation output -> id of the tensor it multiplied
        self.product_results: dict[int, int] = {}  # id of an activation output -> id of that product
        self.keep: list = []  # tensors whose ids are recorded stay alive, so ids are never reused
        self.act_outputs: set[int] = set()
        self.sigmoids: set[int] = set()
        self.frames: list[str] = []
        self.opaque = 0  # > 0 inside a function recorded as one op: its aten ops are not looked at
        self.owners: dict[int, str] = {}  # id of a parameter -> the module holding it
        self.softplus: set[int] = set()  # ids of softplus outputs (Gated DeltaNet's decay gate)
        self.dtype = torch.bfloat16  # the model's activations (recording() sets it)

    def leave(self, module, args, output) -> None:  # a forward hook: returns None, so the output stands
        self.frames.pop()

    @property
    def frame(self) -> str:
        return self.frames[-1] if self.frames else ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.opaque:
            return out
        if func is torch.ops.aten.sigmoid.default:
            self.sigmoids.add(self.tensor(out))
        elif func is torch.ops.aten.softplus.default:
            self.softplus.add(self.tensor(out))
        elif func in (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor) and len(args) >= 2 and all(
                isinstance(a, torch.Tensor) and a.dim() >= 2 for a in args[:2]) and args[0].shape == args[1].shape:
            self.sums.add(id(out))
            self.keep.append(out)
        elif func in (torch.ops.aten.mul.Tensor,) and len(args) == 2 and all(isinstance(a, torch.Tensor) for a in args):
            for a, b in ((args[0], args[1]), (args[1], args[0])):
                if id(a) in self.act_outputs and b.shape == a.shape:
                    self.products[id(a)] = id(b)
                    self.product_results[id(a)] = self.tensor(out)
                if id(a) in self.sigmoids and b.shape == a.shape:  # x * sigmoid(gate): an output gate
                    self.events.append(Event("gate", self.frame, _sig(rows_call("act.sigmoid_gate", b))))
                if id(a) in self.softplus and b.dim() == 1:  # -exp(A_log) * softplus(a + dt_bias): the decay gate
                    x = a.new_empty(a.shape, dtype=self.dtype)  # a (and b) arrive in the activations' dtype
                    self.events.append(Event("gates", f"{self.frame}.gates", _sig(deltanet_gates_call(x, x))))
        return out

    def tensor(self, t) -> int:
        self.keep.append(t)
        return id(t)


_current: _Recorder | None = None


def _sig(call) -> Signature | None:
    """The signature of a runtime_loader.ops *_call result (None: no signature describes it)."""
    return call[0] if call else None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from runtime_loader.integrations import transformers as integration
    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, integration.causal_or_sdpa_mask)


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
               **kwargs):
    from runtime_loader.integrations.transformers import table_call
    call = table_call(module, query, key, value, attention_mask, dropout, is_causal, kwargs)
    if _current is not None:
        if call:  # scale: no part of it
            causal, window, softcap, sinks, qk_norm = call
            sig = _sig(attention_call(query, key, value, causal, None, window, softcap, sinks, qk_norm=qk_norm))
        else:
            sig = None
        _current.events.append(Event("attention", _current.frame, sig))
    out = query.new_empty((*query.shape[:-1], value.shape[-1]))
    return out.transpose(1, 2).contiguous(), None


def _alibi_recorded(q, k, v, causal, scale):
    """The attention call of an ALiBi attention module (BLOOM's), recorded with the alibi flag."""
    if _current is not None:
        _current.events.append(Event("attention", _current.frame, _sig(attention_call(q, k, v, causal, alibi=True))))
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def _alibi_attention_forward(self, hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
                             output_attentions=False, **kwargs):
    """BLOOM's attention on the meta model, as patch() serves it (alibi_attention): its attention call
    recorded with the alibi flag; a call patch() hands back to BLOOM's own forward is recorded as
    attention the table does not serve, and runs that forward."""
    from runtime_loader.integrations.transformers import alibi_attention
    out = alibi_attention(self, hidden_states, residual, attention_mask, layer_past, _alibi_recorded,
                          output_attentions, kwargs)
    if out is not None:
        return out
    if _current is not None:
        _current.events.append(Event("attention", _current.frame, None))
    return type(self).forward(self, hidden_states, residual, alibi, attention_mask, layer_past, use_cache,
                              output_attentions, **kwargs)


def _call_opaque(rec: _Recorder | None, fn, *args, **kwargs):
    """fn's result, its aten ops hidden from the recorder (it is recorded as one op)."""
    if rec is None:
        return fn(*args, **kwargs)
    rec.opaque += 1
    try:
        return fn(*args, **kwargs)
    finally:
        rec.opaque -= 1


def _rope_wrapper(original, served: bool = True):
    # split_half, interleaved (Cohere), split_half_once (GPT-OSS: cos/sin hold each angle once, half
    # the rotated width), or a form no op serves (GLM's); served=False: a function patch() does not
    # replace, whatever it computes (its calls are noted)
    layout = rope_layout(original) if served else None
    once = layout == "split_half_once"

    def apply_rotary_pos_emb(*args, **kwargs):
        rec = _current
        out = _call_opaque(rec, original, *args, **kwargs)
        if rec is None:
            return out
        # the common form, (q, k, cos, sin) -> (q, k); partial RoPE (Phi, StableLM, Qwen3.5) rotates
        # the first rotary_dim dims of each head. Other forms (CodeGen's per-tensor one) are noted.
        q, k, cos = (list(args) + [None] * 3)[:3]
        rotated = cos.shape[-1] << once if isinstance(cos, torch.Tensor) else None
        plain = (len(args) == 4 and not kwargs and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k))
                 and rotated is not None and rotated <= q.shape[-1] and layout is not None)
        sig = (_sig(rope_call(q[..., :rotated], k[..., :rotated], interleaved=layout == "interleaved")) if plain
               else None)
        extra = {"rotary_dim": rotated, "head_dim": q.shape[-1]} if plain else {}
        rec.events.append(Event("rope", rec.frame, sig, extra=extra))
        return out
    return apply_rotary_pos_emb


def _deltanet_wrapper(original):
    """Qwen3.5's Gated DeltaNet recurrence (chunked for prefill, recurrent for decode)."""
    def gated_delta_rule(query, key, value, *args, **kwargs):
        rec = _current
        out = _call_opaque(rec, original, query, key, value, *args, **kwargs)
        if rec is None:
            return out
        call = gated_deltanet_call(query, key, value, qk_l2norm=bool(kwargs.get("use_qk_l2norm_in_kernel", False)))
        rec.events.append(Event("recurrent", rec.frame, _sig(call)))
        return out
    return gated_delta_rule


def _conv_wrapper(original, update: bool = False):
    """Qwen3.5's short causal conv1d (causal_conv1d_fn over a prompt, causal_conv1d_update for a
    decode step), recorded as its conv1d module's op: hidden_states arrive as (batch, channels,
    seq), the conv's weight squeezed to (channels, width)."""
    def causal_conv1d(hidden_states, *args, **kwargs):
        rec = _current
        out = _call_opaque(rec, original, hidden_states, *args, **kwargs)
        if rec is None:
            return out
        bound = inspect.signature(original).bind(hidden_states, *args, **kwargs).arguments
        weight, state = bound.get("weight"), bound.get("conv_state") if update else None
        activation = bound.get("activation")
        call = causal_conv1d_call(hidden_states.transpose(1, 2), weight, bound.get("bias"), state,
                                  activation in ("silu", "swish")) if activation in (None, "silu", "swish") else None
        owner = rec.owners.get(id(weight._base if weight._base is not None else weight), rec.frame)
        rec.events.append(Event("conv", owner, _sig(call), extra={"activation": activation}))
        return out
    return causal_conv1d


def _sdpa_wrapper(original):
    """F.scaled_dot_product_attention called by the model's own code (it bypasses transformers'
    attention interface): a mask with as many queries as keys is taken as causal."""
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args,
                                     **kwargs):
        rec = _current
        if rec is not None and not rec.opaque:
            seq_q, kv_len = query.shape[-2], key.shape[-2]
            causal = bool(is_causal or (attn_mask is not None and seq_q == kv_len)) and seq_q > 1
            sig = _sig(attention_call(query, key, value, causal)) if query.dim() == 4 else None
            rec.events.append(Event("attention", rec.frame, sig, extra={"bypass": True}))
        return original(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)
    return scaled_dot_product_attention


WRAPPED = {"apply_rotary_pos_emb": _rope_wrapper,
           # DeepSeek's RoPE forms no op computes: V2's complex product with freqs_cis, V3's de-interleaving
           # one (rope_interleave); recorded so that a note names them (V3 without it calls apply_rotary_pos_emb)
           "apply_rotary_emb": lambda original: _rope_wrapper(original, served=False),
           "apply_rotary_pos_emb_interleave": lambda original: _rope_wrapper(original, served=False),
           "torch_chunk_gated_delta_rule": _deltanet_wrapper,
           "torch_recurrent_gated_delta_rule": _deltanet_wrapper, "causal_conv1d_fn": _conv_wrapper,
           "causal_conv1d_update": functools.partial(_conv_wrapper, update=True)}


def _experts_forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
    """An experts module of the meta model: recorded (moe.experts when it computes it), not run."""
    rec = _current
    if rec is not None and not rec.opaque:
        kind = self._lzsolve_kind
        sig = _sig(moe_experts_call(hidden_states, top_k_index, top_k_weights, *experts_arguments(self, kind))) \
            if kind is not None and kind.op == "moe.experts" else None
        rec.events.append(Event("moe", rec.frame, sig))
    return torch.empty_like(hidden_states)


def _prescaled_experts_forward(self, hidden_states, *args, **kwargs):
    """The experts of a moe.prescaled layer (Llama 4's) on the meta model: recorded as patch() serves
    them, moe.experts over each token's top_k rows as one choice each, not run."""
    rec = _current
    if rec is not None and not rec.opaque:
        rows = hidden_states.shape[0] // self.gate_up_proj.shape[0] * self._lzsolve_top_k
        x = hidden_states.new_empty((rows, hidden_states.shape[-1]))
        ids = torch.empty((rows, 1), dtype=torch.long, device=x.device)
        call = moe_experts_call(x, ids, x.new_empty((rows, 1)), *prescaled_arguments(self, self._lzsolve_kind))
        rec.events.append(Event("moe", rec.frame, _sig(call), extra={"prescaled": self._lzsolve_top_k}))
    return torch.empty_like(hidden_states)


def _hooks(model, kinds: dict[str, Kind], rec: _Recorder, stack: ExitStack) -> None:
    from runtime_loader.integrations.transformers import is_alibi_attention
    for name, module in model.named_modules():
        rec.owners.update((id(p), name) for p in module.parameters(recurse=False))
        if is_alibi_attention(module):
            module.forward = _alibi_attention_forward.__get__(module)
            stack.callback(module.__dict__.pop, "forward")
        if is_experts(module):
            module._lzsolve_kind = kinds.get(name)
            module.forward = _experts_forward.__get__(module)
            stack.callback(module.__dict__.pop, "forward")
        if kinds.get(name) is not None and kinds[name].op == "moe.prescaled":
            experts = module.experts
            experts._lzsolve_kind, experts._lzsolve_top_k = kinds[name], module.router.top_k
            experts.forward = _prescaled_experts_forward.__get__(experts)
            stack.callback(experts.__dict__.pop, "forward")
        stack.callback(module.register_forward_pre_hook(lambda m, a, name=name: rec.frames.append(name)).remove)
        stack.callback(module.register_forward_hook(rec.leave).remove)
        if name in kinds:
            stack.callback(module.register_forward_hook(_observer(name, kinds[name], rec)).remove)
    stack.callback(setattr, F, "scaled_dot_product_attention", F.scaled_dot_product_attention)
    F.scaled_dot_product_attention = _sdpa_wrapper(F.scaled_dot_product_attention)
    # functions of the modelling modules, not modules: wrapped for the capture only (those a kernel
    # library may back run as shape-only stand-ins: the model is on the meta device)
    for mod in modelling_modules(model):
        for fn_name, wrap in WRAPPED.items():
            original = getattr(mod, fn_name, None)
            if callable(original):
                setattr(mod, fn_name, wrap(META_FUNCTIONS.get(fn_name, original)))
                stack.callback(setattr, mod, fn_name, original)


def _observer(name: str, kind: Kind, rec: _Recorder):
    def observe(module, args, output):
        x = args[0] if args else None
        if kind.op == "moe.router" and isinstance(x, torch.Tensor):
            # its logits GEMM (replicated on every rank: the router sees all experts) and the top-k choice,
            # both in the activations' dtype, as patch() serves them
            rows = x.reshape(-1, x.shape[-1])
            logits = rows.new_empty((rows.shape[0], module.weight.shape[0]))
            rec.events.append(Event("router", name, _sig(linear_call(rows, module.weight, getattr(module, "bias", None))),
                                    extra={"replicated": True}))
            rec.events.append(Event("routing", name, _sig(moe_router_call(logits, module.top_k, kind.renorm))))
            return
        if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
            return
        if kind.op == "linear":
            weight = module.weight if isinstance(module, torch.nn.Linear) else module.weight.T  # Conv1D: (k, n)
            sig = _sig(linear_call(x, weight, module.bias))
            replicated = {"replicated": True} if name.rsplit(".", 1)[-1] in MLA_DOWN_PROJECTIONS else {}
            rec.events.append(Event("linear", name, sig, (rec.tensor(x),), rec.tensor(output), replicated))
        elif kind.op == "embedding":
            scale = 1.0 if kind.scale else None
            sig = _sig(embedding_call(x, module.weight, scale))
            rec.events.append(Event("embedding", name, sig, (), rec.tensor(output)))
        elif kind.op == "posenc.learned":
            rec.events.append(Event(kind.op, name, _sig(rows_call(kind.op, output)), (), rec.tensor(output)))
        elif kind.op.startswith("norm"):
            rec.events.append(Event(kind.op, name, None, (rec.tensor(x),), rec.tensor(output),
                                    {"x": x, "unit_offset": kind.unit_offset,
                                     "no_bias": getattr(module, "bias", None) is None}))
        elif kind.op == "act":
            rec.act_outputs.add(rec.tensor(output))
            rec.events.append(Event("act", name, None, (rec.tensor(x),), id(output), {"x": x, "act": kind.act}))
    return observe


@contextmanager
def recording(model, kinds, tokens: int):
    global _current
    rec = _Recorder(tokens)
    rec.dtype = next(model.parameters()).dtype
    with ExitStack() as stack:
        _hooks(model, kinds, rec, stack)
        _current = rec
        try:
            with rec:
                yield rec
        finally:
            _current = None


def run(model, kinds: dict[str, Kind]) -> tuple[list[Event], list[Event]]:
    """The events of a prefill (BATCH x PREFILL_SEQ) and of one decode step after it."""
    ids = torch.zeros(BATCH, PREFILL_SEQ, dtype=torch.long, device="meta")
    with torch.no_grad(), warnings.catch_warnings(), _quiet_transformers():
        warnings.simplefilter("ignore")
        with recording(model, kinds, BATCH * PREFILL_SEQ) as prefill:
            out = model(input_ids=ids, use_cache=True)
        step = torch.zeros(BATCH, 1, dtype=torch.long, device="meta")
        with recording(model, kinds, BATCH) as decode:
            model(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
    return _resolve(prefill), _resolve(decode)


# --- from events to op instances -----------------------------------------------------------------

def _resolve(rec: _Recorder) -> list[Event]:
    """Fusions and signatures: gated activations, add + norm, sibling linears into one GEMM,
    norms inside attention modules as per-head (q/k) norms."""
    attention_modules = {e.module for e in rec.events if e.op == "attention"}
    out: list[Event] = []
    for e in rec.events:
        if e.op == "act":
            x, gated = e.extra["x"], e.output in rec.products
            op = (GATED_OPS if gated else PLAIN_OPS).get(e.extra["act"])
            # a gated op's output is the product, what the next linear reads
            e = replace(e, sig=_sig(rows_call(op, x)) if op else None, extra={**e.extra, "gated": gated},
                        output=rec.product_results[e.output] if gated else e.output)
        elif e.op == "norm.rms_gated":  # walked as a norm per row, then a SwiGLU per token with the gate
            x = e.extra["x"]
            out.append(replace(e, op="norm.rms", sig=_sig(rows_call("norm.rms", x))))
            e = replace(e, op="act", sig=_sig(rows_call("act.swiglu", x.reshape(rec.tokens, -1))))
        elif e.op.startswith("norm"):
            x = e.extra["x"]
            parent = e.module.rsplit(".", 1)[0]
            latent = e.module.rsplit(".", 1)[-1] in MLA_LATENT_NORMS  # MLA's: rows of a latent, not heads
            if parent in attention_modules and e.op == "norm.rms" and x.dim() >= 3 and not latent:
                # per-head rows in whatever layout the model keeps q and k: heads = elements per token / d
                per_token = x.reshape(rec.tokens, -1, x.shape[-1])
                e = replace(e, op="norm.qk", sig=_sig(qk_norm_call(per_token, unit_offset=e.extra["unit_offset"])))
            elif e.op == "norm.rms":
                op = "norm.rms_add" if e.inputs[0] in rec.sums else "norm.rms"
                flags = ("unit_offset",) if e.extra["unit_offset"] else ()
                e = replace(e, op=op, sig=_sig(rows_call(op, x, flags)))
            else:
                e = replace(e, sig=_sig(rows_call("norm.layer", x, ("no_bias",) if e.extra["no_bias"] else ())),
                            extra={**e.extra, "after_sum": e.inputs[0] in rec.sums})
        elif e.op == "linear" and (i := _sibling(out, e)) is not None:
            first = out[i]  # one GEMM over the concatenated weights, as servers run q/k/v and gate/up
            fused = Signature.make("linear", {**dict(first.sig.static), "n": first.sig.dim("n") + e.sig.dim("n")},
                                   first.sig.flags, first.sig.dtype)
            parts = first.extra.get("parts", (first.sig.dim("n"),)) + (e.sig.dim("n"),)  # for _replicated_kv
            # which parts every rank holds whole (MLA's kv_a_proj_with_mqa beside a column-parallel q_proj)
            whole = first.extra.get("whole", (bool(first.extra.get("replicated")),)) + (bool(e.extra.get("replicated")),)
            out[i] = replace(first, sig=fused, module=first.module + "+" + e.module.rsplit(".", 1)[1],
                             extra={**first.extra, "parts": parts, "whole": whole, "replicated": all(whole)})
            continue
        out.append(e)
    return out


def _sibling(events: list[Event], linear: Event) -> int | None:
    """The index of an earlier linear of the same parent module that read the same tensor."""
    parent = linear.module.rsplit(".", 1)[0]
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if (e.op == "linear" and e.inputs == linear.inputs and e.module.rsplit(".", 1)[0] == parent
                and e.sig is not None and linear.sig is not None and e.sig.flags == linear.sig.flags):
            return i
    return None


def _role(module: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".*", module)


def _shard(sig: Signature, tp: int, row_parallel: bool, lm_head: bool, ep: int = 1) -> Signature:
    if tp == 1 and ep == 1:
        return sig
    s = dict(sig.static)
    for key in ("hq", "hkv", "heads", "hk", "hv"):
        if key in s:
            s[key] = max(1, s[key] // tp)
    if sig.op.startswith("act."):
        s["width"] //= tp
    if sig.op == "moe.experts" and ep > 1:  # a rank holds whole experts, 1/ep of them
        s["experts"] //= ep
        s["ep"] = ep
    elif sig.op == "moe.experts":  # every rank holds every expert, with its share of each one's width
        s["inter"] //= tp
    if sig.op == "conv.causal_depthwise":  # its channels are q, k and v of the rank's heads
        s["channels"] //= tp
    if sig.op == "embedding":
        s["vocab"] = -(-s["vocab"] // tp)
    # a width tp does not divide (Qwen2-MoE's one-column shared expert gate) is replicated
    if sig.op in ("linear", "linear.fp8", "linear.fp8_prequantised"):
        if lm_head:
            s["n"] = -(-s["n"] // tp)
        elif row_parallel:
            s["k"] = s["k"] // tp if s["k"] % tp == 0 else s["k"]
        else:
            s["n"] = s["n"] // tp if s["n"] % tp == 0 else s["n"]
    return Signature.make(sig.op, s, sig.flags, sig.dtype)


def _heads_problem(hq: int, hkv: int, tp: int) -> str | None:
    """Why `tp` ranks cannot share these attention heads (kv heads may be replicated), or None."""
    return f"{hq}/{hkv} attention/kv heads" if hq % tp or (hkv % tp and tp % hkv) else None


def _check_heads(text, tp: int, where: str) -> None:
    """--tp against the config's heads, before the model is built and run (seconds): _check_tp checks
    every captured width again, these heads included, as the attention calls have them."""
    hq = getattr(text, "num_attention_heads", None)
    hkv = getattr(text, "num_key_value_heads", None) or hq
    problem = _heads_problem(hq, hkv, tp) if isinstance(hq, int) and isinstance(hkv, int) else None
    if problem:
        raise LzError(f"--tp {tp} cannot shard {where}: it does not divide {problem}")


def _replicated_kv(e: Event, sig: Signature, heads: tuple[int, int, int] | None, tp: int) -> Signature:
    """A column-parallel linear of an attention module (heads: its hq, hkv and d) once tp exceeds its
    kv heads: every rank holds one whole kv head (attention's hkv says so), so the k and v parts of
    the GEMM keep one head's width while the q part is divided. The parts are the fused siblings'
    widths, or q, k and v of one module whose width is theirs together (Phi-3's qkv_proj)."""
    if heads is None or heads[1] >= tp:
        return sig
    hq, hkv, d = heads
    n = e.sig.dim("n")
    parts = e.extra.get("parts") or ((hq * d, hkv * d, hkv * d) if n == (hq + 2 * hkv) * d else (n,))
    if hkv * d not in parts:
        return sig
    width = sum(d if part == hkv * d else part // tp for part in parts)
    return Signature.make(sig.op, {**dict(sig.static), "n": width}, sig.flags, sig.dtype)


def _partly_replicated(e: Event, sig: Signature, tp: int) -> Signature:
    """Fused sibling linears of which some are replicated and some column-parallel (MLA without a q
    latent, DeepSeek-V2-Lite: q_proj beside kv_a_proj_with_mqa): the rank's GEMM holds the replicated
    parts whole and its share of the others."""
    whole = e.extra.get("whole", ())
    if tp == 1 or not any(whole) or all(whole):
        return sig
    width = sum(part if kept else part // tp for part, kept in zip(e.extra["parts"], whole))
    return Signature.make(sig.op, {**dict(sig.static), "n": width}, sig.flags, sig.dtype)


def _check_tp(events: list[Event], tp: int, where: str, ep: int = 1) -> None:
    _check_ep(events, tp, where, ep)
    problems = []
    for e in events:
        if e.sig is None:
            continue
        s = dict(e.sig.static)
        if e.op == "attention" and _heads_problem(s["hq"], s["hkv"], tp):
            problems.append(_heads_problem(s["hq"], s["hkv"], tp))
        if e.op == "attention" and tp > 1 and "alibi" in e.sig.flags:
            raise LzError(f"{where}: not supported yet: ALiBi attention under --tp {tp} (the alibi flag takes its "
                          f"slopes from the head count a call has, a rank's share, not the model's)")
        if e.sig.op.startswith("act.") and s["width"] % tp:
            problems.append(f"MLP width {s['width']}")
        if e.sig.op == "moe.experts" and ep == 1 and s["inter"] % tp:
            problems.append(f"expert width {s['inter']}")
        if e.sig.op == "conv.causal_depthwise" and s["channels"] % tp:
            problems.append(f"conv1d channels {s['channels']}")
        if e.sig.op == "recurrent.gated_deltanet" and (s["hk"] % tp or s["hv"] % tp):
            # divided, never replicated as kv heads are: its conv1d and projections are sharded with them
            problems.append(f"{s['hk']}/{s['hv']} linear-attention key/value heads")
    if problems:
        raise LzError(f"--tp {tp} cannot shard {where}: it does not divide {', '.join(sorted(set(problems)))}")


def _check_ep(events: list[Event], tp: int, where: str, ep: int) -> None:
    """Expert parallelism as transformers and vLLM serve it: the experts divided over the ranks of
    the tensor-parallel group (ep = tp), or over those of several data-parallel replicas of it (a
    multiple of tp) whose batches each rank's experts then all see."""
    if ep < 1:
        raise LzError(f"--ep must be >= 1, got {ep}")
    if ep == 1:
        return
    if ep % tp:
        raise LzError(f"--ep {ep} is not a multiple of --tp {tp}: the experts are divided over the tensor-parallel "
                      f"group (--ep {tp}) or over data-parallel replicas of it (--ep {2 * tp}, ...)")
    experts = {e.sig.dim("experts") for e in events if e.sig is not None and e.sig.op == "moe.experts"}
    if not experts:
        raise LzError(f"--ep {ep}: {where} has no routed experts to divide; leave --ep out")
    uneven = sorted(n for n in experts if n % ep)
    if uneven:
        raise LzError(f"--ep {ep} cannot divide {where}'s {', '.join(map(str, uneven))} experts; use a divisor of them")


def instances(prefill: list[Event], decode: list[Event], tp: int, ep: int = 1) -> list[OpInstance]:
    """One OpInstance per distinct (sharded) signature, in the order the forward pass meets them;
    calls per forward from the prefill, decode attention from the decode step."""
    merged: dict[Signature, tuple[list[str], int]] = {}
    last_linear = max((i for i, e in enumerate(prefill) if e.op == "linear"), default=-1)
    heads = {e.module: tuple(e.sig.dim(d) for d in ("hq", "hkv", "d"))
             for e in prefill if e.op == "attention" and e.sig is not None}

    def add(e: Event, row_parallel: bool, lm_head: bool):
        sig = _shard(e.sig, 1 if e.extra.get("replicated") else tp, row_parallel, lm_head, ep)
        if e.op == "linear" and not (row_parallel or lm_head):
            sig = _replicated_kv(e, sig, heads.get(e.module.rsplit(".", 1)[0]), tp)
            sig = _partly_replicated(e, sig, tp)
        roles, count = merged.get(sig, ([], 0))
        role = _role(e.module)
        merged[sig] = (roles if role in roles else roles + [role], count + 1)

    previous = ""
    for i, e in enumerate(prefill):
        if e.sig is not None:
            add(e, previous in ROW_PARALLEL_AFTER, i == last_linear)
        previous = e.op
    for e in decode:
        if e.op == "attention" and e.sig is not None:
            add(e, False, False)
    return [OpInstance(sig, tuple(roles), count) for sig, (roles, count) in merged.items()]


def _covered(model, prefill: list[Event]) -> tuple[set[str], set[int]]:
    """The modules an op's event came from, and the ids of the parameters they hold."""
    seen = {part for e in prefill if e.sig is not None for part in _fused_names(e.module)}
    return seen, {id(p) for n, m in model.named_modules() if n in seen for p in m.parameters(recurse=False)}


def covered_share(model, prefill: list[Event]) -> float:
    """The share of the model's parameters held by modules an op covers."""
    _, covered_params = _covered(model, prefill)
    params = list(model.parameters())
    return sum(p.numel() for p in params if id(p) in covered_params) / (sum(p.numel() for p in params) or 1)


def uncovered(model, prefill: list[Event]) -> list[str]:
    """What the model computes that no op covers, one line each: modules no event came from
    (by class, with their share of the parameters), and observed calls no signature describes."""
    total = sum(p.numel() for p in model.parameters()) or 1
    seen, covered_params = _covered(model, prefill)
    by_class: Counter = Counter()
    params: Counter = Counter()
    where: dict[str, str] = {}
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in covered_params]
        if own and name not in seen:
            cls = type(module).__name__
            by_class[cls] += 1
            params[cls] += sum(p.numel() for p in own)
            where.setdefault(cls, _role(name))
    notes = [f"{where[cls]}: {cls} ({n} module(s), {100 * params[cls] / total:.1f}% of the parameters): "
             f"no op covers it" for cls, n in by_class.most_common()]
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # applied to the lm_head's output by the model's own forward (Gemma 2, Gemma 3...)
        notes.append(f"lm_head: the final logit softcap ({cap:g} * tanh(logits / {cap:g})): elementwise, "
                     f"no op covers it")
    unfused = sum(1 for e in prefill if e.op == "norm.layer" and e.extra.get("after_sum"))
    if unfused:
        notes.append(f"the residual adds before LayerNorm ({unfused} per forward): elementwise, no norm.layer op "
                     f"fuses them")
    for e in prefill:
        if e.op == "act" and e.sig is None:
            form = "gated " if e.extra.get("gated") else ""
            notes.append(f"{_role(e.module)}: {form}{e.extra['act']} activation: no op computes it")
        if e.op == "rope" and e.sig is None:
            notes.append(f"{_role(e.module)}: rotary embedding in a form no op computes")
        if e.op == "attention" and e.sig is None:
            notes.append(f"{_role(e.module)}: attention with options the table does not serve")
        if e.op == "gates" and e.sig is not None:
            notes.append(f"{_role(e.module)}: {UNSERVED}: {e.sig.op} is computed inside the module's own forward")
        if e.op == "conv" and e.sig is None:
            notes.append(f"{_role(e.module)}: causal conv1d with a {e.extra['activation']} activation: no op computes it")
        if e.op == "moe" and e.extra.get("prescaled"):
            notes.append(f"{_role(e.module.rpartition('.')[0])}: routed experts whose input rows are scaled by the "
                         f"router's weights (Llama 4's): "
                         f"tuned as moe.experts over each token's {e.extra['prescaled']} scaled row(s), one expert "
                         f"and weight 1 each; the routing (sigmoid of the top-k logits) runs as torch ops")
        if e.op == "moe" and e.sig is None:
            notes.append(f"{_role(e.module)}: experts in a form no op computes (an activation other than SwiGLU "
                         f"or GPT-OSS's, one bias without the other): not tuned")
        if e.op == "attention" and e.extra.get("bypass"):
            notes.append(f"{_role(e.module)}: {UNSERVED}: it calls F.scaled_dot_product_attention itself, not "
                         f"transformers' attention interface")
    return list(dict.fromkeys(notes))


def _ignored(module: str, patterns: tuple[str, ...]) -> bool:
    """A module a quantization_config leaves unquantised: by name, by a trailing part of it, or by a
    "re:" regular expression (compressed-tensors' form)."""
    return any(re.fullmatch(p[3:], module) if p.startswith("re:") else module == p or module.endswith("." + p)
               for p in patterns)


def fp8_linears(events: list[Event], granularity: str, ignored: tuple[str, ...]) -> list[Event]:
    """The linears an FP8 W8A8 checkpoint quantises, as linear.fp8 (the same dims and bias; per_channel
    when its weight scales are); those it leaves (lm_head, usually) stay linear."""
    out = []
    for e in events:
        if e.op == "linear" and e.sig is not None and not any(_ignored(m, ignored) for m in _fused_names(e.module)):
            flags = e.sig.flags | ({"per_channel"} if granularity == "per_channel" else set())
            e = replace(e, sig=Signature.make("linear.fp8", dict(e.sig.static), tuple(flags), e.sig.dtype))
        out.append(e)
    return out


QUANTISING = {"norm.rms": "norm.rms_fp8", "norm.rms_add": "norm.rms_add_fp8", "act.swiglu": "act.swiglu_fp8"}


def quantised_before(events: list[Event]) -> list[Event]:
    """Where an RMSNorm's or a SwiGLU's output is read by FP8 linears alone (q/k/v after
    input_layernorm, gate/up after post_attention_layernorm, down_proj after the SwiGLU), that op
    quantises it in its own pass (norm.rms_fp8, act.swiglu_fp8) and the linears take it quantised
    (linear.fp8_prequantised), as servers fuse them: a linear.fp8 reads its bf16 input once more
    to quantise it. An op whose output anything else reads stays."""
    readers: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        for tensor in e.inputs:
            readers.setdefault(tensor, []).append(i)
    out = list(events)
    for i, e in enumerate(events):
        fed = readers.get(e.output, []) if e.output else []
        if (e.sig is None or e.sig.op not in QUANTISING or not fed
                or not all(events[j].sig is not None and events[j].sig.op == "linear.fp8" for j in fed)):
            continue
        out[i] = replace(e, sig=Signature.make(QUANTISING[e.sig.op], dict(e.sig.static), e.sig.flags, e.sig.dtype))
        for j in fed:
            s = events[j].sig
            out[j] = replace(events[j], sig=Signature.make("linear.fp8_prequantised", dict(s.static), s.flags, s.dtype))
    return out


def _fused_names(module: str) -> list[str]:
    head, _, tail = module.rpartition(".")
    parts = tail.split("+")
    return [f"{head}.{p}" if head else p for p in parts]


def _one_line(e: Exception) -> str:
    """An exception's message on one line (transformers' validation errors span several)."""
    return " ".join(str(e).split())[:300]


def _outside_text_model(cfg: dict, text) -> list[str]:
    notes = []
    if isinstance(cfg.get("vision_config"), dict):
        notes.append("vision_config: the vision tower (only the text model is captured)")
    if getattr(text, "mtp_num_hidden_layers", 0):
        notes.append(f"mtp_num_hidden_layers={text.mtp_num_hidden_layers}: multi-token-prediction layers "
                     f"(they run only for speculative decoding)")
    return notes


def _attention_notes(model, text) -> list[str]:
    """What a model's attention does in its own forward, around the attention call capture observes
    (Llama 4's): chunked layers, layers without RoPE and their query temperature. (Its RoPE, a
    complex product no op computes, is noted where it is called: WRAPPED's apply_rotary_emb.)"""
    notes = []
    layer_types = list(getattr(text, "layer_types", None) or ())
    chunk = getattr(text, "attention_chunk_size", None)
    if chunk and "chunked_attention" in layer_types:
        notes.append(f"chunked attention ({layer_types.count('chunked_attention')} of {len(layer_types)} layers, "
                     f"chunks of {chunk} tokens): tuned as causal attention, which it is while a sequence fits one "
                     f"chunk; a longer one gets its chunked mask and is handed to SDPA")
    no_rope = getattr(text, "no_rope_layers", None)
    if isinstance(no_rope, list) and not all(no_rope):
        temperature = " (their queries scaled by position, attn_temperature_tuning: elementwise, in the module's " \
                      "own forward)" if getattr(text, "attn_temperature_tuning", False) else ""
        notes.append(f"{no_rope.count(0)} of {len(no_rope)} layers apply no RoPE{temperature}")
    return notes


def _alibi_attention(model) -> list[str]:
    """Classes of attention modules that add ALiBi biases to their scores themselves (BLOOM's): an
    attention class whose forward takes `alibi`, or of a modelling module that builds an ALiBi tensor."""
    alibi_modules = {mod.__name__ for mod in modelling_modules(model)
                     if any("alibi" in name.lower() and callable(getattr(mod, name)) for name in vars(mod))}
    found = set()
    for module in model.modules():
        cls = type(module)
        try:
            takes = "alibi" in inspect.signature(cls.forward).parameters
        except (TypeError, ValueError):
            takes = False
        if cls.__name__.endswith("Attention") and (takes or cls.__module__ in alibi_modules):
            found.add(cls.__name__)
    return sorted(found)


# class names of expert and routing modules (MixtralExperts, JetMoeParallelExperts, JetMoeMoE,
# Qwen2MoeSparseMoeBlock, JetMoeTopKGating), not of every module of a *Moe* model (Qwen2MoeAttention)
MOE_CLASS = re.compile(r"experts|moe(block)?$|gating", re.IGNORECASE)


def _other_moe(model, kinds: dict[str, Kind]) -> list[str]:
    """Classes of mixture-of-experts modules whose experts are not transformers' 3-D expert
    weights called with the router's choice (their routing would run on meta tensors, and no op
    here describes them), nor a layer of Llama 4's form (moe.prescaled: its experts and router)."""
    served_by_experts = {name.rpartition(".")[0] for name, m in model.named_modules() if is_experts(m)}
    prescaled = {name for name, kind in kinds.items() if kind.op == "moe.prescaled"}
    served_by_experts |= prescaled | {f"{name}.{child}" for name in prescaled for child in ("experts", "router")}
    return sorted({type(m).__name__ for name, m in model.named_modules()
                   if MOE_CLASS.search(type(m).__name__) and not is_experts(m) and name not in served_by_experts})


_captured: dict[tuple, Captured] = {}  # one capture per config, name, tp, dtype and ep in a process


def capture(cfg: dict, name: str, tp: int = 1, dtype: str = "bf16", where: str | None = None, ep: int = 1) -> Captured:
    """The op instances of the model `cfg` (a config.json's dict) describes, sharded `tp` ways, its
    experts divided over `ep` ranks ("<name>-ep<N>")."""
    blob = json.dumps(cfg, sort_keys=True, default=str)
    key = (blob, name, tp, dtype, ep)
    if key not in _captured:
        config_hash = hashlib.sha256(blob.encode()).hexdigest()[:16]
        _captured[key] = _capture(cfg, name, tp, dtype, where or name, config_hash, ep)
    return _captured[key]


def _capture(cfg: dict, name: str, tp: int, dtype: str, where: str, config_hash: str, ep: int = 1) -> Captured:
    if tp < 1:
        raise LzError(f"--tp must be >= 1, got {tp}")
    refuse_unsupported(cfg, where)
    text = text_config(cfg, where)
    filled = fill_derived(text)
    check_config_values(text, where)  # before anything is built from it
    check_config_sizes(text, DTYPES[dtype].itemsize, where)
    _check_heads(text, tp, name)
    try:
        model = build_meta_model(text, dtype)
    except Exception as e:  # noqa: BLE001 - transformers' own checks of the config
        raise LzError(f"{where}: transformers cannot build {text.model_type} from this config "
                      f"({type(e).__name__}: {_one_line(e)}); fix the config") from None
    kinds = classify(model)
    moe = _other_moe(model, kinds)
    if moe:
        raise LzError(f"{where}: not supported yet: mixture-of-experts layers other than transformers' 3-D "
                      f"experts called with the router's choice ({', '.join(moe)})")
    try:
        prefill, decode = run(model, kinds)
    except LzError:
        raise
    except Exception as e:  # noqa: BLE001 - the model's own code failed on meta tensors
        raise LzError(f"{where}: cannot run {type(model).__name__} to capture its ops "
                      f"({type(e).__name__}: {_one_line(e)})") from None
    if not any(e.op == "attention" for e in prefill):
        alibi = _alibi_attention(model)
        if alibi:
            raise LzError(f"{where}: not supported yet: ALiBi position biases ({', '.join(alibi)} "
                          f"add{'s' if len(alibi) == 1 else ''} them to the attention scores in its own forward; "
                          f"no attention op takes them)")
        inline = sorted({type(m).__name__ for m in model.modules()
                         if re.search(r"attention$", type(m).__name__, re.IGNORECASE) and any(True for _ in m.parameters())})
        if inline:  # written out as matmuls (GPT-NeoX-Japanese, XGLM, TrOCR, MVP): nothing to observe
            raise LzError(f"{where}: not supported yet: attention computed in its own modules' forward, calling no "
                          f"attention function that capture observes ({', '.join(inline)})")
        raise LzError(f"{where}: {type(model).__name__} runs no attention; its token mixer is not supported")
    _check_tp(prefill, tp, name, ep)
    name = f"{name}-ep{ep}" if ep > 1 else name
    fp8 = fp8_scheme(cfg)  # transformers writes it at the top of config.json
    if fp8:
        if any(e.op == "moe" for e in prefill):
            raise LzError(f"{where}: not supported yet: FP8 experts (moe.experts takes bf16/fp16 weights)")
        prefill = quantised_before(fp8_linears(prefill, *fp8))
    layers = getattr(text, "num_hidden_layers", "?")
    parameters = sum(p.numel() for p in model.parameters())
    summary = f"{name}: {text.model_type}, {layers} layers, {parameters / 1e9:.2f}B " \
              f"parameters (captured from transformers' {type(model).__name__})"
    notes = filled + _outside_text_model(cfg, text) + _attention_notes(model, text) + uncovered(model, prefill)
    if fp8:
        notes.append(f"layers.*: {UNSERVED}: the FP8 linears (linear.fp8, and the ops that quantise for them) "
                     f"run transformers' own FP8 modules")
    return Captured(name, text.model_type, tp, tuple(instances(prefill, decode, tp, ep)), tuple(notes),
                    config_hash, summary, layers if isinstance(layers, int) else None, parameters,
                    covered_share(model, prefill))


def fp8_kv_cache(captured: Captured) -> Captured:
    """The model served with its KV cache in FP8 (e4m3, a scale for k and one for v), "<name>-fp8kv":
    its decode steps as attention.decode_fp8kv, except those with a window, a softcap, sinks, ALiBi or a
    v head dim of their own (MLA's dv), which no FP8-cache op computes (they keep their decode
    signature, and a note says so)."""
    merged: dict[Signature, tuple[tuple[str, ...], int]] = {}
    kept = []
    for instance in captured.instances:
        sig = instance.signature
        if sig.op == "attention.decode":
            if sig.dim("window") or sig.dim("softcap") or sig.dim("dv") or {"sinks", "alibi"} & set(sig.flags):
                kept.append(str(sig))
            else:
                sig = Signature.make("attention.decode_fp8kv", {d: sig.dim(d) for d in ("hq", "hkv", "d")}, (),
                                     sig.dtype)
        roles, calls = merged.get(sig, ((), 0))
        merged[sig] = (roles + tuple(r for r in instance.roles if r not in roles), calls + instance.calls_per_forward)
    notes = captured.notes + tuple(f"{s} over an FP8 KV cache (no op computes it with a window, softcap, sinks, "
                                   f"ALiBi or v's own head dim): "
                                   f"the decode is tuned over a cache in the activations' dtype instead" for s in kept)
    name = f"{captured.name}-fp8kv"
    return dataclasses.replace(captured, name=name, notes=notes,
                               summary_line=captured.summary_line.replace(captured.name, name, 1),
                               instances=tuple(OpInstance(sig, roles, calls) for sig, (roles, calls) in merged.items()))


FP8 = "fp8"  # --dtype fp8: bf16 activations, the linears as an FP8 W8A8 checkpoint of the model has them
FP8_W8A8 = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}  # the common scheme


def load(model: str | None, config: str | None, tp: int = 1, dtype: str = "bf16", fp8_kv: bool = False,
         ep: int = 1) -> Captured:
    """--model NAME (the catalogue) or --config PATH (a config.json or its folder), captured.
    ep: its experts divided over that many ranks (_check_ep says how).
    dtype fp8: the model as an FP8 W8A8 deployment runs it, "<name>-fp8": linear.fp8 with
    per-channel weight scales, lm_head left in bf16 (a config with a quantization_config keeps its own).
    fp8_kv: its KV cache in FP8 (fp8_kv_cache)."""
    if (model is None) == (config is None):
        raise LzError("pass exactly one of --model NAME, --config PATH or --workload FILE "
                      f"(built-in models: {', '.join(CATALOGUE)})")
    if model is not None:
        if model not in CATALOGUE:
            raise LzError(f"unknown model {model!r}; known: {', '.join(CATALOGUE)} (or pass --config PATH)")
        cfg, name, where = CATALOGUE[model], model, None
    else:
        (cfg, name), where = read_config(config), str(config)
    if dtype == FP8:
        if not cfg.get("quantization_config"):
            cfg, name = {**cfg, "quantization_config": FP8_W8A8}, f"{name}-fp8"
        dtype = "bf16"
    captured = capture(cfg, name, tp, dtype, where=where, ep=ep)
    return fp8_kv_cache(captured) if fp8_kv else captured

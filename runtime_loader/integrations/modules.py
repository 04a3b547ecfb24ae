"""What a Hugging Face module computes, found by running it: the classification that capture
(lzsolve.models.capture) and the serving patch (integrations.transformers.patch) share.

Linears (nn.Linear, transformers' Conv1D) and embeddings are known by type. Norms and
activations are told apart by running a CPU copy of one module per class on random inputs
against each op's definition, so (1 + weight) RMSNorm, LayerNorm without a bias or tanh-GELU
written out by hand are recognised whatever the class is called.
"""
from __future__ import annotations

import copy
import functools
import inspect
import itertools
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# what a norm or activation module computes, tried on random inputs (fp32, CPU)
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}
# the ops an activation computes: gated, act(gate) * up; plain, act(x)
GATED_OPS = {"silu": "act.swiglu", "gelu_tanh": "act.geglu"}
PLAIN_OPS = {"gelu_tanh": "act.gelu"}


@dataclass(frozen=True)
class Kind:
    op: str  # linear, embedding, norm.rms, norm.layer, act, moe.experts, moe.router, moe.prescaled
    unit_offset: bool = False
    act: str = ""  # for act: a key of ACTIVATIONS
    scale: bool = False  # embedding times a scale (Gemma)
    # moe.router: the top-k weights renormalised; its logits and weights returned in float32 (else
    # in the activations' dtype), as each family's router module does
    renorm: bool = False
    float32_logits: bool = False
    float32_weights: bool = False
    # moe.experts: the expert weights stored (experts, in, out); gate and up rows in turn; biases;
    # GPT-OSS's clamped SwiGLU (limit > 0), as transformers' experts classes declare them
    transposed: bool = False
    interleaved: bool = False
    bias: bool = False
    alpha: float = 0.0
    limit: float = 0.0


def _cpu_copy(module: torch.nn.Module) -> torch.nn.Module:
    """The module on the CPU in fp32, its own tensors drawn at random: buffers too, which to_empty
    leaves as whatever memory it got; where that memory was zero, FalconMamba's weightless norm (an
    unused ones buffer for a weight) read as (1 + w) * x, and was served with a weight it never had."""
    clone = copy.deepcopy(module).to_empty(device="cpu").float()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in (*clone.parameters(recurse=False), *clone.buffers(recurse=False)):
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
    return clone


def _close(a, b) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))


def eps_of(module) -> float:
    """A norm module's epsilon, under the attribute names transformers uses."""
    return next((float(getattr(module, a)) for a in ("variance_epsilon", "eps", "epsilon")
                 if isinstance(getattr(module, a, None), float)), 1e-6)


def _classify_norm(module) -> Kind | None:
    weight = getattr(module, "weight", None)
    shape = weight.shape if isinstance(weight, torch.Tensor) else getattr(module, "normalized_shape", None)
    if not isinstance(shape, tuple) or len(shape) != 1 or any(True for _ in module.children()):
        return None
    width, eps = shape[0], eps_of(module)
    gen = torch.Generator().manual_seed(1)
    x, gate = torch.randn(3, width, generator=gen) * 2 + 0.3, torch.randn(3, width, generator=gen)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    try:
        clone = _cpu_copy(module)
        y = clone(x)
    except TypeError:  # forward(x, gate): a norm gated by silu(gate) (Qwen3.5's Gated DeltaNet output)
        try:
            y = clone(x, gate)
        except Exception:  # noqa: BLE001
            return None
        return Kind("norm.rms_gated") if _close(y, rms * clone.weight * F.silu(gate)) else None
    except Exception:  # noqa: BLE001 - a module that cannot run on its own is not a norm we know
        return None
    if not isinstance(y, torch.Tensor):
        return None
    w, b = getattr(clone, "weight", None), getattr(clone, "bias", None)
    if w is not None and _close(y, rms * w):
        return Kind("norm.rms")
    if w is not None and _close(y, rms * (1 + w)):
        return Kind("norm.rms", unit_offset=True)
    if _close(y, F.layer_norm(x, (width,), w, b, eps)):
        return Kind("norm.layer")
    return None


def _classify_activation(module) -> Kind | None:
    if any(True for _ in module.parameters()) or any(True for _ in module.children()):
        return None
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)) * 3
    try:
        y = copy.deepcopy(module).to("cpu")(x)
    except Exception:  # noqa: BLE001
        return None
    for name, fn in ACTIVATIONS.items():
        if isinstance(y, torch.Tensor) and _close(y, fn(x)):
            return Kind("act", act=name)
    return None


def expert_parallel(module) -> bool:
    """Experts transformers' expert-parallel plan has divided over ranks."""
    return bool(getattr(module, "_is_expert_parallel", False))


def is_experts(module) -> bool:
    """A mixture-of-experts layer's routed experts, as transformers stores them: 3-D expert weights
    (gate_up_proj or up_proj, and down_proj), called as forward(hidden, top_k_index, top_k_weights)
    (Llama 4's experts, which take every token pre-scaled for every expert, are not)."""
    weights = [getattr(module, name, None) for name in ("gate_up_proj", "up_proj", "down_proj")]
    return isinstance(weights[2], torch.Tensor) and weights[2].dim() == 3 and any(
        isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights[:2]) and _takes_routing(type(module))


@functools.cache
def _takes_routing(cls) -> bool:
    """Whether cls.forward takes the router's choice: (hidden, ids, weights), whatever they are named."""
    try:
        parameters = list(inspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


EXPERT_WEIGHTS = {"gate_up_proj", "down_proj"}
EXPERT_BIASES = {"gate_up_proj_bias", "down_proj_bias"}


def experts_arguments(module, kind: Kind) -> tuple:
    """What moe_experts takes after (x, topk_ids, topk_weights) for an experts module of this kind:
    its weights as (experts, out, in) views, then its biases and activation where it has them."""
    gate_up, down = module.gate_up_proj, module.down_proj
    if kind.transposed:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if not (kind.bias or kind.interleaved or kind.limit):
        return gate_up, down
    biases = (module.gate_up_proj_bias, module.down_proj_bias) if kind.bias else (None, None)
    return gate_up, down, *biases, kind.interleaved, kind.alpha, kind.limit


def _own_gate(module) -> bool:
    """Whether the experts class gates with its own _apply_gate rather than transformers' act_fn(gate) * up."""
    gate = getattr(type(module), "_apply_gate", None)
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # a transformers without it: every class's gate is its own
        _default_apply_gate = None
    return gate is not None and gate is not _default_apply_gate


def _experts_form(module) -> Kind | None:
    """The moe.experts form an experts module declares: its layout as transformers'
    use_experts_implementation sets it on the instance, its biases, and GPT-OSS's clamp where the
    class has its own gate (limit and alpha attributes); None for a form no op computes."""
    parameters = set(module._parameters)
    biases = parameters & EXPERT_BIASES
    if not EXPERT_WEIGHTS <= parameters <= EXPERT_WEIGHTS | EXPERT_BIASES or biases not in (set(), EXPERT_BIASES):
        return None  # other weights, or one bias without the other
    form = dict(transposed=bool(getattr(module, "is_transposed", False)),
                interleaved=not getattr(module, "is_concatenated", True), bias=biases == EXPERT_BIASES)
    if _own_gate(module):  # served when it is GPT-OSS's (checked by running)
        alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
        if not (isinstance(alpha, float) and isinstance(limit, float) and limit > 0):
            return None
        form.update(alpha=alpha, limit=limit)
    return Kind("moe.experts", **form)


def _classify_experts(module) -> Kind | None:
    """The module's Kind("moe.experts") when it computes moe.experts in the form it declares: its
    own forward is run, with transformers' eager experts loop, on a stand-in holding small random
    CPU weights of its expert count, and compared with ours."""
    from ..ops.moe import moe_experts

    kind = _experts_form(module) if is_experts(module) else None
    if kind is None:
        return None
    experts, hidden, inter = module.gate_up_proj.shape[0], 12, 8  # hidden != 2 * inter: the layouts differ
    gen = torch.Generator().manual_seed(4)
    shapes = {"gate_up_proj": (experts, 2 * inter, hidden), "down_proj": (experts, hidden, inter),
              "gate_up_proj_bias": (experts, 2 * inter), "down_proj_bias": (experts, hidden)}
    stand_in = copy.copy(module)  # shares the module's attributes; gets its own parameters and config
    stand_in._parameters = {}
    for name in module._parameters:
        shape = shapes[name][:1] + shapes[name][1:][::-1] if kind.transposed and "bias" not in name else shapes[name]
        stand_in._parameters[name] = torch.nn.Parameter(torch.randn(shape, generator=gen))
    if getattr(module, "config", None) is not None:
        stand_in.config = copy.copy(module.config)
        stand_in.config._experts_implementation = "eager"
    x = torch.randn(5, hidden, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(5)])
    weights = torch.rand(5, 2, generator=gen)
    try:
        with torch.no_grad():
            got = type(module).forward(stand_in, x, ids, weights)
    except Exception:  # noqa: BLE001 - another forward: not the experts we serve
        return None
    expected = moe_experts(x, ids, weights, *experts_arguments(stand_in, kind))
    return kind if isinstance(got, torch.Tensor) and _close(got, expected) else None


def is_prescaled_experts(module) -> bool:
    """Experts with 3-D weights (gate_up_proj, down_proj) called with the tokens alone, each expert's
    rows already scaled by its router weight (Llama 4's Llama4TextExperts: (experts * tokens, hidden)
    in, every expert over every token)."""
    weights = [getattr(module, name, None) for name in ("gate_up_proj", "down_proj")]
    return all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights) and not _takes_routing(type(module))


def prescaled_arguments(experts, kind: Kind) -> tuple:
    """What moe_experts takes after (x, topk_ids, topk_weights) for the experts of a moe.prescaled
    layer: their weights as (experts, out, in) views."""
    gate_up, down = experts.gate_up_proj, experts.down_proj
    return (gate_up.transpose(1, 2), down.transpose(1, 2)) if kind.transposed else (gate_up, down)


class _Probe(torch.nn.Module):
    """A stand-in shared expert: a fixed function of its input, so that a layer's sum of it and the
    routed experts is checked."""

    def forward(self, x):
        return x * 0.5 + 0.25


def prescaled_moe(x, logits, top_k: int, experts, kind: Kind, ops=None):
    """The routed part of a moe.prescaled layer (Llama 4's Llama4TextMoe): the top_k logits of each
    token, their sigmoids as its weights (not renormalised), each token scaled by its weight for
    each chosen expert, and those rows through moe.experts as one choice each (top_k 1, weight 1),
    summed per token. (moe.experts weights an expert's output; Llama 4 weights its input, which the
    gated MLP does not commute with: so the rows are scaled before and the op's weights are 1.)
    Returns the sum (tokens, hidden), or what ops.moe_experts returned when it is not a tensor."""
    from ..ops.moe import moe_experts

    top, ids = torch.topk(logits, top_k, dim=1)
    weights = torch.sigmoid(top.float()).to(logits.dtype)
    rows = (x.unsqueeze(1) * weights.unsqueeze(-1)).reshape(-1, x.shape[-1])
    call = moe_experts if ops is None else ops.moe_experts
    routed = call(rows, ids.reshape(-1, 1), rows.new_ones((rows.shape[0], 1)), *prescaled_arguments(experts, kind))
    if not isinstance(routed, torch.Tensor):
        return routed
    return routed.view(x.shape[0], top_k, x.shape[-1]).sum(dim=1)


def _shrunk(module, sizes: dict[int, int]):
    """A shallow copy of module with its own parameter and child dicts, and each int attribute that
    is a key of sizes (the real hidden and expert widths) set to its value (the small ones)."""
    clone = copy.copy(module)
    clone._parameters, clone._modules = {}, dict(module._modules)
    for name, value in vars(module).items():
        if type(value) is int and value in sizes:
            setattr(clone, name, sizes[value])
    return clone


def _classify_prescaled_moe(module) -> Kind | None:
    """Kind("moe.prescaled") for a mixture-of-experts layer of Llama 4's form: children router (a
    linear with top_k, returning (scores, logits)), experts (is_prescaled_experts) and optionally
    shared_expert, whose forward(hidden) returns (shared_expert(x) + prescaled_moe(x, ...), logits).
    Found by running the layer's own forward on a stand-in: small random CPU weights of its expert
    count and top_k, a probe for the shared expert."""
    children = dict(module.named_children())
    router, experts = children.get("router"), children.get("experts")
    if set(children) - {"router", "experts", "shared_expert"} or router is None or experts is None \
            or not is_prescaled_experts(experts):
        return None
    weight, top_k = getattr(router, "weight", None), getattr(router, "top_k", None)
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and isinstance(top_k, int)) or \
            set(router._parameters) - {"weight", "bias"} or set(experts._parameters) != {"gate_up_proj", "down_proj"}:
        return None
    count, hidden = weight.shape
    gate_up, down = experts.gate_up_proj, experts.down_proj
    if gate_up.shape[0] != count or down.shape[0] != count or not 0 < top_k <= count:
        return None
    transposed = gate_up.shape[1] == hidden and down.shape[2] == hidden and gate_up.shape[2] == 2 * down.shape[1]
    if not transposed and not (gate_up.shape[2] == hidden and down.shape[1] == hidden
                               and gate_up.shape[1] == 2 * down.shape[2]):
        return None
    inter = down.shape[1] if transposed else down.shape[2]
    h, i = (12, 12) if inter == hidden else (12, 8)  # hidden != 2 * inter: the layouts differ
    gen = torch.Generator().manual_seed(6)
    stand_in, small_router, small_experts = (_shrunk(m, {hidden: h, inter: i}) for m in (module, router, experts))
    small_router._parameters = {"weight": torch.nn.Parameter(torch.randn(count, h, generator=gen)),
                                **({"bias": None} if "bias" in router._parameters else {})}
    if router._parameters.get("bias") is not None:
        small_router._parameters["bias"] = torch.nn.Parameter(torch.randn(count, generator=gen))
    shapes = ((count, h, 2 * i), (count, i, h)) if transposed else ((count, 2 * i, h), (count, h, i))
    small_experts._parameters = {name: torch.nn.Parameter(torch.randn(shape, generator=gen) * shape[1] ** -0.5)
                                 for name, shape in zip(("gate_up_proj", "down_proj"), shapes)}
    stand_in._modules.update(router=small_router, experts=small_experts)
    if "shared_expert" in children:
        stand_in._modules["shared_expert"] = _Probe()
    kind = Kind("moe.prescaled", transposed=transposed)
    x = torch.randn(5, h, generator=gen)
    try:
        with torch.no_grad():
            got = type(module).forward(stand_in, x)
            logits = F.linear(x, small_router.weight, small_router.bias)
            expected = prescaled_moe(x, logits, top_k, small_experts, kind)
    except Exception:  # noqa: BLE001 - another forward: not the layer we serve
        return None
    if "shared_expert" in children:
        expected = expected + _Probe()(x)
    ok = (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
          and _close(got[0], expected) and _close(got[1], logits))
    return kind if ok else None


def _classify_router(module) -> Kind | None:
    """Kind("moe.router") when forward(hidden) returns (logits, weights, ids) as hidden @ weight.T
    (+ bias) and moe.router of those logits (softmax, top_k, renormalised or not; GPT-OSS's softmax
    over the top_k logits is the renormalised one): found by running a CPU copy, in fp32 for the
    values and in bf16 for the dtypes it returns."""
    from ..ops.moe import moe_router

    weight, top_k = getattr(module, "weight", None), getattr(module, "top_k", None)
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and isinstance(top_k, int)) or \
            set(module._parameters) - {"weight", "bias"} or any(True for _ in module.children()):
        return None
    experts, hidden = weight.shape
    x = torch.randn(5, hidden, generator=torch.Generator().manual_seed(5))
    try:
        clone = _cpu_copy(module).eval()
        with torch.no_grad():
            expected_logits = F.linear(x, clone.weight, getattr(clone, "bias", None))
            logits, weights, ids = clone(x)
            low = clone.to(torch.bfloat16)(x.to(torch.bfloat16))  # .to() converts the clone in place
    except Exception:  # noqa: BLE001 - another forward: not a router we know
        return None
    if not (isinstance(logits, torch.Tensor) and _close(logits, expected_logits)):
        return None
    for renorm in (True, False):
        expected_weights, expected_ids = moe_router(logits, top_k, renorm)
        if torch.equal(ids, expected_ids) and _close(weights.float(), expected_weights):
            return Kind("moe.router", renorm=renorm, float32_logits=low[0].dtype == torch.float32,
                        float32_weights=low[1].dtype == torch.float32)
    return None


def _is_linear(module) -> bool:
    from transformers.pytorch_utils import Conv1D
    return isinstance(module, (torch.nn.Linear, Conv1D))


def own_parameters(module) -> tuple[str, ...]:
    """The names of the parameters a module holds itself (not its children's), sorted."""
    return tuple(sorted(name for name, p in module._parameters.items() if p is not None))


def classify(model) -> dict[str, Kind]:
    """Module name -> what it computes, for every module an op covers (one probe per class and set
    of parameters: instances of one class may differ, as Gemma 4's v_norm, an RMSNorm built without
    its weight, does from its q_norm). Experts transformers has divided over ranks are not covered:
    its expert-parallel forward holds the module's own, and their signature needs the rank count,
    which they do not keep."""
    by_class: dict[tuple, Kind | None] = {}
    kinds = {}
    for name, module in model.named_modules():
        if _is_linear(module):
            kinds[name] = Kind("linear")
        elif module is model.get_input_embeddings():
            kinds[name] = Kind("embedding", scale=getattr(module, "embed_scale", None) is not None)
        elif isinstance(module, torch.nn.Embedding):  # another table indexed by position (GPT-2's wpe)
            kinds[name] = Kind("posenc.learned")
        elif expert_parallel(module):
            continue
        else:
            form = (type(module), own_parameters(module))
            if form not in by_class:
                by_class[form] = (_classify_experts(module) if is_experts(module) else
                                  _classify_norm(module) or _classify_activation(module) or _classify_router(module)
                                  or _classify_prescaled_moe(module))
            if by_class[form] is not None:
                kinds[name] = by_class[form]
    return kinds


def rope_layout(apply_rotary_pos_emb) -> str | None:
    """The pair layout a modelling module's apply_rotary_pos_emb(q, k, cos, sin) rotates in,
    found by running it against the eager reference with cos/sin in each layout's Hugging Face
    form (split_half: the angles twice, concatenated; interleaved: each angle twice in a row,
    Cohere and GLM; split_half_once: split halves with each angle once, GPT-OSS): "split_half",
    "interleaved", "split_half_once", or None for any other form."""
    from ..ops.rope import rope

    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 1, 5, 8, generator=gen)
    angles = torch.rand(1, 5, 4, generator=gen) * 6
    for layout, form in ROPE_FORMS.items():
        try:
            got = apply_rotary_pos_emb(q, k, form(angles.cos()), form(angles.sin()))
        except Exception:  # noqa: BLE001 - another signature: not a form we serve
            continue
        interleaved = layout == "interleaved"
        full = ROPE_FORMS["interleaved" if interleaved else "split_half"]  # the eager kernel's form
        expected = rope(q, k, full(angles.cos()), full(angles.sin()), interleaved)
        if isinstance(got, tuple) and len(got) == 2 and all(_close(g, e) for g, e in zip(got, expected)):
            return layout
    return None


# cos/sin in each form a modelling module may want them, from the angles (..., d / 2)
ROPE_FORMS = {"split_half": lambda t: torch.cat([t, t], dim=-1), "interleaved": lambda t: t.repeat_interleave(2, -1),
              "split_half_once": lambda t: t}


# --- meta runs -------------------------------------------------------------------------------------
# A model built on the meta device runs its modelling module's functions on tensors with no data.
# Where transformers backs a function with a kernel library (FLA's delta rules when installed),
# that kernel would be launched on null pointers (an illegal memory access on the H100): meta runs
# call these shape-only stand-ins instead, with the same parameters.
def _deltanet_shapes(query, key, value, g=None, beta=None, chunk_size=64, initial_state=None,
                     output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    batch, _, heads, dv = value.shape
    state = value.new_empty((batch, heads, key.shape[-1], dv), dtype=torch.float32) if output_final_state else None
    return torch.empty_like(value), state


def _conv_shapes(hidden_states, weight, bias=None, activation=None, **kwargs):
    return torch.empty_like(hidden_states)


def _conv_update_shapes(hidden_states, conv_state, weight, bias=None, activation=None):
    return torch.empty_like(hidden_states)


def _no_packed_sequences(position_ids):
    # transformers' mask builders look for packed sequences in explicit position ids by reading their
    # values (a .all() that meta tensors cannot answer: Moshi's and Gemma 4's multimodal wrappers' twins
    # stopped there); the twin's positions are one plain sequence
    return None


META_FUNCTIONS = {"torch_chunk_gated_delta_rule": _deltanet_shapes, "torch_recurrent_gated_delta_rule": _deltanet_shapes,
                  "causal_conv1d_fn": _conv_shapes, "causal_conv1d_update": _conv_update_shapes}
MASK_FUNCTIONS = {"find_packed_sequence_indices": _no_packed_sequences}  # of transformers.masking_utils


def modelling_modules(model) -> set:
    """The Python modules of the model's module classes (where its functions live)."""
    return {m for m in (sys.modules.get(type(module).__module__) for module in model.modules()) if m is not None}


@contextmanager
def meta_functions(model):
    """The model's modelling functions of META_FUNCTIONS, and those of MASK_FUNCTIONS in transformers'
    mask builders (which the modelling modules call), replaced by their stand-ins for the block."""
    replaced = []
    masks = sys.modules.get("transformers.masking_utils")
    stand_ins = [(module, META_FUNCTIONS) for module in modelling_modules(model)]
    stand_ins += [(masks, MASK_FUNCTIONS)] if masks is not None else []
    try:
        for module, functions in stand_ins:
            for name, stand_in in functions.items():
                if callable(getattr(module, name, None)):
                    replaced.append((module, name, getattr(module, name)))
                    setattr(module, name, stand_in)
        yield
    finally:
        for module, name, original in reversed(replaced):
            setattr(module, name, original)


def meta_twin(model):
    """A copy of `model` built on the meta device from its config (no memory, no real weights),
    each parameter and buffer in the dtype the model's own has (a model cast after loading, or one
    keeping some modules in fp32, calls in those dtypes); raises what building it raised."""
    config = copy.deepcopy(model.config)  # the twin must not change the model's own config
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin = type(model)(config).eval()
    dtypes = {name: t.dtype for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}
    with torch.no_grad():
        for name, t in itertools.chain(twin.named_parameters(), twin.named_buffers()):
            if dtypes.get(name, t.dtype) != t.dtype:
                t.data = t.data.to(dtypes[name])
    return twin


def sibling_groups(readers: dict[int, list[str]]) -> list[tuple[str, ...]]:
    """From the names of the linears that read each tensor (by its id, in call order), the groups of
    siblings (children of one module) among them."""
    groups = []
    for names in readers.values():
        by_parent: dict[str, list[str]] = {}
        for name in dict.fromkeys(names):
            by_parent.setdefault(name.rpartition(".")[0], []).append(name)
        groups += [tuple(group) for group in by_parent.values() if len(group) > 1]
    return groups

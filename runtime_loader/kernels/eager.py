"""Eager PyTorch implementations: the fallbacks outside the table, written the
way Hugging Face models compute these ops (fp32 statistics, input-dtype math)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dtypes import ALL_DTYPES
from ..specs import HEAD_DIM_ANY, KernelSpec

BOTH = frozenset({"cpu", "cuda"})
UNIT_OFFSET = frozenset({"unit_offset"})
KEEP_INPUTS = frozenset({"keep_inputs"})  # norm.rms_add's results in new tensors (its kernels that always do so)
# moe.experts beyond Mixtral's form: GPT-OSS's layout, biases and clamped SwiGLU (lzsolve.ops.moe)
EXPERT_FORMS = frozenset({"interleaved", "bias", "transposed", "clamped_swiglu", "expert_parallel"})


def effective_window(seq_q: int, kv_len: int, causal: bool, window: int) -> int:
    """`window`, or 0 when it hides no key: every query sits below it (a prompt or a cache shorter
    than the window, as most requests to a Mistral or Gemma sliding layer are), so a kernel can
    take its plain causal path instead of a mask."""
    last_position = seq_q - 1 if causal else kv_len - 1
    return window if window and last_position >= window else 0


def visible_keys(seq_q: int, kv_len: int, causal: bool, window: int, device):
    """Which keys each query sees, as a (seq_q, kv_len) boolean mask; None when it sees them all.
    Query i sits at position i under a causal mask (SDPA's top-left alignment: it sees keys 0..i)
    and at kv_len - seq_q + i without one (the newest tokens: a decode query is at kv_len - 1);
    a window lets it see keys j > position - window. Every query keeps at least one key."""
    window = effective_window(seq_q, kv_len, causal, window)
    if not causal and not window:
        return None
    query = torch.arange(seq_q, device=device)[:, None]
    key = torch.arange(kv_len, device=device)[None, :]
    keep = key <= query if causal else torch.ones(seq_q, kv_len, dtype=torch.bool, device=device)
    if window:
        position = query if causal else query + (kv_len - seq_q)
        keep = keep & (key > position - window)
    return keep


def with_sinks(out, lse, sinks):
    """Attention over the keys alone, made attention with sinks: each row's sink logit joins the
    denominator, exp(lse) -> exp(lse) + exp(sink), so the row scales by sigmoid(lse - sink).
    out (batch, heads, seq_q, d); lse (batch, heads, seq_q), the natural log-sum-exp of the row's
    scaled scores that flash kernels return; sinks (heads,)."""
    scale = torch.sigmoid(lse.float() - sinks.float()[None, :, None])
    return (out.float() * scale[..., None]).to(out.dtype)


def attention(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    """window and softcap are passed only by signatures that set them, sinks by those with sinks
    (see lzsolve.ops.attention); a sink is one more column of the softmax, as GPT-OSS's eager
    attention computes it."""
    groups = q.shape[1] // k.shape[1]
    if groups != 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if softcap:  # Gemma 2: squash the scaled scores, then mask
        scores = torch.tanh(scores / softcap) * softcap
    keep = visible_keys(q.shape[2], k.shape[2], causal, window, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if sinks is None:
        return torch.matmul(scores.softmax(-1).to(q.dtype), v)
    sink_column = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
    probs = torch.cat([scores, sink_column], dim=-1).softmax(-1)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)


def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    """Over the last dim; also norm.qk's per-head norm, x (..., heads, d) with weight (d,)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:  # Gemma: (1 + weight) applied in fp32, one rounding at the end
        return (xf * (1.0 + weight.float())).to(x.dtype)
    return weight * xf.to(x.dtype)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False):
    """New tensors, whether or not the call asks for them (keep_inputs)."""
    total = x + residual
    return rms_norm(total, weight, eps, unit_offset), total


def layer_norm(x, weight, bias, eps: float):
    """bias None: LayerNorm without a bias (Cohere, OLMo)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    xf = (xf - mean) * torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
    out = xf.to(x.dtype) * weight
    return out if bias is None else out + bias


def rotate(x, interleaved: bool):
    """The 90-degree rotation RoPE mixes in: pairs (x1, x2) -> (-x2, x1)."""
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, cos, sin, interleaved: bool):
    """q: (batch, hq, seq, d), k: (batch, hkv, seq, d), cos/sin: (batch or 1, seq, d)."""
    cos = cos.unsqueeze(1).to(q.dtype)
    sin = sin.unsqueeze(1).to(q.dtype)
    return q * cos + rotate(q, interleaved) * sin, k * cos + rotate(k, interleaved) * sin


def swiglu(gate, up):
    return F.silu(gate) * up


def geglu(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def gelu(x):
    return F.gelu(x, approximate="tanh")


def linear(x, weight, bias=None):
    out = torch.matmul(x, weight.T)
    return out + bias if bias is not None else out


def attention_fp8kv(q, k, v, k_scale: float, v_scale: float, scale=None):
    """The baseline any device runs: the cache dequantised to q's dtype, then SDPA's default."""
    k, v = k.to(q.dtype) * k_scale, v.to(q.dtype) * v_scale
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


E4M3_MAX = 448.0  # the largest finite float8 e4m3fn value


def quantize_per_token(x):
    """x (..., k) as float8 e4m3 with one fp32 scale per row (amax over 448): an FP8 linear's
    dynamic activation quantisation. Returns (q, scale (..., 1)). The scale is amax times the
    fp32 reciprocal of 448, not amax / 448: torch's CUDA kernels divide by a Python number that
    way and its CPU kernels do not, so a division would make the scale's last bit (and an element
    near a rounding boundary) depend on the device; the Triton kernels multiply alike (row_scale)."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) * (1.0 / E4M3_MAX)
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def linear_fp8(x, weight, weight_scale, bias=None):
    """The baseline any device runs: x quantised per token and dequantised (the format's rounding),
    the weight dequantised, both in x's dtype, then one GEMM (a full pass over the weight per call)."""
    q, scale = quantize_per_token(x)
    w = (weight.to(x.dtype) * weight_scale.to(x.dtype).reshape(-1, 1))
    return F.linear((q.float() * scale).to(x.dtype), w, bias)


def rms_norm_fp8(x, weight, eps: float, unit_offset: bool = False):
    """The norm, then the per-token quantisation: two passes (about ten launches) where a fused
    kernel makes one; the norm's output rounded to x's dtype first, as an unfused server has it."""
    return quantize_per_token(rms_norm(x, weight, eps, unit_offset))


def rms_norm_add_fp8(x, residual, weight, eps: float, unit_offset: bool = False):
    normed, total = rms_norm_add(x, residual, weight, eps, unit_offset)
    return (*quantize_per_token(normed), total)


def swiglu_fp8(gate, up):
    """The SwiGLU, then the per-token quantisation: as rms_norm_fp8, its output rounded first."""
    return quantize_per_token(swiglu(gate, up))


def linear_fp8_prequantised(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16):
    """linear_fp8's baseline on an input quantised beforehand: both dequantised to out_dtype, one GEMM."""
    w = weight.to(out_dtype) * weight_scale.to(out_dtype).reshape(-1, 1)
    return F.linear((q.float() * x_scale).to(out_dtype), w, bias)


def scaled(rows, scale: float | None):
    """Gemma's embedding scale: sqrt(hidden) rounded to the table's dtype, then multiplied in."""
    return rows if scale is None else rows * torch.tensor(scale, dtype=rows.dtype)


def embedding(ids, table, scale: float | None):
    return scaled(table[ids], scale)


def learned_positions(x, positions, table):
    return x + table[positions]


def sigmoid_gate(x, gate):
    return x * torch.sigmoid(gate)


def l2_normalize(x, eps: float = 1e-6):
    """As FLA and transformers normalise Gated DeltaNet's q and k: eps inside the rsqrt."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def causal_conv1d(x, weight, bias, state, silu: bool):
    """As transformers' Qwen3.5 runs it without causal-conv1d: F.conv1d over channels-first
    inputs (zero-padded when there is no state), then SiLU. x: (batch, seq, channels); state
    (batch, channels, width) or None. Returns (out, the new state: the last width inputs)."""
    seq, width = x.shape[1], weight.shape[1]
    inputs = x.transpose(1, 2)  # (batch, channels, seq): a view
    if state is not None:
        inputs = torch.cat([state.to(x.dtype), inputs], dim=-1)
    # with no state, the zero history is conv1d's padding (on both sides: the first seq outputs are the causal ones)
    out = F.conv1d(inputs, weight[:, None], bias, padding=0 if state is not None else width - 1,
                   groups=weight.shape[0])
    out = out[..., -seq:] if state is not None else out[..., :seq]
    if silu:
        out = F.silu(out)
    new_state = inputs[..., -width:] if inputs.shape[-1] >= width else F.pad(inputs, (width - inputs.shape[-1], 0))
    return out.transpose(1, 2), new_state.contiguous()


def causal_conv1d_taps(x, weight, bias, state, silu: bool):
    """The same conv as width shifted multiply-adds over (batch, seq, channels): elementwise, so
    torch.compile fuses it into one kernel (Inductor cannot lower conv1d over an unbacked length)."""
    seq, width = x.shape[1], weight.shape[1]
    history = F.pad(x, (0, 0, width, 0)) if state is None else torch.cat([state.transpose(1, 2).to(x.dtype), x], 1)
    out = sum(weight[:, j].float() * history[:, 1 + j:1 + j + seq].float() for j in range(width))
    if bias is not None:
        out = out + bias.float()
    out = F.silu(out) if silu else out
    return out.to(x.dtype), history[:, -width:].transpose(1, 2).contiguous()


def deltanet_gates(a, b, a_log, dt_bias):
    """As Qwen3.5's forward computes them: beta = sigmoid(b) in b's dtype, the log decay in fp32."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias), b.sigmoid()


def _deltanet_heads(q, k, v, qk_l2norm: bool):
    """q and k per value head in fp32 (each q/k head serves hv // hk consecutive value heads),
    L2-normalised if asked, q scaled by dk ** -0.5; v in fp32."""
    hk, dk, hv = k.shape[2], k.shape[3], v.shape[2]
    if hv != hk:
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k = q.float(), k.float()
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    return q * dk ** -0.5, k, v.float()


def gated_deltanet_recurrent(q, k, v, g, beta, state, qk_l2norm: bool):
    """The gated delta rule one token at a time, in fp32 (transformers' torch_recurrent_gated_delta_rule).
    q, k: (batch, seq, hk, dk); v: (batch, seq, hv, dv); g (log decay), beta: (batch, seq, hv);
    state: (batch, hv, dk, dv) or None. Per value head and token: S <- exp(g) S, then the delta
    rule S <- S + k (beta (v - S^T k))^T, and out = S^T q / sqrt(dk).
    Returns (out in v's dtype, final state in fp32)."""
    batch, seq, hv, dv = v.shape
    dk = k.shape[3]
    q, k, values = _deltanet_heads(q, k, v, qk_l2norm)
    decay, beta = g.float().exp(), beta.float()
    state = torch.zeros(batch, hv, dk, dv, dtype=torch.float32, device=v.device) if state is None else state.float()
    out = torch.empty(batch, seq, hv, dv, dtype=torch.float32, device=v.device)
    for t in range(seq):
        state = state * decay[:, t, :, None, None]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        delta = (values[:, t] - predicted) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, t])
    return out.to(v.dtype), state


DELTANET_CHUNK = 64


def gated_deltanet_chunked(q, k, v, g, beta, state, qk_l2norm: bool, chunk: int = DELTANET_CHUNK):
    """The same rule over chunks of `chunk` tokens, in fp32 (transformers' torch_chunk_gated_delta_rule,
    the "WY" form of the DeltaNet papers): within a chunk the delta updates are one unit lower
    triangular solve, so the sequential part is one state step per chunk, not per token."""
    batch, seq, hv, dv = v.shape
    dk = k.shape[3]
    q, k, values = _deltanet_heads(q, k, v, qk_l2norm)
    pad = -seq % chunk  # zero tokens at the end: beta 0 writes nothing, g 0 decays nothing

    def chunks(t):  # (batch, seq, hv, ...) -> (batch, hv, chunks, chunk, ...)
        t = t.transpose(1, 2)
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad))
        return t.reshape(batch, hv, -1, chunk, *t.shape[3:])

    q, k, values, beta, log_decay = (chunks(t) for t in (q, k, values, beta.float(), g.float()))
    decay = log_decay.cumsum(-1)  # log of the decay from the chunk's start to each token
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).triu(1)
    between = (decay[..., :, None] - decay[..., None, :]).masked_fill(future, float("-inf")).exp()
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * between  # the strictly lower part couples a chunk's updates
    new_values = torch.linalg.solve_triangular(system, values * beta[..., None], upper=False, unitriangular=True)
    k_decayed = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False,
                                              unitriangular=True)
    within = (q @ k.transpose(-1, -2)) * between
    q = q * decay.exp()[..., None]
    k = k * (decay[..., -1:] - decay).exp()[..., None]
    chunk_decay = decay[..., -1].exp()[..., None, None]
    state = torch.zeros(batch, hv, dk, dv, dtype=torch.float32, device=v.device) if state is None else state.float()
    out = torch.empty_like(new_values)
    for c in range(q.shape[2]):
        corrected = new_values[:, :, c] - k_decayed[:, :, c] @ state  # what the state does not predict yet
        out[:, :, c] = q[:, :, c] @ state + within[:, :, c] @ corrected
        state = state * chunk_decay[:, :, c] + k[:, :, c].transpose(-1, -2) @ corrected
    out = out.reshape(batch, hv, -1, dv)[:, :, :seq].transpose(1, 2)
    return out.to(v.dtype), state


def gated_deltanet(q, k, v, g, beta, state, qk_l2norm: bool):
    """As transformers' Qwen3.5 runs it without FLA: a decode step token by token, anything
    longer chunked. Returns (out in v's dtype, final state in fp32)."""
    rule = gated_deltanet_recurrent if q.shape[1] == 1 else gated_deltanet_chunked
    return rule(q, k, v, g, beta, state, qk_l2norm)


def expert_activation(h, interleaved: bool, alpha: float, limit: float):
    """The experts' gated activation of their gate_up rows h (..., 2 * inter): silu(gate) * up,
    or with a limit GPT-OSS's clamped SwiGLU (its _apply_gate); interleaved: gate and up columns
    in turn, else the gate half then the up half."""
    gate, up = (h[..., 0::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
    if not limit:
        return F.silu(gate) * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def moe_experts(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
                alpha=0.0, limit=0.0, ep=1):
    """transformers' eager experts loop (MixtralExperts.forward): per expert hit, its tokens
    gathered, two GEMMs, the weighted rows added back. The loop and the index lists are
    data-dependent: one host sync per layer, and no CUDA graph. Under expert parallelism the
    sentinel id of other ranks' slots gets a class of its own, which no expert reads (as
    transformers does)."""
    out = torch.zeros_like(x)
    experts = gate_up.shape[0]
    with torch.no_grad():
        ids = topk_ids.clamp(max=experts) if ep > 1 else topk_ids
        mask = F.one_hot(ids, num_classes=experts + (ep > 1)).permute(2, 1, 0)[:experts]  # (expert, slot, token)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert in hit[:, 0].tolist():
        slots, tokens = torch.where(mask[expert])
        h = F.linear(x[tokens], gate_up[expert], None if gate_up_bias is None else gate_up_bias[expert])
        act = expert_activation(h, interleaved, alpha, limit)
        rows = F.linear(act, down[expert], None if down_bias is None else down_bias[expert])
        out.index_add_(0, tokens, (rows * topk_weights[tokens, slots, None]).to(out.dtype))
    return out


def moe_router(logits, top_k: int, renorm: bool):
    """As transformers' routers compute it: softmax in fp32, top-k, renormalised by the sum."""
    weights, ids = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float32), top_k, dim=-1)
    if renorm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


SPECS = [
    KernelSpec("eager.attention", frozenset({"attention.prefill", "attention.decode"}), "torch", attention,
               platforms=BOTH, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               features=frozenset({"causal", "gqa", "sliding_window", "softcap", "qk_norm", "sinks"}), graph_safe=True,
               deterministic=True, notes="matmul + fp32 softmax + matmul; materialises the score matrix; "
                                         "the reference for what SDPA cannot do (softcap, sinks)"),
    KernelSpec("eager.rms_norm", frozenset({"norm.rms"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               features=UNIT_OFFSET, graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_add", frozenset({"norm.rms_add"}), "torch", rms_norm_add, platforms=BOTH,
               dtypes=ALL_DTYPES, features=UNIT_OFFSET | KEEP_INPUTS, graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_fp8", frozenset({"norm.rms_fp8"}), "torch", rms_norm_fp8, platforms=BOTH,
               dtypes=ALL_DTYPES, features=UNIT_OFFSET, graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_add_fp8", frozenset({"norm.rms_add_fp8"}), "torch", rms_norm_add_fp8, platforms=BOTH,
               dtypes=ALL_DTYPES, features=UNIT_OFFSET, graph_safe=True, deterministic=True),
    KernelSpec("eager.qk_norm", frozenset({"norm.qk"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=UNIT_OFFSET, graph_safe=True, deterministic=True),
    KernelSpec("eager.layer_norm", frozenset({"norm.layer"}), "torch", layer_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"no_bias"}), graph_safe=True, deterministic=True),
    KernelSpec("eager.rope", frozenset({"posenc.rope"}), "torch", rope,
               platforms=BOTH, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY, head_dim_multiple=2,
               features=frozenset({"gqa", "rope_split_half", "rope_interleaved"}),
               graph_safe=True, deterministic=True),
    KernelSpec("eager.swiglu_fp8", frozenset({"act.swiglu_fp8"}), "torch", swiglu_fp8, platforms=BOTH,
               dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.swiglu", frozenset({"act.swiglu"}), "torch", swiglu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.geglu", frozenset({"act.geglu"}), "torch", geglu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.gelu", frozenset({"act.gelu"}), "torch", gelu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.linear", frozenset({"linear"}), "torch", linear, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"bias"}), graph_safe=True, notes="matmul, then a separate bias add"),
    KernelSpec("eager.attention_fp8kv", frozenset({"attention.decode_fp8kv"}), "torch", attention_fp8kv, platforms=BOTH,
               dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY, features=frozenset({"gqa"}), graph_safe=True,
               notes="dequantise the whole cache to q's dtype, then SDPA"),
    KernelSpec("eager.linear_fp8", frozenset({"linear.fp8"}), "torch", linear_fp8, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"per_channel", "bias"}), graph_safe=True,
               notes="dequantise x (quantised per token) and the weight, then a GEMM in x's dtype"),
    KernelSpec("eager.linear_fp8_prequantised", frozenset({"linear.fp8_prequantised"}), "torch", linear_fp8_prequantised,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"per_channel", "bias"}), graph_safe=True,
               notes="dequantise x and the weight, then a GEMM in the output dtype"),
    KernelSpec("eager.embedding", frozenset({"embedding"}), "torch", embedding, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"scaled"}), graph_safe=True, deterministic=True),
    KernelSpec("eager.learned_positions", frozenset({"posenc.learned"}), "torch", learned_positions,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.sigmoid_gate", frozenset({"act.sigmoid_gate"}), "torch", sigmoid_gate,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.causal_conv1d", frozenset({"conv.causal_depthwise"}), "torch", causal_conv1d, platforms=BOTH,
               dtypes=ALL_DTYPES, features=frozenset({"silu", "bias"}), graph_safe=True, deterministic=True,
               notes="F.conv1d (depthwise, channels first) then SiLU, as transformers runs it"),
    KernelSpec("eager.deltanet_gates", frozenset({"recurrent.deltanet_gates"}), "torch", deltanet_gates,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True,
               notes="as the model's forward: six elementwise launches"),
    KernelSpec("eager.gated_deltanet", frozenset({"recurrent.gated_deltanet"}), "torch", gated_deltanet,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"gqa", "qk_l2norm"}), graph_safe=True,
               deterministic=True, notes="as transformers computes it without FLA: chunks of 64 tokens in fp32 (a "
                                         "triangular solve per chunk, a Python loop over chunks); decode token by token"),
    KernelSpec("eager.moe_experts", frozenset({"moe.experts"}), "torch", moe_experts, platforms=BOTH,
               dtypes=ALL_DTYPES, features=EXPERT_FORMS,
               notes="transformers' eager loop over the experts hit; index_add_ in the activation dtype"),
    KernelSpec("eager.moe_router", frozenset({"moe.router"}), "torch", moe_router, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"renorm"}), graph_safe=True, deterministic=True,
               notes="softmax in fp32, topk, a division: three or four launches"),
]

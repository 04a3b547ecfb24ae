"""Our references and eager kernels against the transformers modules they stand for, on random
weights (fp32 on CPU; bf16 too where the cast order is the point). A transformers without a
module skips that comparison."""
import types

import pytest
import torch
import torch.nn.functional as F

from lzsolve.ops import CONTRACTS
from lzsolve.ops.rope import cos_sin
from runtime_loader import Dispatcher, registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature
from runtime_loader.ops import recurrent as recurrent_ops

pytest.importorskip("transformers")


def impl(kernel_id):
    return registry.get(kernel_id).impl


def close(got, expected, tol=1e-5):
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def near(shape, center: float):
    """Trained-looking norm weights: center (1, or 0 under (1 + weight)) plus a little noise."""
    return center + 0.1 * torch.randn(shape)


# --- RoPE --------------------------------------------------------------------------
def test_rope_split_half_is_llamas():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = llama.LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2)
    positions = torch.tensor([[0, 1, 2, 5, 9, 100, 4000]])
    cos, sin = llama.LlamaRotaryEmbedding(config)(torch.randn(1, 7, 128), positions)
    q, k = torch.randn(1, 4, 7, 32), torch.randn(1, 2, 7, 32)
    expected = llama.apply_rotary_pos_emb(q, k, cos, sin)
    close(impl("eager.rope")(q, k, cos, sin, False), expected)
    close(CONTRACTS["posenc.rope"].reference(q, k, cos, sin, False), expected)
    ours = cos_sin(positions[0], 32, interleaved=False, theta=config.rope_parameters["rope_theta"])
    close(ours, (cos[0], sin[0]), tol=1e-4)  # our cos/sin layout is Llama's


def test_rope_interleaved_is_glms_and_gptjs():
    """GLM rotates interleaved pairs with Llama's cos/sin halves repeated pairwise; GPT-J rotates
    every two dims of (batch, seq, heads, d) with its own sin/cos table."""
    glm = pytest.importorskip("transformers.models.glm.modeling_glm")
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
    positions = torch.tensor([0, 3, 7, 50, 1000])
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos_i, sin_i = (t[None] for t in cos_sin(positions, 16, interleaved=True, theta=10000.0))
    cos_h, sin_h = (t[None] for t in cos_sin(positions, 16, interleaved=False, theta=10000.0))
    expected = glm.apply_rotary_pos_emb(q, k, cos_h, sin_h)
    close(impl("eager.rope")(q, k, cos_i, sin_i, True), expected, tol=1e-4)
    close(CONTRACTS["posenc.rope"].reference(q, k, cos_i, sin_i, True), expected, tol=1e-4)
    sin_cos = gptj.create_sinusoidal_positions(1024, 16)[positions][None]  # (1, seq, d): sin half, cos half
    sin_j, cos_j = sin_cos[..., :8], sin_cos[..., 8:]
    expected_q = gptj.apply_rotary_pos_emb(q.transpose(1, 2), sin_j, cos_j).transpose(1, 2)
    close(impl("eager.rope")(q, k, cos_i, sin_i, True)[0], expected_q, tol=1e-4)


# --- norms -------------------------------------------------------------------------
def test_qwen3_qk_norm():
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    norm = qwen3.Qwen3RMSNorm(64, eps=1e-6)
    norm.weight.data = near(64, 1.0)
    x = torch.randn(2, 5, 4, 64)  # (batch, seq, heads, head_dim): q_proj's output as Qwen3Attention norms it
    expected = norm(x)
    for kernel_id in ("eager.qk_norm", "torch.qk_norm"):
        close(impl(kernel_id)(x, norm.weight.data, 1e-6), expected)
    close(CONTRACTS["norm.qk"].reference(x, norm.weight.data, 1e-6), expected)
    half = x.bfloat16()
    assert torch.equal(impl("eager.qk_norm")(half, norm.weight.data.bfloat16(), 1e-6), norm.bfloat16()(half))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma3_unit_offset_norms(dtype):
    """Gemma3RMSNorm: normalise in fp32, times (1 + weight) in fp32, one cast at the end; the
    same module norms hidden states and (as q_norm / k_norm) each head."""
    gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
    norm = gemma3.Gemma3RMSNorm(96, eps=1e-6)
    norm.weight.data = near(96, 0.0)
    x, residual = torch.randn(7, 96, dtype=dtype), torch.randn(7, 96, dtype=dtype)
    weight = norm.weight.data.to(dtype)
    expected = norm.to(dtype)(x)
    assert torch.equal(impl("eager.rms_norm")(x, weight, 1e-6, True), expected), "bit for bit, cast order included"
    out, total = impl("eager.rms_norm_add")(x, residual, weight, 1e-6, True)
    assert torch.equal(out, norm(x + residual)) and torch.equal(total, x + residual)
    heads = torch.randn(3, 4, 96, dtype=dtype)
    assert torch.equal(impl("eager.qk_norm")(heads, weight, 1e-6, True), norm(heads))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    close(impl("torch.rms_norm")(x, weight, 1e-6, True), expected, tol)
    close(CONTRACTS["norm.rms"].reference(x.float(), weight.float(), 1e-6, True), expected.float(), tol)


def test_cohere_layer_norm_without_bias():
    cohere = pytest.importorskip("transformers.models.cohere.modeling_cohere")
    norm = cohere.CohereLayerNorm(48, eps=1e-5, bias=False)
    norm.weight.data = near(48, 1.0)
    x = torch.randn(2, 5, 48)
    expected = norm(x)
    for kernel_id in ("eager.layer_norm", "torch.layer_norm"):
        close(impl(kernel_id)(x, norm.weight.data, None, 1e-5), expected)
    close(CONTRACTS["norm.layer"].reference(x, norm.weight.data, None, 1e-5), expected)


def test_olmo2_qk_norm_over_the_whole_projection():
    """OLMo 2 norms q and k over all heads at once: capture tunes it as norm.qk with one head of
    width heads x head_dim."""
    olmo2 = pytest.importorskip("transformers.models.olmo2.modeling_olmo2")
    norm = olmo2.Olmo2RMSNorm(64, eps=1e-6)
    norm.weight.data = near(64, 1.0)
    q = torch.randn(2, 5, 64)  # q_proj's output: 4 heads x 16
    expected = norm(q)
    for kernel_id in ("eager.qk_norm", "torch.qk_norm"):
        close(impl(kernel_id)(q[..., None, :], norm.weight.data, 1e-6)[..., 0, :], expected)


def test_partial_rotary_is_phis():
    """Phi (and StableLM, GPT-NeoX) rotate the first rotary_dim dims of each head and pass the rest
    through; capture sees apply_rotary_pos_emb called on the rotated part, so the rope op's d is it."""
    phi = pytest.importorskip("transformers.models.phi.modeling_phi")
    config = phi.PhiConfig(hidden_size=64, num_attention_heads=2, partial_rotary_factor=0.5)
    head_dim, rotary = 32, 16
    q, k = torch.randn(1, 2, 7, head_dim), torch.randn(1, 2, 7, head_dim)
    position_ids = torch.arange(7)[None]
    cos, sin = phi.PhiRotaryEmbedding(config)(q, position_ids)
    assert cos.shape[-1] == rotary
    q_rot, k_rot = phi.apply_rotary_pos_emb(q[..., :rotary], k[..., :rotary], cos, sin)
    got_q, got_k = Dispatcher().rope(q[..., :rotary].contiguous(), k[..., :rotary].contiguous(), cos, sin)
    close(got_q, q_rot)
    close(got_k, k_rot)


# --- activations -------------------------------------------------------------------
def test_gemma3_geglu_mlp():
    gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
    config = gemma3.Gemma3TextConfig(hidden_size=64, intermediate_size=96, hidden_activation="gelu_pytorch_tanh")
    mlp = gemma3.Gemma3MLP(config).eval()
    x = torch.randn(5, 64)
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    with torch.no_grad():
        expected = mlp(x)
        close(mlp.down_proj(impl("eager.geglu")(gate, up)), expected)
        close(mlp.down_proj(CONTRACTS["act.geglu"].reference(gate, up)), expected)


def test_gpt2_gelu_new_and_learned_positions():
    gpt2 = pytest.importorskip("transformers.models.gpt2.modeling_gpt2")
    config = gpt2.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    mlp = gpt2.GPT2MLP(4 * 32, config).eval()
    x = torch.randn(2, 3, 32)
    with torch.no_grad():  # Conv1D holds its weight as (in, out)
        hidden = F.linear(x, mlp.c_fc.weight.T, mlp.c_fc.bias)
        close(F.linear(impl("eager.gelu")(hidden), mlp.c_proj.weight.T, mlp.c_proj.bias), mlp(x))
    model = gpt2.GPT2Model(config).eval()
    seen = {}
    model.drop.register_forward_hook(lambda module, args, out: seen.update(embeds=args[0]))
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        model(ids)
        d = Dispatcher()
        tokens = d.embedding(ids, model.wte.weight)
        close(d.learned_positions(tokens, torch.arange(6)[None], model.wpe.weight), seen["embeds"])
        close(CONTRACTS["posenc.learned"].reference(tokens, torch.arange(6)[None], model.wpe.weight), seen["embeds"])


def test_gemma3_scaled_embedding():
    """sqrt(hidden) rounded to bf16 first (sqrt(640) = 25.298 becomes 25.25), as Gemma does."""
    gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
    embed = gemma3.Gemma3TextScaledWordEmbedding(100, 640, padding_idx=0, embed_scale=640 ** 0.5).bfloat16()
    ids = torch.randint(0, 100, (2, 9))
    expected = embed(ids)
    for kernel_id in ("eager.embedding", "torch.embedding"):
        assert torch.equal(impl(kernel_id)(ids, embed.weight.data, 640 ** 0.5), expected)


# --- attention ---------------------------------------------------------------------
def gemma_attention(q, k, v, window, softcap, kv_offset_of_queries):
    """Gemma3's eager_attention_forward with its sliding layer's mask from transformers' masking utils."""
    gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
    masking = pytest.importorskip("transformers.masking_utils")
    batch, hq, seq_q, d = q.shape
    mask = masking.eager_mask(batch, seq_q, k.shape[2], q_offset=kv_offset_of_queries,
                              mask_function=masking.sliding_window_causal_mask_function(window))
    module = types.SimpleNamespace(head_dim=d, num_key_value_groups=hq // k.shape[1], training=False)
    out, _ = gemma3.eager_attention_forward(module, q, k, v, mask, scaling=d ** -0.5, softcap=softcap)
    return out.transpose(1, 2)


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_sliding_window_attention_is_gemmas(softcap):
    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)
    options = (5, softcap or 0.0)
    expected = gemma_attention(q, k, v, 5, softcap, 0)  # prefill: query i at position i
    close(impl("eager.attention")(q, k, v, True, None, *options), expected)
    close(CONTRACTS["attention.prefill"].reference(q, k, v, True, None, *options), expected)
    decode = q[:, :, -1:]  # decode: the one query is the newest token, at position kv_len - 1
    expected = gemma_attention(decode, k, v, 5, softcap, 11)
    close(impl("eager.attention")(decode, k, v, False, None, *options), expected)
    close(CONTRACTS["attention.decode"].reference(decode, k, v, False, None, *options), expected)
    if softcap is None:  # SDPA takes the window as a mask, never a softcap
        close(impl("sdpa.default")(q, k, v, True, None, 5), gemma_attention(q, k, v, 5, None, 0))
        close(impl("sdpa.default")(decode, k, v, False, None, 5), expected)


@pytest.mark.parametrize("window", [0, 5])
def test_attention_sinks_are_gpt_oss(window):
    """Every CPU kernel declaring sinks, and the reference, against GPT-OSS's own eager attention
    (its sinks one more softmax column), prefill and decode, with and without its sliding window."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)
    sinks = torch.randn(4) + 1
    module = types.SimpleNamespace(num_key_value_groups=2, training=False, sinks=sinks)
    keep = torch.ones(12, 12, dtype=torch.bool).tril()
    if window:
        keep &= ~torch.ones(12, 12, dtype=torch.bool).tril(-window)
    for query, causal, mask in ((q, True, keep), (q[:, :, -1:], False, keep[-1:])):
        bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[None, None]
        expected = gpt_oss.eager_attention_forward(module, query, k, v, bias, scaling=0.25, s_aux=sinks)[0]
        args = (query, k, v, causal, 0.25, window, 0.0, sinks)
        op = "attention.prefill" if causal else "attention.decode"
        kernels = [s.kernel_id for s in registry.candidates(op) if "sinks" in s.features and "cpu" in s.platforms
                   and (not window or "sliding_window" in s.features)]
        assert "eager.attention" in kernels and (window or "sdpa.cpu_flash" in kernels), kernels
        for kernel_id in kernels:
            close(impl(kernel_id)(*args).transpose(1, 2), expected)
        close(CONTRACTS[op].reference(*args).transpose(1, 2), expected)


# --- Gated DeltaNet ----------------------------------------------------------------
def deltanet_inputs(batch, seq, hk, hv, dk, dv, normalised: bool):
    q, k = torch.randn(batch, seq, hk, dk), torch.randn(batch, seq, hk, dk)
    if normalised:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    # as Qwen3.5 makes them: g = -A softplus(a + dt_bias) with A drawn as its init does, beta = sigmoid(b)
    g = -torch.empty(hv).uniform_(0.01, 16) * F.softplus(torch.randn(batch, seq, hv) + 1)
    return q, k, torch.randn(batch, seq, hv, dv), g, torch.randn(batch, seq, hv).sigmoid()


@pytest.mark.parametrize("with_state,qk_l2norm", [(False, True), (True, True), (True, False)])
def test_gated_deltanet_prefill_is_qwen35s_chunked_rule(with_state, qk_l2norm):
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v, g, beta = deltanet_inputs(2, 37, 2, 4, 16, 8, normalised=not qk_l2norm)  # 37: not a chunk multiple
    state = torch.randn(2, 4, 16, 8) * 0.25 if with_state else None
    expected = qwen.torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=qk_l2norm)
    close(impl("eager.gated_deltanet")(q, k, v, g, beta, state, qk_l2norm), expected, tol=1e-4)
    close(CONTRACTS["recurrent.gated_deltanet"].reference(q, k, v, g, beta, state, qk_l2norm), expected, tol=1e-4)


@pytest.mark.parametrize("form", ["gated_deltanet_chunked", "gated_deltanet_recurrent"])
def test_both_gated_deltanet_forms_are_qwen35s_rule_over_several_chunks(form):
    """The fallback chunks a prompt (three chunks of 64 here, the last partial) and steps a decode."""
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v, g, beta = deltanet_inputs(1, 150, 1, 2, 16, 8, normalised=False)
    state = torch.randn(1, 2, 16, 8) * 0.25
    expected = qwen.torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
    close(getattr(recurrent_ops, form)(q, k, v, g, beta, state, True), expected, tol=1e-4)


@pytest.mark.parametrize("seq", [1, 3, 37])
def test_causal_conv1d_is_qwen35s_conv_for_a_prompt_and_a_decode_step(seq):
    """A prompt (shorter and longer than the kernel) from no state, and the decode step that rolls
    the cache's state: every CPU kernel and the reference against transformers' functions."""
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    batch, channels, width = 2, 24, 4
    x, weight = torch.randn(batch, seq, channels), torch.randn(channels, width) * 0.5
    expected = qwen.causal_conv1d_fn(x.transpose(1, 2), weight, None, activation="silu").transpose(1, 2)
    sig = Signature.make("conv.causal_depthwise", {"channels": channels, "width": width}, ("silu",), "fp32")
    kernels = [s.kernel_id for s in registry.candidates(sig.op) if not s.check(sig, device_info("cpu"))]
    assert {"eager.causal_conv1d", "compile.causal_conv1d"} <= set(kernels)
    for kernel_id in kernels:
        out, state = impl(kernel_id)(x, weight, None, None, True)
        close(out, expected)
        close(state, F.pad(x.transpose(1, 2), (width, 0))[..., -width:])  # the last width inputs
    close(CONTRACTS["conv.causal_depthwise"].reference(x, weight, None, None, True)[0], expected)
    step, cache_state = torch.randn(batch, 1, channels), torch.randn(batch, channels, width)
    theirs_state = cache_state.clone()
    expected = qwen.causal_conv1d_update(step.transpose(1, 2), theirs_state, weight, None, "silu").transpose(1, 2)
    for kernel_id in kernels:
        out, state = impl(kernel_id)(step, weight, None, cache_state.clone(), True)
        close(out, expected)
        close(state, theirs_state)


def test_deltanet_gates_are_what_qwen35s_forward_hands_the_delta_rule(monkeypatch):
    """g and beta from the module's own a and b projections, A_log and dt_bias, as its forward computes them."""
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    config = qwen.Qwen3_5TextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
                                    linear_key_head_dim=8, linear_value_head_dim=8, layer_types=["linear_attention"],
                                    num_hidden_layers=1)
    torch.manual_seed(5)
    module = qwen.Qwen3_5GatedDeltaNet(config, 0).eval()
    seen = {}

    def spy(query, key, value, g, beta, **kwargs):
        seen.update(g=g, beta=beta)
        return torch.zeros_like(value), None
    monkeypatch.setattr(qwen, "torch_chunk_gated_delta_rule", spy)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        module(x)
        a, b = module.in_proj_a(x), module.in_proj_b(x)
    for kernel_id in ("eager.deltanet_gates", "compile.deltanet_gates"):
        close(impl(kernel_id)(a, b, module.A_log, module.dt_bias), (seen["g"], seen["beta"]))
    close(CONTRACTS["recurrent.deltanet_gates"].reference(a, b, module.A_log.detach(), module.dt_bias.detach()),
          (seen["g"], seen["beta"]))


def test_gated_deltanet_decode_is_qwen35s_recurrent_rule():
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v, g, beta = deltanet_inputs(3, 1, 2, 4, 16, 8, normalised=False)
    state = torch.randn(3, 4, 16, 8) * 0.25
    expected = qwen.torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
    close(Dispatcher().gated_deltanet(q, k, v, g, beta, state), expected)
    close(CONTRACTS["recurrent.gated_deltanet"].reference(q, k, v, g, beta, state, True), expected)


# --- mixture of experts ---------------------------------------------------------------------------
MOE_EXPERTS = {  # model type -> (config class, experts class, the config's expert count and width keys)
    "mixtral": ("MixtralConfig", "MixtralExperts", "num_local_experts", "intermediate_size"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeExperts", "num_experts", "moe_intermediate_size"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeExperts", "num_experts", "moe_intermediate_size"),
    "phimoe": ("PhimoeConfig", "PhimoeExperts", "num_local_experts", "intermediate_size"),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeExperts", "num_local_experts", "intermediate_size"),
    # biases, gate and up rows in turn, clamped SwiGLU, weights stored (experts, in, out)
    "gpt_oss": ("GptOssConfig", "GptOssExperts", "num_local_experts", "intermediate_size"),
}


@pytest.mark.parametrize("model_type", sorted(MOE_EXPERTS))
def test_moe_experts_are_transformers_experts(model_type):
    """Every routed-experts kernel on CPU, the reference and the Dispatcher against the model's
    own experts module (its eager loop) on random weights and a skewed routing."""
    module = pytest.importorskip(f"transformers.models.{model_type}.modeling_{model_type}")
    config_class, experts_class, count_key, width_key = MOE_EXPERTS[model_type]
    config = getattr(module, config_class)(hidden_size=32, **{count_key: 6, width_key: 24},
                                           num_experts_per_tok=2, experts_implementation="eager")
    experts = getattr(module, experts_class)(config)
    for name, p in experts.named_parameters():  # std 2: GPT-OSS's clamps (at 7) bite on some entries
        torch.nn.init.normal_(p, std=0.1 if "bias" in name else 2 * min(p.shape[1:]) ** -0.5)
    from runtime_loader.integrations.modules import _classify_experts, experts_arguments
    from runtime_loader.ops.moe import routing
    x = torch.randn(11, 32) * 2
    ids, weights = routing(11, 6, 2, torch.float32, "cpu", torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = experts(x, ids, weights)
        args = (x, ids, weights, *experts_arguments(experts, _classify_experts(experts)))
        for kernel_id in ("eager.moe_experts", "torch.grouped_mm"):
            close(impl(kernel_id)(*args), expected, tol=1e-5)
        close(CONTRACTS["moe.experts"].reference(*args), expected, tol=1e-5)
        close(Dispatcher().moe_experts(*args), expected, tol=1e-5)


MOE_ROUTERS = {"mixtral": ("MixtralConfig", "MixtralTopKRouter", "num_local_experts", True),
               "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeTopKRouter", "num_experts", False),
               "granitemoe": ("GraniteMoeConfig", "GraniteMoeTopKRouter", "num_local_experts", True)}


@pytest.mark.parametrize("model_type", sorted(MOE_ROUTERS))
def test_moe_router_is_transformers_router(model_type):
    """softmax top-k of the logits (renormalised where the family does: GraniteMoE's softmax over
    the top-k logits is the same), ids equal, on logits with no ties."""
    module = pytest.importorskip(f"transformers.models.{model_type}.modeling_{model_type}")
    config_class, router_class, count_key, renorm = MOE_ROUTERS[model_type]
    config = getattr(module, config_class)(hidden_size=32, num_experts_per_tok=3, **{count_key: 12})
    router = getattr(module, router_class)(config)
    torch.nn.init.normal_(router.weight, std=1.0)
    x = torch.randn(9, 32)
    with torch.no_grad():
        logits, weights, ids = router(x)
        for kernel_id in ("eager.moe_router", "compile.moe_router"):
            got_weights, got_ids = impl(kernel_id)(x @ router.weight.T, 3, renorm)
            assert torch.equal(got_ids, ids)
            close(got_weights, weights.float(), tol=1e-5)
        close(CONTRACTS["moe.router"].reference(logits, 3, renorm)[0], weights.float(), tol=1e-5)

"""Models: the catalogue, config.json reading and its errors, and what capture makes of each family:
hand-derived signatures and calls per forward (sharded too), layer patterns read from each
family's own keys, the features each family needs, what no op covers, and the sizes `lzsolve
models` lists, checked against transformers' own config classes."""
import json

import pytest
from click.testing import CliRunner

from lzsolve.cli import cli
from lzsolve.errors import LzError
from lzsolve.models import CATALOGUE
from lzsolve.models.capture import capture, load
from lzsolve.models.config import read_config
from runtime_loader.ops import required_features


def captured(model: str, tp: int = 1):
    return capture(CATALOGUE[model], model, tp)


def ops_of(model: str, tp: int = 1) -> dict[str, int]:
    """signature -> calls per forward"""
    return {str(o.signature): o.calls_per_forward for o in captured(model, tp).instances}


def roles_of(model: str, tp: int = 1) -> dict[str, tuple[str, ...]]:
    return {str(o.signature): o.roles for o in captured(model, tp).instances}


def sizes(c) -> tuple:
    """(layers, hidden, heads, kv heads, head_dim, MLP width, vocab) of a capture, each seen once."""
    size = c.sizes()
    (hidden,), (hq,), (hkv,), (d,), (mlp,), (vocab,) = (size[k] for k in ("hidden", "hq", "hkv", "d", "mlp", "vocab"))
    return c.layers, hidden, hq, hkv, d, mlp, vocab


def features(c) -> dict[str, frozenset[str]]:
    """Per op, the features a kernel must declare to compute every signature of it."""
    found: dict[str, frozenset[str]] = {}
    for instance in c.instances:
        sig = instance.signature
        found[sig.op] = found.get(sig.op, frozenset()) | required_features(sig)
    return found


def test_catalogue_has_real_llama3_values():
    assert sizes(captured("llama3-70b")) == (80, 8192, 64, 8, 128, 28672, 128256)
    assert sizes(captured("llama3-8b")) == (32, 4096, 32, 8, 128, 14336, 128256)


@pytest.mark.parametrize("name", list(CATALOGUE))
@pytest.mark.parametrize("tp", [1, 2])
def test_every_catalogue_entry_captures(name, tp):
    c = captured(name, tp)
    ops = c.instances
    assert ops and len({o.signature for o in ops}) == len(ops)
    assert ops[0].signature.op == "embedding"
    assert [o.signature.op for o in ops if o.roles == ("lm_head",)] == ["linear"]
    assert c.covered == 1.0, "every parameter is in a module an op covers"
    assert all(isinstance(line, str) and "\n" not in line for line in c.notes)


def test_unknown_model_lists_known_names():
    with pytest.raises(LzError) as e:
        load("llama9", None)
    for name in CATALOGUE:
        assert name in str(e.value)


def test_config_file_round_trip(tmp_path):
    name = "gemma3-4b"  # a vision-language config.json: the text model nested under text_config
    path = tmp_path / "mymodel" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CATALOGUE[name]))
    for given in (path, path.parent):  # the file, or the folder holding it
        c = load(None, str(given))
        assert c.name == "mymodel"
        assert c.config_hash == captured(name).config_hash
        assert c.instances == captured(name).instances


def test_a_config_file_names_the_model_by_its_folder_or_its_stem(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "other.json").write_text("{}")
    assert read_config(tmp_path / "m") == ({}, "m")
    assert read_config(tmp_path / "other.json") == ({}, "other")


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({**CATALOGUE["llama3-8b"], "num_attention_heads": 0}), "transformers cannot read this config"),
    (json.dumps({**CATALOGUE["llama3-8b"], "num_key_value_heads": 5}), "not a multiple of num_key_value_heads 5"),
    (json.dumps({**CATALOGUE["llama3-8b"], "rope_theta": "big"}), "transformers cannot build llama"),
    (json.dumps({**CATALOGUE["llama3-8b"], "rope_parameters": [1]}), "rope_parameters"),
    (json.dumps({**CATALOGUE["llama3-8b"], "layer_types": ["full_attention"]}), "number of `layer_types` \\(1\\)"),
    (json.dumps({**CATALOGUE["llama3-8b"], "layer_types": ["sliding_attention"] * 32}), "cannot run LlamaForCausalLM"),
    (json.dumps({**CATALOGUE["gemma3-1b"], "sliding_window": None}), "cannot run Gemma3ForCausalLM"),
    (json.dumps({**CATALOGUE["qwen3.5-0.8b"], "text_config": [1]}), "'text_config' must be an object"),
])
def test_malformed_configs_are_named_in_one_line(tmp_path, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(LzError, match=needle) as e:
        load(None, str(path))
    assert "\n" not in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(LzError, match="cannot read"):
        load(None, str(tmp_path / "absent.json"))


# --- the capability gate: what no op computes is refused by name, in one line --------------

MLA_ELSEWHERE = "multi-head latent attention (MLA) other than DeepSeek-V2/V3's"


@pytest.mark.parametrize("base,extra,named", [
    # MLA is captured for DeepSeek-V2/V3 (test_deepseek_*), refused for the other types that have it
    ("llama3-8b", {"model_type": "minicpm3", "kv_lora_rank": 256, "q_lora_rank": 768},
     [f"{MLA_ELSEWHERE} ('kv_lora_rank')", f"{MLA_ELSEWHERE} ('q_lora_rank')"]),
    ("llama3-8b", {"kv_lora_rank": 512}, [f"{MLA_ELSEWHERE} ('kv_lora_rank')"]),
    ("gpt2", {"add_cross_attention": True}, ["cross-attention ('add_cross_attention')"]),
    ("gemma3-270m", {"use_bidirectional_attention": True}, ["bidirectional (non-causal) attention"]),
    ("llama3-8b", {"quantization_config": {"quant_method": "fp8"}}, ["quantized weights (fp8)"]),
])
def test_unsupported_parts_are_refused_by_name(base, extra, named):
    with pytest.raises(LzError) as e:
        capture({**CATALOGUE[base], **extra}, "x")
    message = str(e.value)
    assert "\n" not in message and "not supported yet" in message
    assert all(part in message for part in named), message


def test_a_model_without_attention_is_refused():
    with pytest.raises(LzError, match="runs no attention; its token mixer is not supported"):
        capture({**CATALOGUE["llama3-8b"], "model_type": "falcon_mamba"}, "x")


def test_inert_keys_are_not_refused():
    """Dense checkpoints often carry these keys at 0, false, null or empty: nothing to refuse."""
    inert = {"num_experts": 0, "mlp_only_layers": [], "kv_lora_rank": None, "add_cross_attention": False}
    assert capture({**CATALOGUE["qwen3-8b"], **inert}, "x").family == "qwen3"


def test_unsupported_parts_inside_text_config_are_refused():
    cfg = CATALOGUE["qwen3.5-0.8b"]
    with pytest.raises(LzError, match="bidirectional"):
        capture({**cfg, "text_config": {**cfg["text_config"], "use_bidirectional_attention": True}}, "x")


def test_an_activation_no_op_computes_is_noted_not_refused():
    relu = capture({**CATALOGUE["llama3-8b"], "hidden_act": "relu"}, "x")
    assert "model.layers.*.mlp.act_fn: gated relu activation: no op computes it" in relu.notes
    assert not any(o.signature.op.startswith("act.") for o in relu.instances)
    gelu = capture({**CATALOGUE["gpt2"], "activation_function": "gelu"}, "x")  # GPT-2's is gelu_new (tanh)
    assert "transformer.h.*.mlp.act: gelu activation: no op computes it" in gelu.notes


# --- TP sharding ------------------------------------------------------------------------------

def test_tp_shards_heads_mlp_and_vocab():
    assert sizes(captured("llama3-70b", 8))[2:] == (8, 1, 128, 3584, 16032)
    assert captured("llama3-70b", 16).sizes()["hkv"] == (1,), "kv heads are replicated, never below 1"
    assert captured("llama3-70b", 8).tp == 8


def test_replicated_kv_heads_keep_a_whole_head_in_the_qkv_gemm():
    """Once tp exceeds the kv heads, every rank holds one whole kv head: the q/k/v GEMM makes its
    share of q and one head each of k and v, as the attention after it reads them."""
    assert "linear[k=8192,n=768,bf16]" in ops_of("llama3-70b", 16)  # (4 + 2*1) * 128
    assert "linear[k=1024,n=1536,bf16]" in ops_of("qwen3.5-0.8b", 4)  # q and its gate (2*2*256), k and v (2*256)
    transformers = pytest.importorskip("transformers")
    phi3 = {**transformers.AutoConfig.for_model("phi3").to_dict(), "num_key_value_heads": 2, "num_hidden_layers": 2}
    qkv = [o for o in capture(phi3, "phi3", tp=4).instances if o.roles == ("model.layers.*.self_attn.qkv_proj",)]
    assert [str(o.signature) for o in qkv] == ["linear[k=3072,n=960,bf16]"], "one module: (8 + 2*1) * 96"


def test_tp_shards_linear_attention_heads():
    ops = ops_of("qwen3.5-0.8b", 4)
    assert "recurrent.gated_deltanet[hk=4,hv=4,dk=128,dv=128,qk_l2norm,bf16]" in ops
    assert "conv.causal_depthwise[channels=1536,width=4,silu,bf16]" in ops  # q, k (2*4*128) and v (4*128)
    assert "attention.prefill[hq=2,hkv=1,d=256,causal,qk_norm,bf16]" in ops
    assert captured("gemma3-270m", 4).sizes()["hkv"] == (1,)


@pytest.mark.parametrize("tp", [0, 3, 7, 128])
def test_impossible_tp(tp):
    with pytest.raises(LzError, match="--tp"):
        captured("llama3-70b", tp)


def test_tp_must_divide_linear_attention_heads():
    cfg = CATALOGUE["qwen3.5-0.8b"]  # 16 key and 16 value heads in its linear-attention layers
    text = {**cfg["text_config"], "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 3200}
    with pytest.raises(LzError, match="does not divide 16/16 linear-attention key/value heads"):
        capture({**cfg, "text_config": text}, "x", 32)


# --- per family: hand-derived signatures and calls per forward, against what capture observes --------

def test_llama3_70b_tp8():
    found = ops_of("llama3-70b", 8)
    expected = {
        "embedding[vocab=16032,hidden=8192,bf16]": 1,
        "norm.rms[hidden=8192,bf16]": 1,  # the first layer's input norm: no residual yet
        "norm.rms_add[hidden=8192,bf16]": 160,  # every other norm adds the residual stream first
        "linear[k=8192,n=1280,bf16]": 80,  # qkv: (8 + 2*1) * 128
        "posenc.rope[hq=8,hkv=1,d=128,layout=split_half,bf16]": 80,
        "attention.prefill[hq=8,hkv=1,d=128,causal,bf16]": 80,
        "attention.decode[hq=8,hkv=1,d=128,bf16]": 80,
        "linear[k=1024,n=8192,bf16]": 80,  # o_proj
        "linear[k=8192,n=7168,bf16]": 80,  # gate_up
        "act.swiglu[width=3584,bf16]": 80,
        "linear[k=3584,n=8192,bf16]": 80,  # down
        "linear[k=8192,n=16032,bf16]": 1,  # lm_head
    }
    assert found == expected
    roles = roles_of("llama3-70b", 8)
    assert roles["linear[k=8192,n=16032,bf16]"] == ("lm_head",)
    assert roles["norm.rms[hidden=8192,bf16]"] == ("model.layers.*.input_layernorm",)  # layer 0's
    assert set(roles["norm.rms_add[hidden=8192,bf16]"]) == {
        "model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm", "model.norm"}


# deepseek-ai/DeepSeek-V2-Lite's config.json (its auto_map left out): MLA without a q latent
# (q_lora_rank null: q_proj), 64 routed experts of which 6 per token (greedy softmax routing) beside
# 2 shared ones, the first layer dense
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 102400,
    "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "routed_scaling_factor": 1.0, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": False, "scoring_func": "softmax",
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False, "bos_token_id": 100000,
    "eos_token_id": 100001,
}
DEEPSEEK_NOTES = ("model.layers.*.mlp.gate: {} ({} module(s), 0.0% of the parameters): no op covers it",
                  "model.layers.*.self_attn: rotary embedding in a form no op computes")


def test_deepseek_v2_lite_mla():
    """MLA: q (16 heads of 128 + 64 RoPE dims) and the kv latent (512) with k's shared RoPE part (64)
    read the hidden states in one GEMM; kv_b_proj expands the normed latent into k's 128 and v's 128
    per head; attention runs with q/k of 192 and v of 128 (dv). Under TP 8 the heads divide (q_proj,
    kv_b_proj, o_proj) and kv_a_proj_with_mqa stays whole on every rank (384 + 576)."""
    c = capture(DEEPSEEK_V2_LITE, "deepseek-v2-lite")
    assert {str(o.signature): o.calls_per_forward for o in c.instances} == {
        "embedding[vocab=102400,hidden=2048,bf16]": 1,
        "norm.rms[hidden=2048,bf16]": 1,
        "linear[k=2048,n=3648,bf16]": 27,  # q_proj + kv_a_proj_with_mqa: 16 * 192 + 512 + 64
        "norm.rms[hidden=512,bf16]": 27,  # kv_a_layernorm: the latent's rows, not a per-head q/k norm
        "linear[k=512,n=4096,bf16]": 27,  # kv_b_proj: 16 * (128 + 128)
        "attention.prefill[hq=16,hkv=16,d=192,dv=128,causal,bf16]": 27,
        "attention.decode[hq=16,hkv=16,d=192,dv=128,bf16]": 27,
        "linear[k=2048,n=2048,bf16]": 27,  # o_proj: 16 * 128
        "norm.rms_add[hidden=2048,bf16]": 54,
        "linear[k=2048,n=21888,bf16]": 1,  # the dense first layer's gate_up
        "act.swiglu[width=10944,bf16]": 1,
        "linear[k=10944,n=2048,bf16]": 1,
        "moe.experts[experts=64,top_k=6,hidden=2048,inter=1408,bf16]": 26,
        "linear[k=2048,n=5632,bf16]": 26,  # the shared experts' gate_up: 2 * 1408 twice
        "act.swiglu[width=2816,bf16]": 26,
        "linear[k=2816,n=2048,bf16]": 26,
        "linear[k=2048,n=102400,bf16]": 1,
    }
    roles = {str(o.signature): o.roles for o in c.instances}
    assert roles["linear[k=2048,n=3648,bf16]"] == ("model.layers.*.self_attn.q_proj+kv_a_proj_with_mqa",)
    assert roles["norm.rms[hidden=512,bf16]"] == ("model.layers.*.self_attn.kv_a_layernorm",)
    # 64 experts: the unsorted top-k's order is not moe.router's (its form is checked by running it)
    assert c.notes == (DEEPSEEK_NOTES[0].format("DeepseekV2TopkRouter", 26), DEEPSEEK_NOTES[1])
    assert {str(o.signature): o.calls_per_forward for o in capture(DEEPSEEK_V2_LITE, "deepseek-v2-lite", 8).instances} == {
        "embedding[vocab=12800,hidden=2048,bf16]": 1,
        "norm.rms[hidden=2048,bf16]": 1,
        "linear[k=2048,n=960,bf16]": 27,  # q_proj's share, 2 * 192, and the whole kv_a_proj_with_mqa, 576
        "norm.rms[hidden=512,bf16]": 27,
        "linear[k=512,n=512,bf16]": 27,  # kv_b_proj: 2 * (128 + 128)
        "attention.prefill[hq=2,hkv=2,d=192,dv=128,causal,bf16]": 27,
        "attention.decode[hq=2,hkv=2,d=192,dv=128,bf16]": 27,
        "linear[k=256,n=2048,bf16]": 27,  # o_proj: row-parallel over 2 * 128
        "norm.rms_add[hidden=2048,bf16]": 54,
        "linear[k=2048,n=2736,bf16]": 1,
        "act.swiglu[width=1368,bf16]": 1,
        "linear[k=1368,n=2048,bf16]": 1,
        "moe.experts[experts=64,top_k=6,hidden=2048,inter=176,bf16]": 26,
        "linear[k=2048,n=704,bf16]": 26,
        "act.swiglu[width=352,bf16]": 26,
        "linear[k=352,n=2048,bf16]": 26,
        "linear[k=2048,n=12800,bf16]": 1,
    }


def test_deepseek_v3_mla():
    """transformers' DeepseekV3Config defaults (DeepSeek-V3's sizes): a q latent too (q_a_proj 1536,
    q_a_layernorm, q_b_proj), read with the kv latent's GEMM; 3 dense layers, then 256 routed experts
    (8 per token, grouped sigmoid routing: no op computes it, named) beside a shared one. Under TP 8
    both latent projections are whole on every rank, the heads and widths divide."""
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config().to_dict()
    c = capture(cfg, "deepseek-v3")
    assert {str(o.signature): o.calls_per_forward for o in c.instances} == {
        "embedding[vocab=129280,hidden=7168,bf16]": 1,
        "norm.rms[hidden=7168,bf16]": 1,
        "linear[k=7168,n=2112,bf16]": 61,  # q_a_proj + kv_a_proj_with_mqa: 1536 + 512 + 64
        "norm.rms[hidden=1536,bf16]": 61,  # q_a_layernorm
        "linear[k=1536,n=24576,bf16]": 61,  # q_b_proj: 128 * 192
        "norm.rms[hidden=512,bf16]": 61,  # kv_a_layernorm
        "linear[k=512,n=32768,bf16]": 61,  # kv_b_proj: 128 * (128 + 128)
        "attention.prefill[hq=128,hkv=128,d=192,dv=128,causal,bf16]": 61,
        "attention.decode[hq=128,hkv=128,d=192,dv=128,bf16]": 61,
        "linear[k=16384,n=7168,bf16]": 61,  # o_proj: 128 * 128
        "norm.rms_add[hidden=7168,bf16]": 122,
        "linear[k=7168,n=36864,bf16]": 3,
        "act.swiglu[width=18432,bf16]": 3,
        "linear[k=18432,n=7168,bf16]": 3,
        "moe.experts[experts=256,top_k=8,hidden=7168,inter=2048,bf16]": 58,
        "linear[k=7168,n=4096,bf16]": 58,
        "act.swiglu[width=2048,bf16]": 58,
        "linear[k=2048,n=7168,bf16]": 58,
        "linear[k=7168,n=129280,bf16]": 1,
    }
    assert c.notes == (DEEPSEEK_NOTES[0].format("DeepseekV3TopkRouter", 58), DEEPSEEK_NOTES[1])
    assert features(c)["attention.prefill"] == {"causal", "v_head_dim"}
    assert {str(o.signature): o.calls_per_forward for o in capture(cfg, "deepseek-v3", 8).instances} == {
        "embedding[vocab=16160,hidden=7168,bf16]": 1,
        "norm.rms[hidden=7168,bf16]": 1,
        "linear[k=7168,n=2112,bf16]": 61,  # replicated: every rank computes both latents whole
        "norm.rms[hidden=1536,bf16]": 61,
        "linear[k=1536,n=3072,bf16]": 61,
        "norm.rms[hidden=512,bf16]": 61,
        "linear[k=512,n=4096,bf16]": 61,
        "attention.prefill[hq=16,hkv=16,d=192,dv=128,causal,bf16]": 61,
        "attention.decode[hq=16,hkv=16,d=192,dv=128,bf16]": 61,
        "linear[k=2048,n=7168,bf16]": 61,
        "norm.rms_add[hidden=7168,bf16]": 122,
        "linear[k=7168,n=4608,bf16]": 3,
        "act.swiglu[width=2304,bf16]": 3,
        "linear[k=2304,n=7168,bf16]": 3,
        "moe.experts[experts=256,top_k=8,hidden=7168,inter=256,bf16]": 58,
        "linear[k=7168,n=512,bf16]": 58,
        "act.swiglu[width=256,bf16]": 58,
        "linear[k=256,n=7168,bf16]": 58,
        "linear[k=7168,n=16160,bf16]": 1,
    }
    with pytest.raises(LzError, match="--tp 3 cannot shard"):
        capture(cfg, "deepseek-v3", 3)


def test_deepseek_v2_defaults():
    """transformers' DeepseekV2Config defaults: a q latent (1536) like V3's, 32 heads, every layer MoE.
    They leave num_experts_per_tok unset, which transformers' own routing cannot run: refused in one
    line; with it set, they plan. Their expert width, 1407, divides by no TP."""
    from transformers import DeepseekV2Config
    with pytest.raises(LzError, match=r"^d: cannot run DeepseekV2ForCausalLM to capture its ops \(TypeError: topk"):
        capture(DeepseekV2Config().to_dict(), "d")
    cfg = DeepseekV2Config(num_experts_per_tok=6).to_dict()
    found = {str(o.signature): o.calls_per_forward for o in capture(cfg, "deepseek-v2").instances}
    assert {"linear[k=4096,n=2112,bf16]": 32, "norm.rms[hidden=1536,bf16]": 32, "linear[k=1536,n=6144,bf16]": 32,
            "linear[k=512,n=8192,bf16]": 32, "attention.prefill[hq=32,hkv=32,d=192,dv=128,causal,bf16]": 32,
            "linear[k=4096,n=4096,bf16]": 32, "moe.experts[experts=64,top_k=6,hidden=4096,inter=1407,bf16]": 32,
            }.items() <= found.items(), found
    with pytest.raises(LzError, match="--tp 8 cannot shard deepseek-v2: it does not divide MLP width 2814, expert width 1407"):
        capture(cfg, "deepseek-v2", 8)


def test_gpt2():
    # 12 layers, hidden 768, 12 heads of 64, MLP 4 * 768, every projection with a bias
    assert ops_of("gpt2") == {
        "embedding[vocab=50257,hidden=768,bf16]": 1,
        "posenc.learned[hidden=768,bf16]": 1,
        "norm.layer[hidden=768,bf16]": 25,  # ln_1 and ln_2 per layer, ln_f
        "linear[k=768,n=2304,bias,bf16]": 12,  # c_attn: q, k, v
        "attention.prefill[hq=12,hkv=12,d=64,causal,bf16]": 12,
        "attention.decode[hq=12,hkv=12,d=64,bf16]": 12,
        "linear[k=768,n=768,bias,bf16]": 12,  # attn c_proj
        "linear[k=768,n=3072,bias,bf16]": 12,  # mlp c_fc
        "act.gelu[width=3072,bf16]": 12,
        "linear[k=3072,n=768,bias,bf16]": 12,  # mlp c_proj
        "linear[k=768,n=50257,bf16]": 1,  # lm_head (tied to the embedding, no bias)
    }
    # tp 4: 3 heads; MLP 768 wide, so c_fc and the MLP's c_proj share one signature; vocab 50257 / 4 padded
    assert ops_of("gpt2", 4) == {
        "embedding[vocab=12565,hidden=768,bf16]": 1,
        "posenc.learned[hidden=768,bf16]": 1,
        "norm.layer[hidden=768,bf16]": 25,
        "linear[k=768,n=576,bias,bf16]": 12,  # (3 + 2*3) * 64
        "attention.prefill[hq=3,hkv=3,d=64,causal,bf16]": 12,
        "attention.decode[hq=3,hkv=3,d=64,bf16]": 12,
        "linear[k=192,n=768,bias,bf16]": 12,
        "linear[k=768,n=768,bias,bf16]": 24,
        "act.gelu[width=768,bf16]": 12,
        "linear[k=768,n=12565,bf16]": 1,
    }
    assert roles_of("gpt2", 4)["linear[k=768,n=768,bias,bf16]"] == ("transformer.h.*.mlp.c_fc",
                                                                    "transformer.h.*.mlp.c_proj")


def test_untied_llama_nanbeige():
    assert captured("nanbeige4.1-3b").family == "llama"
    assert ops_of("nanbeige4.1-3b") == {
        "embedding[vocab=166144,hidden=2560,bf16]": 1,
        "norm.rms[hidden=2560,bf16]": 1,
        "norm.rms_add[hidden=2560,bf16]": 64,
        "linear[k=2560,n=3584,bf16]": 32,  # (20 + 2*4) * 128
        "posenc.rope[hq=20,hkv=4,d=128,layout=split_half,bf16]": 32,
        "attention.prefill[hq=20,hkv=4,d=128,causal,bf16]": 32,
        "attention.decode[hq=20,hkv=4,d=128,bf16]": 32,
        "linear[k=2560,n=2560,bf16]": 32,
        "linear[k=2560,n=20992,bf16]": 32,
        "act.swiglu[width=10496,bf16]": 32,
        "linear[k=10496,n=2560,bf16]": 32,
        "linear[k=2560,n=166144,bf16]": 1,
    }
    assert ops_of("nanbeige4.1-3b", 4) == {
        "embedding[vocab=41536,hidden=2560,bf16]": 1,
        "norm.rms[hidden=2560,bf16]": 1,
        "norm.rms_add[hidden=2560,bf16]": 64,
        "linear[k=2560,n=896,bf16]": 32,  # (5 + 2*1) * 128
        "posenc.rope[hq=5,hkv=1,d=128,layout=split_half,bf16]": 32,
        "attention.prefill[hq=5,hkv=1,d=128,causal,bf16]": 32,
        "attention.decode[hq=5,hkv=1,d=128,bf16]": 32,
        "linear[k=640,n=2560,bf16]": 32,
        "linear[k=2560,n=5248,bf16]": 32,
        "act.swiglu[width=2624,bf16]": 32,
        "linear[k=2624,n=2560,bf16]": 32,
        "linear[k=2560,n=41536,bf16]": 1,
    }


def test_qwen2_bias_on_qkv_only():
    assert ops_of("qwen2-0.5b") == {
        "embedding[vocab=151936,hidden=896,bf16]": 1,
        "norm.rms[hidden=896,bf16]": 1,
        "norm.rms_add[hidden=896,bf16]": 48,
        "linear[k=896,n=1152,bias,bf16]": 24,  # q, k, v carry a bias: (14 + 2*2) * 64
        "posenc.rope[hq=14,hkv=2,d=64,layout=split_half,bf16]": 24,
        "attention.prefill[hq=14,hkv=2,d=64,causal,bf16]": 24,
        "attention.decode[hq=14,hkv=2,d=64,bf16]": 24,
        "linear[k=896,n=896,bf16]": 24,  # o_proj has none
        "linear[k=896,n=9728,bf16]": 24,
        "act.swiglu[width=4864,bf16]": 24,
        "linear[k=4864,n=896,bf16]": 24,
        "linear[k=896,n=151936,bf16]": 1,
    }
    assert ops_of("qwen2-0.5b", 2) == {
        "embedding[vocab=75968,hidden=896,bf16]": 1,
        "norm.rms[hidden=896,bf16]": 1,
        "norm.rms_add[hidden=896,bf16]": 48,
        "linear[k=896,n=576,bias,bf16]": 24,  # (7 + 2*1) * 64
        "posenc.rope[hq=7,hkv=1,d=64,layout=split_half,bf16]": 24,
        "attention.prefill[hq=7,hkv=1,d=64,causal,bf16]": 24,
        "attention.decode[hq=7,hkv=1,d=64,bf16]": 24,
        "linear[k=448,n=896,bf16]": 24,
        "linear[k=896,n=4864,bf16]": 24,
        "act.swiglu[width=2432,bf16]": 24,
        "linear[k=2432,n=896,bf16]": 24,
        "linear[k=896,n=75968,bf16]": 1,
    }


def test_qwen3_qk_norm():
    assert ops_of("qwen3-0.6b") == {
        "embedding[vocab=151936,hidden=1024,bf16]": 1,
        "norm.rms[hidden=1024,bf16]": 1,
        "norm.rms_add[hidden=1024,bf16]": 56,
        "linear[k=1024,n=4096,bf16]": 28,  # (16 + 2*8) * 128: head_dim 128 is not 1024 / 16
        "norm.qk[heads=16,d=128,bf16]": 28,  # q_norm
        "norm.qk[heads=8,d=128,bf16]": 28,  # k_norm
        "posenc.rope[hq=16,hkv=8,d=128,layout=split_half,bf16]": 28,
        "attention.prefill[hq=16,hkv=8,d=128,causal,qk_norm,bf16]": 28,
        "attention.decode[hq=16,hkv=8,d=128,qk_norm,bf16]": 28,
        "linear[k=2048,n=1024,bf16]": 28,
        "linear[k=1024,n=6144,bf16]": 28,
        "act.swiglu[width=3072,bf16]": 28,
        "linear[k=3072,n=1024,bf16]": 28,
        "linear[k=1024,n=151936,bf16]": 1,
    }
    assert ops_of("qwen3-0.6b", 2) == {
        "embedding[vocab=75968,hidden=1024,bf16]": 1,
        "norm.rms[hidden=1024,bf16]": 1,
        "norm.rms_add[hidden=1024,bf16]": 56,
        "linear[k=1024,n=2048,bf16]": 28,
        "norm.qk[heads=8,d=128,bf16]": 28,
        "norm.qk[heads=4,d=128,bf16]": 28,
        "posenc.rope[hq=8,hkv=4,d=128,layout=split_half,bf16]": 28,
        "attention.prefill[hq=8,hkv=4,d=128,causal,qk_norm,bf16]": 28,
        "attention.decode[hq=8,hkv=4,d=128,qk_norm,bf16]": 28,
        "linear[k=1024,n=1024,bf16]": 28,
        "linear[k=1024,n=3072,bf16]": 28,
        "act.swiglu[width=1536,bf16]": 28,
        "linear[k=1536,n=1024,bf16]": 28,
        "linear[k=1024,n=75968,bf16]": 1,
    }


def test_qwen3_5_hybrid():
    # 18 Gated DeltaNet layers (16/16 heads of 128) and 6 gated full-attention layers (8/2 heads
    # of 256, RoPE on the first 64 dims); (1 + weight) norms everywhere but the GDN output norm
    assert ops_of("qwen3.5-0.8b") == {
        "embedding[vocab=248320,hidden=1024,bf16]": 1,
        "norm.rms[hidden=1024,unit_offset,bf16]": 1,
        "norm.rms_add[hidden=1024,unit_offset,bf16]": 48,
        # in_proj_qkv + in_proj_z (2*16*128 + 2*16*128) + in_proj_b + in_proj_a (one per value head each)
        "linear[k=1024,n=8224,bf16]": 18,
        "conv.causal_depthwise[channels=6144,width=4,silu,bf16]": 18,  # over q, k (2*16*128) and v (16*128)
        "recurrent.deltanet_gates[heads=16,bf16]": 18,
        "recurrent.gated_deltanet[hk=16,hv=16,dk=128,dv=128,qk_l2norm,bf16]": 18,
        "norm.rms[hidden=128,bf16]": 18,  # the gated output norm, per value head...
        "act.swiglu[width=2048,bf16]": 18,  # ...times silu(z)
        "linear[k=2048,n=1024,bf16]": 24,  # GDN out_proj and attention o_proj: both 2048 -> 1024
        "linear[k=1024,n=5120,bf16]": 6,  # q and its gate (2*8*256), k and v (2*2*256)
        "norm.qk[heads=8,d=256,unit_offset,bf16]": 6,
        "norm.qk[heads=2,d=256,unit_offset,bf16]": 6,
        "posenc.rope[hq=8,hkv=2,d=64,layout=split_half,bf16]": 6,
        "attention.prefill[hq=8,hkv=2,d=256,causal,qk_norm,bf16]": 6,
        "attention.decode[hq=8,hkv=2,d=256,qk_norm,bf16]": 6,
        "act.sigmoid_gate[width=2048,bf16]": 6,
        "linear[k=1024,n=7168,bf16]": 24,
        "act.swiglu[width=3584,bf16]": 24,
        "linear[k=3584,n=1024,bf16]": 24,
        "linear[k=1024,n=248320,bf16]": 1,
    }
    assert ops_of("qwen3.5-0.8b", 2) == {
        "embedding[vocab=124160,hidden=1024,bf16]": 1,
        "norm.rms[hidden=1024,unit_offset,bf16]": 1,
        "norm.rms_add[hidden=1024,unit_offset,bf16]": 48,
        "linear[k=1024,n=4112,bf16]": 18,  # the four GDN input projections, sharded
        "conv.causal_depthwise[channels=3072,width=4,silu,bf16]": 18,
        "recurrent.deltanet_gates[heads=8,bf16]": 18,
        "recurrent.gated_deltanet[hk=8,hv=8,dk=128,dv=128,qk_l2norm,bf16]": 18,
        "norm.rms[hidden=128,bf16]": 18,
        "act.swiglu[width=1024,bf16]": 18,
        "linear[k=1024,n=1024,bf16]": 24,
        "linear[k=1024,n=2560,bf16]": 6,  # 2*4*256 + 2*1*256
        "norm.qk[heads=4,d=256,unit_offset,bf16]": 6,
        "norm.qk[heads=1,d=256,unit_offset,bf16]": 6,
        "posenc.rope[hq=4,hkv=1,d=64,layout=split_half,bf16]": 6,
        "attention.prefill[hq=4,hkv=1,d=256,causal,qk_norm,bf16]": 6,
        "attention.decode[hq=4,hkv=1,d=256,qk_norm,bf16]": 6,
        "act.sigmoid_gate[width=1024,bf16]": 6,
        "linear[k=1024,n=3584,bf16]": 24,
        "act.swiglu[width=1792,bf16]": 24,
        "linear[k=1792,n=1024,bf16]": 24,
        "linear[k=1024,n=124160,bf16]": 1,
    }
    roles = roles_of("qwen3.5-0.8b")
    assert roles["linear[k=2048,n=1024,bf16]"] == ("model.layers.*.linear_attn.out_proj", "model.layers.*.self_attn.o_proj")
    assert roles["act.sigmoid_gate[width=2048,bf16]"] == ("model.layers.*.self_attn",)


def test_gemma3():
    # 26 layers, every 6th global; 4 norms per layer around attention and MLP, all (1 + weight)
    assert ops_of("gemma3-1b") == {
        "embedding[vocab=262144,hidden=1152,scaled,bf16]": 1,
        "norm.rms[hidden=1152,unit_offset,bf16]": 53,  # layer 0's input norm, post-attention and post-MLP norms
        "norm.rms_add[hidden=1152,unit_offset,bf16]": 52,  # the other input norms, pre-MLP norms, final norm
        "linear[k=1152,n=1536,bf16]": 26,  # (4 + 2*1) * 256
        "norm.qk[heads=4,d=256,unit_offset,bf16]": 26,
        "norm.qk[heads=1,d=256,unit_offset,bf16]": 26,
        "posenc.rope[hq=4,hkv=1,d=256,layout=split_half,bf16]": 26,  # theta 1e4 (sliding) or 1e6 (global)
        "attention.prefill[hq=4,hkv=1,d=256,window=512,causal,qk_norm,bf16]": 22,
        "attention.decode[hq=4,hkv=1,d=256,window=512,qk_norm,bf16]": 22,
        "attention.prefill[hq=4,hkv=1,d=256,causal,qk_norm,bf16]": 4,
        "attention.decode[hq=4,hkv=1,d=256,qk_norm,bf16]": 4,
        "linear[k=1024,n=1152,bf16]": 26,
        "linear[k=1152,n=13824,bf16]": 26,
        "act.geglu[width=6912,bf16]": 26,
        "linear[k=6912,n=1152,bf16]": 26,
        "linear[k=1152,n=262144,bf16]": 1,
    }
    assert ops_of("gemma3-1b", 2) == {
        "embedding[vocab=131072,hidden=1152,scaled,bf16]": 1,
        "norm.rms[hidden=1152,unit_offset,bf16]": 53,
        "norm.rms_add[hidden=1152,unit_offset,bf16]": 52,
        "linear[k=1152,n=1024,bf16]": 26,  # (2 + 2*1) * 256: the one kv head is replicated
        "norm.qk[heads=2,d=256,unit_offset,bf16]": 26,
        "norm.qk[heads=1,d=256,unit_offset,bf16]": 26,
        "posenc.rope[hq=2,hkv=1,d=256,layout=split_half,bf16]": 26,
        "attention.prefill[hq=2,hkv=1,d=256,window=512,causal,qk_norm,bf16]": 22,
        "attention.decode[hq=2,hkv=1,d=256,window=512,qk_norm,bf16]": 22,
        "attention.prefill[hq=2,hkv=1,d=256,causal,qk_norm,bf16]": 4,
        "attention.decode[hq=2,hkv=1,d=256,qk_norm,bf16]": 4,
        "linear[k=512,n=1152,bf16]": 26,
        "linear[k=1152,n=6912,bf16]": 26,
        "act.geglu[width=3456,bf16]": 26,
        "linear[k=3456,n=1152,bf16]": 26,
        "linear[k=1152,n=131072,bf16]": 1,
    }
    roles = roles_of("gemma3-1b")
    assert roles["norm.rms[hidden=1152,unit_offset,bf16]"] == (  # layer 0's input norm among them
        "model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm",
        "model.layers.*.post_feedforward_layernorm")
    assert roles["posenc.rope[hq=4,hkv=1,d=256,layout=split_half,bf16]"] == ("model.layers.*.self_attn",)


def test_gemma3_4b_text_config_takes_gemma3_defaults():
    """gemma-3-4b-it's text_config gives only hidden, intermediate, layers and window: the rest is
    transformers' Gemma3TextConfig defaults."""
    c = captured("gemma3-4b")
    assert sizes(c) == (34, 2560, 8, 4, 256, 10240, 262208)
    prefill = {str(o.signature): o.calls_per_forward for o in c.instances if o.signature.op == "attention.prefill"}
    assert prefill == {"attention.prefill[hq=8,hkv=4,d=256,window=1024,causal,qk_norm,bf16]": 29,
                       "attention.prefill[hq=8,hkv=4,d=256,causal,qk_norm,bf16]": 5}


def test_bias_flags():
    ops = capture({**CATALOGUE["llama3-8b"], "attention_bias": True}, "biased", dtype="fp16").instances
    for role in ("model.layers.*.self_attn.q_proj+k_proj+v_proj", "model.layers.*.self_attn.o_proj"):
        sig = next(o for o in ops if role in o.roles).signature
        assert "bias" in sig.flags and sig.dtype == "fp16"


def test_one_layer_model_has_no_residual_input_norm():
    ops = capture({**CATALOGUE["llama3-8b"], "num_hidden_layers": 1}, "one").instances
    rms_add = next(o for o in ops if o.signature.op == "norm.rms_add")
    assert rms_add.roles == ("model.layers.*.post_attention_layernorm", "model.norm") and rms_add.calls_per_forward == 2


# --- layer patterns read from each family's own keys ----------------------------------------------

def windows(cfg: dict) -> dict[int, int]:
    """attention window (0: none) -> prefill calls per forward"""
    found: dict[int, int] = {}
    for o in capture(cfg, "x").instances:
        if o.signature.op == "attention.prefill":
            window = o.signature.dim("window")
            found[window] = found.get(window, 0) + o.calls_per_forward
    return found


def test_mistral_windows_every_layer_unless_null():
    mistral = {**CATALOGUE["llama3-8b"], "model_type": "mistral", "sliding_window": 4096}
    assert windows(mistral) == {4096: 32}
    assert windows({**mistral, "sliding_window": None}) == {0: 32}


def test_qwen2_sliding_window_from_max_window_layers():
    cfg = {**CATALOGUE["qwen2-7b"], "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    assert windows(cfg) == {0: 20, 4096: 8}
    assert windows(CATALOGUE["qwen2-7b"]) == {0: 28}, "use_sliding_window is false in the real config"


def test_layer_patterns_without_layer_types():
    qwen = CATALOGUE["qwen3.5-0.8b"]
    no_list = {k: v for k, v in qwen["text_config"].items() if k != "layer_types"}
    assert capture({**qwen, "text_config": no_list}, "q").instances == captured("qwen3.5-0.8b").instances
    gemma = {k: v for k, v in CATALOGUE["gemma3-270m"].items() if k != "layer_types"}
    assert capture(gemma, "g").instances == captured("gemma3-270m").instances


def test_rope_parameters_per_layer_type():
    """transformers 5 writes Gemma3's thetas as rope_parameters per layer type: the same ops (the
    thetas are in the cos/sin tables the op is handed, not in its signature)"""
    cfg = {k: v for k, v in CATALOGUE["gemma3-270m"].items() if k not in ("rope_theta", "rope_local_base_freq")}
    cfg["rope_parameters"] = {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                              "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}
    assert capture(cfg, "g").instances == captured("gemma3-270m").instances


def gemma2(**extra) -> dict:
    """transformers' default Gemma 2 config (attention softcap 50, final logit softcap 30), 4 layers."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model("gemma2").to_dict()
    return {**cfg, "num_hidden_layers": 4, "layer_types": cfg["layer_types"][:4], **extra}


def test_attention_softcap_in_signature():
    """Gemma 2 hands its softcap to the attention function (transformers' Gemma 3 keeps the config key
    but computes none: capture sees what the model runs)."""
    c = capture(gemma2(), "g")
    prefill = [str(o.signature) for o in c.instances if o.signature.op == "attention.prefill"]
    assert prefill == ["attention.prefill[hq=8,hkv=4,d=256,window=4096,softcap=50.0,causal,bf16]",
                       "attention.prefill[hq=8,hkv=4,d=256,softcap=50.0,causal,bf16]"]
    assert features(c)["attention.prefill"] >= {"softcap", "sliding_window"}
    gemma3 = capture({**CATALOGUE["gemma3-1b"], "attn_logit_softcapping": 50.0}, "g3")
    assert gemma3.instances == captured("gemma3-1b").instances


def test_the_final_logit_softcap_is_noted():
    note = "lm_head: the final logit softcap (30 * tanh(logits / 30)): elementwise, no op covers it"
    assert note in capture(gemma2(), "g").notes
    assert not any("softcap" in n for n in capture(gemma2(final_logit_softcapping=None), "g").notes)


# --- the features each family needs, derived from the captured signatures ---------------------------

NONE = frozenset()
LLAMA_FEATURES = {
    "embedding": NONE, "norm.rms": NONE, "norm.rms_add": NONE, "linear": NONE, "act.swiglu": NONE,
    "posenc.rope": {"gqa", "rope_split_half"}, "attention.prefill": {"causal", "gqa"}, "attention.decode": {"gqa"},
}


@pytest.mark.parametrize("model,expected", [
    ("gpt2", {"embedding": NONE, "posenc.learned": NONE, "norm.layer": NONE, "linear": {"bias"},
              "attention.prefill": {"causal"}, "attention.decode": NONE, "act.gelu": NONE}),
    ("nanbeige4.1-3b", LLAMA_FEATURES),
    ("qwen2-7b", {**LLAMA_FEATURES, "linear": {"bias"}}),
    ("qwen3-8b", {**LLAMA_FEATURES, "norm.qk": NONE, "attention.prefill": {"causal", "gqa", "qk_norm"},
                  "attention.decode": {"gqa", "qk_norm"}}),
    ("qwen3.5-0.8b", {**LLAMA_FEATURES, "norm.rms": {"unit_offset"}, "norm.rms_add": {"unit_offset"},
                      "norm.qk": {"unit_offset"}, "recurrent.gated_deltanet": {"qk_l2norm"}, "conv.causal_depthwise": {"silu"},
                      "recurrent.deltanet_gates": NONE,
                      "act.sigmoid_gate": NONE, "attention.prefill": {"causal", "gqa", "qk_norm"},
                      "attention.decode": {"gqa", "qk_norm"}}),
    ("gemma3-4b", {"embedding": {"scaled"}, "norm.rms": {"unit_offset"}, "norm.rms_add": {"unit_offset"},
                   "norm.qk": {"unit_offset"}, "linear": NONE, "act.geglu": NONE,
                   "posenc.rope": {"gqa", "rope_split_half"},
                   "attention.prefill": {"causal", "gqa", "qk_norm", "sliding_window"},
                   "attention.decode": {"gqa", "qk_norm", "sliding_window"}}),
])
def test_required_features_per_family(model, expected):
    assert features(captured(model)) == expected


def test_multi_query_needs_no_gqa_once_sharded_to_one_head():
    c = capture({**CATALOGUE["llama3-8b"], "num_key_value_heads": 32}, "mha", tp=4)
    assert "gqa" not in features(c)["attention.prefill"]


# --- what no op covers is listed, not dropped -------------------------------------------------------

def test_what_no_op_covers_in_the_catalogue():
    assert captured("llama3-8b").notes == ()
    assert captured("gpt2").notes == (
        "the residual adds before LayerNorm (24 per forward): elementwise, no norm.layer op fuses them",)
    vision = "vision_config: the vision tower (only the text model is captured)"
    assert captured("qwen3.5-0.8b").notes == (
        vision,
        "mtp_num_hidden_layers=1: multi-token-prediction layers (they run only for speculative decoding)",
        "model.layers.*.linear_attn.gates: tuned, but runtime_loader's transformers integration cannot serve it: "
        "recurrent.deltanet_gates is computed inside the module's own forward")
    assert captured("gemma3-4b").notes == (vision,)


# --- the sizes capture observes agree with transformers' own config classes --------------------------

@pytest.mark.parametrize("name", list(CATALOGUE))
def test_sizes_agree_with_transformers(name):
    transformers = pytest.importorskip("transformers")
    cfg = CATALOGUE[name]
    hf = transformers.CONFIG_MAPPING[cfg["model_type"]](**cfg).get_text_config()
    c = captured(name)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    intermediate = getattr(hf, "intermediate_size", None) or getattr(hf, "n_inner", None) or 4 * hf.hidden_size
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    assert sizes(c) == (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, kv_heads, head_dim,
                        intermediate, hf.vocab_size)
    layer_types = list(getattr(hf, "layer_types", None) or ["full_attention"] * hf.num_hidden_layers)
    window = getattr(hf, "sliding_window", None) or 0
    full, sliding = layer_types.count("full_attention"), layer_types.count("sliding_attention")
    assert windows(cfg) == {w: n for w, n in ((0, full), (window, sliding)) if n}
    rope = getattr(hf, "rope_parameters", None)
    if rope:  # GPT-2 has learned positions
        full = rope.get("full_attention", rope)
        (rotary,) = {o.signature.dim("d") for o in c.instances if o.signature.op == "posenc.rope"}
        assert rotary == int(head_dim * full.get("partial_rotary_factor", 1.0))
    if name.startswith("qwen3.5"):
        (deltanet,) = [o for o in c.instances if o.signature.op == "recurrent.gated_deltanet"]
        (conv,) = [o.signature for o in c.instances if o.signature.op == "conv.causal_depthwise"]
        assert deltanet.calls_per_forward == layer_types.count("linear_attention")
        assert tuple(deltanet.signature.dim(d) for d in ("hk", "hv", "dk", "dv")) + (conv.dim("width"),) == (
            hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim, hf.linear_value_head_dim,
            hf.linear_conv_kernel_dim)


# --- `lzsolve models` ---------------------------------------------------------------------------------

def test_models_lists_every_catalogue_entry_as_capture_sees_it():
    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines() if line.split()[:1] != []}
    assert all(name in rows for name in CATALOGUE)
    # model, family, layers, params, hidden, heads/kv, head_dim, mlp, vocab, ops, signatures, covered:
    # 80 layers of 855.6M parameters and two 1.05B vocab tables; the 8 ops and 12 signatures of
    # test_llama3_70b_tp8, unsharded
    assert rows["llama3-70b"] == ["llama3-70b", "llama", "80", "70.55B", "8192", "64/8", "128", "28672", "128256",
                                  "8", "12", "100.0%"]
    qwen = rows["qwen3.5-0.8b"]
    assert qwen[:3] + qwen[4:9] == ["qwen3.5-0.8b", "qwen3_5_text", "24", "1024", "8/2", "256", "3584", "248320"]
    assert "  gpt2: the residual adds before LayerNorm (24 per forward)" in result.output

"""Models: catalogue values, config loading and its errors, TP sharding, the walker, the
features each family needs and what no op covers."""
import json

import pytest

from lzsolve.errors import LzError
from lzsolve.models import (CATALOGUE, from_catalogue, from_config_file, from_hf_config, required_features, shard,
                            unmodelled, walk)


def ops_of(model: str, tp: int = 1) -> dict[str, int]:
    """signature -> calls per forward"""
    return {str(o.signature): o.calls_per_forward for o in walk(shard(from_catalogue(model), tp), "bf16")}


def roles_of(model: str, tp: int = 1) -> dict[str, tuple[str, ...]]:
    return {str(o.signature): o.roles for o in walk(shard(from_catalogue(model), tp), "bf16")}


def test_catalogue_has_real_llama3_values():
    m = from_catalogue("llama3-70b")
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab) == \
        (8192, 80, 64, 8, 128, 28672, 128256)
    assert m.rope_theta == 500000.0 and m.norm_eps == 1e-5
    m8 = from_catalogue("llama3-8b")
    assert (m8.hidden, m8.layers, m8.heads, m8.kv_heads, m8.intermediate) == (4096, 32, 32, 8, 14336)


@pytest.mark.parametrize("name", list(CATALOGUE))
@pytest.mark.parametrize("tp", [1, 2])
def test_every_catalogue_entry_parses_and_walks(name, tp):
    m = shard(from_catalogue(name), tp)
    ops = walk(m, "bf16")
    assert ops and len({o.signature for o in ops}) == len(ops)
    assert ops[0].signature.op == "embedding" and ops[-1].roles == ("lm_head",)
    assert set(required_features(m)) == {o.signature.op for o in ops}
    assert all(isinstance(line, str) and "\n" not in line for line in unmodelled(m))


def test_unknown_model_lists_known_names():
    with pytest.raises(LzError) as e:
        from_catalogue("llama9")
    for name in CATALOGUE:
        assert name in str(e.value)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_config_file_round_trip(tmp_path, name):
    path = tmp_path / "mymodel" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CATALOGUE[name]))
    m = from_config_file(path)
    assert m.name == "mymodel"
    assert m.config_hash == from_catalogue(name).config_hash
    assert walk(m, "bf16") == walk(from_catalogue(name), "bf16")


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"model_type": "llama"}), "hidden_size"),
    (json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2}), "n_embd"),  # named as the family names it
    (json.dumps({**CATALOGUE["llama3-8b"], "num_attention_heads": 0}), "num_attention_heads"),
    (json.dumps({**CATALOGUE["llama3-8b"], "num_key_value_heads": 5}), "not a multiple"),
    (json.dumps({**CATALOGUE["llama3-8b"], "model_type": "deepseek_v3"}), "not supported yet"),
    (json.dumps({**CATALOGUE["llama3-8b"], "rope_theta": "big"}), "rope_theta"),
    (json.dumps({**CATALOGUE["llama3-8b"], "rope_parameters": [1]}), "rope_parameters"),
    (json.dumps({**CATALOGUE["llama3-8b"], "hidden_act": "relu"}), "'hidden_act' 'relu' is not supported"),
    (json.dumps({**CATALOGUE["gpt2"], "activation_function": "gelu"}), "'activation_function' 'gelu'"),
    (json.dumps({**CATALOGUE["llama3-8b"], "layer_types": ["full_attention"]}), "each of the 32 layers"),
    (json.dumps({**CATALOGUE["llama3-8b"], "layer_types": ["sliding_attention"] * 32}),
     "'sliding_attention' is not supported for llama"),
    (json.dumps({**CATALOGUE["qwen3-8b"], "partial_rotary_factor": 0.01}), "partial_rotary_factor"),  # 1 dim
    (json.dumps({**CATALOGUE["gemma3-1b"], "sliding_window": None}), "sliding_window"),
    (json.dumps({**CATALOGUE["qwen3.5-0.8b"], "text_config": [1]}), "text_config"),
    (json.dumps({**CATALOGUE["qwen3.5-0.8b"], "text_config": {**CATALOGUE["qwen3.5-0.8b"]["text_config"],
                                                               "linear_num_value_heads": 24}}), "not a multiple"),
])
def test_malformed_configs_are_named(tmp_path, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(LzError, match=needle):
        from_config_file(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(LzError, match="cannot read"):
        from_config_file(tmp_path / "absent.json")


# --- the capability gate: what no op computes is refused by name, in one line --------------

@pytest.mark.parametrize("base,extra,named", [
    ("qwen3-8b", {"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8},
     ["model_type 'qwen3_moe'", "mixture-of-experts routing ('num_experts')"]),
    ("llama3-8b", {"num_local_experts": 8}, ["mixture-of-experts routing ('num_local_experts')"]),
    ("llama3-8b", {"model_type": "deepseek_v3", "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 1536},
     ["model_type 'deepseek_v3'", "('n_routed_experts')", "multi-head latent attention (MLA) ('kv_lora_rank')"]),
    ("llama3-8b", {"kv_lora_rank": 512}, ["multi-head latent attention (MLA) ('kv_lora_rank')"]),
    ("gpt2", {"add_cross_attention": True}, ["cross-attention ('add_cross_attention')"]),
    ("gemma3-270m", {"use_bidirectional_attention": True}, ["bidirectional"]),
    ("llama3-8b", {"quantization_config": {"quant_method": "fp8"}}, ["quantized weights"]),
    ("llama3-8b", {"model_type": "falcon_mamba"}, ["model_type 'falcon_mamba'"]),
])
def test_unsupported_parts_are_refused_by_name(base, extra, named):
    with pytest.raises(LzError) as e:
        from_hf_config({**CATALOGUE[base], **extra}, "x")
    message = str(e.value)
    assert "\n" not in message and "not supported yet" in message
    assert all(part in message for part in named), message
    assert "supported: dense decoders with model_type gpt2, llama, mistral, qwen2, qwen3, qwen3_5" in message


def test_inert_moe_keys_are_not_refused():
    """Dense checkpoints often carry the MoE keys at 0 or empty: nothing to refuse."""
    m = from_hf_config({**CATALOGUE["qwen3-8b"], "num_experts": 0, "mlp_only_layers": []}, "x")
    assert m.family == "qwen3"


def test_moe_inside_text_config_is_refused():
    cfg = CATALOGUE["qwen3.5-0.8b"]
    with pytest.raises(LzError, match="num_experts"):
        from_hf_config({**cfg, "text_config": {**cfg["text_config"], "num_experts": 256}}, "x")


# --- TP sharding ------------------------------------------------------------------------------

def test_tp_shards_heads_mlp_and_vocab():
    m = shard(from_catalogue("llama3-70b"), 8)
    assert (m.heads, m.kv_heads, m.intermediate, m.vocab, m.tp) == (8, 1, 3584, 16032, 8)
    m16 = shard(from_catalogue("llama3-70b"), 16)
    assert m16.kv_heads == 1, "kv heads are replicated, never below 1"
    assert shard(from_catalogue("llama3-8b"), 1) == from_catalogue("llama3-8b")


def test_tp_shards_linear_attention_heads():
    m = shard(from_catalogue("qwen3.5-0.8b"), 4)
    assert (m.heads, m.kv_heads, m.linear_attn.key_heads, m.linear_attn.value_heads) == (2, 1, 4, 4)
    assert (m.linear_attn.key_dim, m.linear_attn.value_dim, m.linear_attn.conv_kernel) == (128, 128, 4)
    assert shard(from_catalogue("gemma3-270m"), 4).kv_heads == 1


@pytest.mark.parametrize("tp", [0, 3, 7, 128])
def test_impossible_tp(tp):
    with pytest.raises(LzError, match="--tp"):
        shard(from_catalogue("llama3-70b"), tp)


def test_tp_must_divide_linear_attention_heads():
    cfg = CATALOGUE["qwen3.5-0.8b"]
    text = {**cfg["text_config"], "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 3200}
    with pytest.raises(LzError, match="linear-attention key/value heads"):
        shard(from_hf_config({**cfg, "text_config": text}, "x"), 32)


# --- the walker, per family: hand-derived signatures and calls per forward ----------------------

def test_walker_llama3_70b_tp8():
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
    assert roles["norm.rms[hidden=8192,bf16]"] == ("layers.0.input_norm",)
    assert set(roles["norm.rms_add[hidden=8192,bf16]"]) == {
        "layers.*.input_norm", "layers.*.post_attention_norm", "final_norm"}


def test_walker_gpt2():
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
    assert roles_of("gpt2", 4)["linear[k=768,n=768,bias,bf16]"] == ("layers.*.mlp.up_proj", "layers.*.mlp.down_proj")


def test_walker_untied_llama_nanbeige():
    m = from_catalogue("nanbeige4.1-3b")
    assert m.family == "llama" and not m.tie_embeddings and m.rope_theta == 7e7
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


def test_walker_qwen2_bias_on_qkv_only():
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


def test_walker_qwen3_qk_norm():
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


def test_walker_qwen3_5_hybrid():
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
    assert roles["linear[k=2048,n=1024,bf16]"] == ("layers.*.linear_attn.out_proj", "layers.*.attn.o_proj")
    assert roles["act.sigmoid_gate[width=2048,bf16]"] == ("layers.*.attn.output_gate",)


def test_walker_gemma3():
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
    assert roles["norm.rms[hidden=1152,unit_offset,bf16]"] == (
        "layers.0.input_norm", "layers.*.post_attention_norm", "layers.*.post_feedforward_norm")
    assert roles["posenc.rope[hq=4,hkv=1,d=256,layout=split_half,bf16]"] == (
        "layers.*.sliding_attn.rope", "layers.*.attn.rope")


def test_gemma3_4b_text_config_takes_gemma3_defaults():
    m = from_catalogue("gemma3-4b")
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab, m.window) == \
        (2560, 34, 8, 4, 256, 10240, 262208, 1024)
    assert (m.rope_theta, m.rope_local_theta) == (1e6, 1e4)
    assert m.layer_types.count("full_attention") == 5


def test_walker_bias_flags():
    cfg = {**CATALOGUE["llama3-8b"], "attention_bias": True}
    ops = walk(from_hf_config(cfg, "biased"), "fp16")
    for role in ("layers.*.attn.qkv_proj", "layers.*.attn.o_proj"):
        sig = next(o for o in ops if role in o.roles).signature
        assert "bias" in sig.flags and sig.dtype == "fp16"


def test_one_layer_model_has_no_residual_input_norm():
    ops = walk(from_hf_config({**CATALOGUE["llama3-8b"], "num_hidden_layers": 1}, "one"), "bf16")
    rms_add = next(o for o in ops if o.signature.op == "norm.rms_add")
    assert rms_add.roles == ("layers.*.post_attention_norm", "final_norm") and rms_add.calls_per_forward == 2


# --- layer patterns read from each family's own keys ----------------------------------------------

def test_mistral_windows_every_layer_unless_null():
    mistral = {**CATALOGUE["llama3-8b"], "model_type": "mistral", "sliding_window": 4096}
    m = from_hf_config(mistral, "m")
    assert m.family == "llama" and set(m.layer_types) == {"sliding_attention"} and m.window == 4096
    assert {o.signature.dim("window") for o in walk(m, "bf16") if o.signature.op.startswith("attention")} == {4096}
    assert from_hf_config({**mistral, "sliding_window": None}, "m").window == 0


def test_qwen2_sliding_window_from_max_window_layers():
    cfg = {**CATALOGUE["qwen2-7b"], "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    m = from_hf_config(cfg, "q")
    assert m.layer_types == ("full_attention",) * 20 + ("sliding_attention",) * 8 and m.window == 4096
    assert from_catalogue("qwen2-7b").window == 0, "use_sliding_window is false in the real config"


def test_layer_patterns_without_layer_types():
    qwen = CATALOGUE["qwen3.5-0.8b"]
    no_list = {k: v for k, v in qwen["text_config"].items() if k != "layer_types"}
    listed = from_catalogue("qwen3.5-0.8b").layer_types
    assert from_hf_config({**qwen, "text_config": no_list}, "q").layer_types == listed
    gemma = {k: v for k, v in CATALOGUE["gemma3-270m"].items() if k != "layer_types"}
    assert from_hf_config(gemma, "g").layer_types == from_catalogue("gemma3-270m").layer_types


def test_rope_parameters_per_layer_type():
    """transformers 5 writes Gemma3's thetas as rope_parameters per layer type"""
    cfg = {k: v for k, v in CATALOGUE["gemma3-270m"].items() if k not in ("rope_theta", "rope_local_base_freq")}
    cfg["rope_parameters"] = {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                              "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}
    m = from_hf_config(cfg, "g")
    assert (m.rope_theta, m.rope_local_theta) == (1e6, 1e4)


def test_attention_softcap_in_signature_and_logit_softcap_unmodelled():
    m = from_hf_config({**CATALOGUE["gemma3-1b"], "attn_logit_softcapping": 50.0,
                        "final_logit_softcapping": 30.0}, "g")
    prefill = [str(o.signature) for o in walk(m, "bf16") if o.signature.op == "attention.prefill"]
    assert prefill == ["attention.prefill[hq=4,hkv=1,d=256,window=512,softcap=50.0,causal,qk_norm,bf16]",
                       "attention.prefill[hq=4,hkv=1,d=256,softcap=50.0,causal,qk_norm,bf16]"]
    assert required_features(m)["attention.prefill"] >= {"softcap", "sliding_window"}
    assert any("final logit softcap (30 * tanh(logits / 30))" in line for line in unmodelled(m))


# --- the features each family needs, derived from the walker's signatures ---------------------------

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
    assert required_features(from_catalogue(model)) == expected


def test_multi_query_needs_no_gqa_once_sharded_to_one_head():
    m = shard(from_hf_config({**CATALOGUE["llama3-8b"], "num_key_value_heads": 32}, "mha"), 4)
    assert "gqa" not in required_features(m)["attention.prefill"]


# --- what no op covers is listed, not dropped -------------------------------------------------------

def test_unmodelled_parts():
    assert unmodelled(from_catalogue("llama3-8b")) == []
    assert unmodelled(from_catalogue("gpt2")) == [
        "layers.*: the residual adds (24 per forward): elementwise, and no norm.layer op fuses them"]
    qwen = unmodelled(from_catalogue("qwen3.5-0.8b"))
    assert qwen[:2] == ["vision_config: the vision tower (only the text model is walked)",
                        "mtp_num_hidden_layers=1: multi-token-prediction layers (they run only for speculative "
                        "decoding)"]
    assert len(qwen) == 2  # the conv1d and the gates are ops (conv.causal_depthwise, recurrent.deltanet_gates)
    assert unmodelled(from_catalogue("gemma3-4b")) == [qwen[0]]


# --- the parsed dims agree with transformers' own config classes ------------------------------------

@pytest.mark.parametrize("name", list(CATALOGUE))
def test_dims_agree_with_transformers(name):
    transformers = pytest.importorskip("transformers")
    cfg = CATALOGUE[name]
    hf = transformers.CONFIG_MAPPING[cfg["model_type"]](**cfg).get_text_config()
    m = from_catalogue(name)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    intermediate = getattr(hf, "intermediate_size", None) or getattr(hf, "n_inner", None) or 4 * hf.hidden_size
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab) == (
        hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, kv_heads, head_dim, intermediate,
        hf.vocab_size)
    layer_types = getattr(hf, "layer_types", None) or ["full_attention"] * hf.num_hidden_layers
    assert list(m.layer_types) == list(layer_types)
    if "sliding_attention" in layer_types:
        assert m.window == hf.sliding_window
    rope = getattr(hf, "rope_parameters", None)
    if rope:  # GPT-2 has learned positions
        full, local = rope.get("full_attention", rope), rope.get("sliding_attention", rope)
        assert (m.rope_theta, m.rope_local_theta) == (full["rope_theta"], local["rope_theta"])
        assert m.rotary_dim == int(head_dim * full.get("partial_rotary_factor", 1.0))
    if name.startswith("qwen3.5"):
        assert (m.linear_attn.key_heads, m.linear_attn.value_heads, m.linear_attn.key_dim, m.linear_attn.value_dim,
                m.linear_attn.conv_kernel) == (hf.linear_num_key_heads, hf.linear_num_value_heads,
                                               hf.linear_key_head_dim, hf.linear_value_head_dim,
                                               hf.linear_conv_kernel_dim)

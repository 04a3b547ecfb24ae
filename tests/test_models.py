"""Models: catalogue values, config loading and its errors, TP sharding, the walker."""
import json

import pytest

from lzsolve.errors import LzError
from lzsolve.models import CATALOGUE, from_catalogue, from_config_file, from_hf_config, shard, walk


def test_catalogue_has_real_llama3_values():
    m = from_catalogue("llama3-70b")
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab) == \
        (8192, 80, 64, 8, 128, 28672, 128256)
    assert m.rope_theta == 500000.0 and m.rms_eps == 1e-5
    m8 = from_catalogue("llama3-8b")
    assert (m8.hidden, m8.layers, m8.heads, m8.kv_heads, m8.intermediate) == (4096, 32, 32, 8, 14336)


def test_unknown_model_lists_known_names():
    with pytest.raises(LzError) as e:
        from_catalogue("llama9")
    for name in CATALOGUE:
        assert name in str(e.value)


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "mymodel" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CATALOGUE["llama3-8b"]))
    m = from_config_file(path)
    assert m.name == "mymodel" and m.hidden == 4096
    assert m.config_hash == from_catalogue("llama3-8b").config_hash


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"model_type": "llama"}), "hidden_size"),
    (json.dumps({**CATALOGUE["llama3-8b"], "num_attention_heads": 0}), "num_attention_heads"),
    (json.dumps({**CATALOGUE["llama3-8b"], "num_key_value_heads": 5}), "not a multiple"),
    (json.dumps({**CATALOGUE["llama3-8b"], "model_type": "deepseek_v3"}), "not supported yet"),
    (json.dumps({**CATALOGUE["llama3-8b"], "rope_theta": "big"}), "rope_theta"),
])
def test_malformed_configs_are_named(tmp_path, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(LzError, match=needle):
        from_config_file(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(LzError, match="cannot read"):
        from_config_file(tmp_path / "absent.json")


def test_tp_shards_heads_mlp_and_vocab():
    m = shard(from_catalogue("llama3-70b"), 8)
    assert (m.heads, m.kv_heads, m.intermediate, m.vocab, m.tp) == (8, 1, 3584, 16032, 8)
    m16 = shard(from_catalogue("llama3-70b"), 16)
    assert m16.kv_heads == 1, "kv heads are replicated, never below 1"
    assert shard(from_catalogue("llama3-8b"), 1) == from_catalogue("llama3-8b")


@pytest.mark.parametrize("tp", [0, 3, 7, 128])
def test_impossible_tp(tp):
    with pytest.raises(LzError, match="--tp"):
        shard(from_catalogue("llama3-70b"), tp)


def test_walker_llama3_70b_tp8():
    ops = walk(shard(from_catalogue("llama3-70b"), 8), "bf16")
    found = {str(o.signature): (o.roles, o.calls_per_forward) for o in ops}
    expected = {
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
    assert {k: v[1] for k, v in found.items()} == expected
    assert found["linear[k=8192,n=16032,bf16]"][0] == ("lm_head",)
    assert found["norm.rms[hidden=8192,bf16]"][0] == ("layers.0.input_norm",)
    assert set(found["norm.rms_add[hidden=8192,bf16]"][0]) == {
        "layers.*.input_norm", "layers.*.post_attention_norm", "final_norm"}


def test_walker_bias_flags():
    cfg = {**CATALOGUE["llama3-8b"], "attention_bias": True}
    ops = walk(from_hf_config(cfg, "biased"), "fp16")
    qkv = [o for o in ops if "layers.*.attn.qkv_proj" in o.roles][0]
    assert "bias" in qkv.signature.flags and qkv.signature.dtype == "fp16"

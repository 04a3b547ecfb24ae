"""Capture from transformers' module tree: decoder model types of transformers' causal-LM mapping
either plan or are refused in one line, never with a traceback; MoE experts, expert parallelism and
FP8 checkpoints. (The catalogue's families, signature by signature: tests/test_models.py.)"""
import re
import warnings

import pytest
import torch
from click.testing import CliRunner

from lzsolve.cli import cli
from lzsolve.errors import LzError
from lzsolve.models.capture import capture, fp8_kv_cache

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

# Decoder types of transformers' causal-LM mapping, by what they are. Dense attention decoders
# must plan (issue 13's bar was 33 of its 37; Gemma 4, whose layers differ, came with transformers
# 5.2x); MoE ones with transformers' 3-D expert weights plan
# with moe.experts, the others are refused naming the MoE part.
DENSE = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "falcon",
         "gpt_neox", "olmo", "olmo2", "olmo3", "granite", "cohere", "cohere2", "starcoder2", "stablelm", "glm",
         "glm4", "smollm3", "exaone4", "ministral", "nemotron", "seed_oss", "apertus", "arcee", "gpt2",
         "gptj", "gpt_neo", "codegen", "persimmon", "helium", "diffllama", "bitnet", "ernie4_5", "gemma4",
         "gemma4_text", "bloom"]
MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "granitemoe", "phimoe", "olmoe", "minimax", "ernie4_5_moe", "gpt_oss",
       "llama4_text", "deepseek_v3", "dbrx", "jetmoe"]
# SwiGLU experts, GPT-OSS's biased, interleaved, clamped ones, and Llama 4's (each token's input rows scaled by
# its router weights: moe.experts over those rows): moe.experts
MOE_SERVED = MOE[:10]


def default_config(model_type: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(model_type).to_dict()


def shallow(config: dict, layers: int = 6) -> dict:
    """`config` cut to its first `layers` decoder layers, per-layer lists and dicts with it: a dense
    decoder plans or is refused as it does whole (six layers hold Gemma 3's full-attention one), in a
    tenth of the time (27 against 3 s for DENSE on the CPU VM)."""
    depth = config.get("num_hidden_layers")
    if not isinstance(depth, int) or depth <= layers:
        return config
    cut = {**config, "num_hidden_layers": layers}
    for key, value in config.items():
        if isinstance(value, list) and len(value) == depth:
            cut[key] = value[:layers]
        elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):  # Gemma 4's per-layer dict
            cut[key] = {k: v for k, v in value.items() if int(k) < layers}
    return cut


@pytest.fixture(scope="module")
def outcomes():
    """model_type -> ("ok", captured) or ("refused", message), for DENSE (shallow) + MOE (whole: their
    expert layers may start deep, as DeepSeek's after its dense ones)."""
    result = {}
    for model_type in DENSE + MOE:
        config = default_config(model_type)
        try:
            result[model_type] = ("ok", capture(shallow(config) if model_type in DENSE else config, model_type))
        except LzError as e:
            result[model_type] = ("refused", str(e))
    return result  # any other exception fails the test that asked: a traceback is a bug


def test_dense_decoders_plan(outcomes):
    refused = {t: outcomes[t][1] for t in DENSE if outcomes[t][0] != "ok"}
    # issue 13 asks for 33; GPT-J, GPT-Neo and CodeGen accept only eager attention (written out as
    # matmuls: no attention function to observe)
    assert len(DENSE) - len(refused) >= 37, refused
    for model_type, message in refused.items():
        assert "\n" not in message and model_type in message


def test_moe_decoders_plan_their_experts(outcomes):
    for model_type in MOE_SERVED:
        status, captured = outcomes[model_type]
        assert status == "ok", (model_type, captured)
        experts = [i for i in captured.instances if i.signature.op == "moe.experts"]
        assert len(experts) == 1 and experts[0].calls_per_forward >= 16, (model_type, captured.instances)
        assert not any("experts" in note.split(":")[0] for note in captured.notes), captured.notes


def test_moe_shapes_are_the_configs_and_shard_the_expert_width():
    cfg = default_config("qwen3_moe")  # 128 experts, 8 per token, hidden 2048, expert width 768
    (experts,) = [i.signature for i in capture(cfg, "q", tp=2).instances if i.signature.op == "moe.experts"]
    assert experts.to_json()["static"] == {"experts": 128, "top_k": 8, "hidden": 2048, "inter": 384}
    with pytest.raises(LzError, match="expert width 769"):
        capture({**cfg, "moe_intermediate_size": 769}, "q", tp=2)
    shared = default_config("qwen2_moe")  # a shared expert of width 5632 beside 60 routed ones of 1408
    ops = {str(i.signature) for i in capture(shared, "q2").instances}
    assert "act.swiglu[width=5632,bf16]" in ops and "moe.experts[experts=60,top_k=4,hidden=2048,inter=1408,bf16]" in ops


def test_expert_parallelism_divides_the_experts_whole():
    """--ep: a rank holds 1/ep of the experts, each whole (transformers' and vLLM's inference EP takes
    the tensor-parallel group's ranks); attention, the shared expert and the router keep --tp's shards."""
    cfg = default_config("qwen2_moe")  # 60 routed experts of width 1408, a shared one of 5632, 16 heads
    captured = capture(cfg, "q2", tp=2, ep=2)
    ops = {str(i.signature) for i in captured.instances}
    assert captured.name == "q2-ep2"
    assert "moe.experts[experts=30,top_k=4,hidden=2048,inter=1408,ep=2,bf16]" in ops
    assert "act.swiglu[width=2816,bf16]" in ops and "moe.router[experts=60,top_k=4,bf16]" in ops
    assert {str(i.signature) for i in capture(cfg, "q2", tp=2).instances} - ops, "the plain TP capture differs"
    (over_replicas,) = [i.signature for i in capture(cfg, "q2", tp=1, ep=4).instances if i.signature.op == "moe.experts"]
    assert over_replicas.to_json()["static"] == {"experts": 15, "top_k": 4, "hidden": 2048, "inter": 1408, "ep": 4}
    for kwargs, message in [(dict(tp=4, ep=2), "not a multiple of --tp 4"), (dict(ep=8), "cannot divide q2's 60 experts"),
                            (dict(ep=0), "--ep must be >= 1")]:
        with pytest.raises(LzError, match=message):
            capture(cfg, "q2", **kwargs)
    with pytest.raises(LzError, match="has no routed experts to divide"):
        capture(default_config("llama"), "dense", ep=2)


def test_tp_is_checked_against_the_configs_heads_before_the_model_is_built(monkeypatch):
    """--tp 3 of llama3-70b took 9 s to be refused: the model was built and run first."""
    from lzsolve.models import capture as capture_module

    def never(*args):
        raise AssertionError("built a model that --tp cannot shard")

    monkeypatch.setattr(capture_module, "build_meta_model", never)
    with pytest.raises(LzError, match=r"^--tp 3 cannot shard llama3-70b: it does not divide 64/8 attention/kv heads$"):
        capture_module.load("llama3-70b", None, tp=3)
    assert capture_module._heads_problem(32, 8, 16) is None, "16 ranks replicate 8 kv heads"


def test_bloom_plans_attention_with_alibi(outcomes):
    """BLOOM's attention module (fused query_key_value, ALiBi biases, its own score matmuls) is captured
    as patch() serves it: attention with the alibi flag, q/k/v as one GEMM; not under --tp, where a
    rank's heads would need the slopes of their place among the model's."""
    status, captured = outcomes["bloom"]
    assert status == "ok", captured
    ops = {str(i.signature): i.roles for i in captured.instances}
    assert ops["attention.prefill[hq=8,hkv=8,d=8,causal,alibi,bf16]"] == ("transformer.h.*.self_attention",)
    assert "attention.decode[hq=8,hkv=8,d=8,alibi,bf16]" in ops
    assert ops["linear[k=64,n=192,bias,bf16]"] == ("transformer.h.*.self_attention.query_key_value",)
    with pytest.raises(LzError, match=r"^bloom: not supported yet: ALiBi attention under --tp 2 "):
        capture(default_config("bloom"), "bloom", tp=2)
    kept = fp8_kv_cache(captured)  # no FP8-cache op takes ALiBi: its decode keeps its signature
    assert "attention.decode[hq=8,hkv=8,d=8,alibi,bf16]" in {str(i.signature) for i in kept.instances}


def test_other_experts_are_named_or_refused(outcomes, monkeypatch):
    status, captured = outcomes["gpt_oss"]  # biased, interleaved, clamped experts stored (experts, in, out)
    ops = {str(i.signature) for i in captured.instances}
    assert "moe.experts[experts=128,top_k=4,hidden=2880,inter=2880,alpha=1.702,limit=7.0,interleaved,bias," \
           "transposed,bf16]" in ops
    # and attention sinks on its sliding and full layers
    assert {"attention.prefill[hq=64,hkv=8,d=64,window=128,causal,sinks,bf16]",
            "attention.decode[hq=64,hkv=8,d=64,sinks,bf16]"} <= ops
    assert not captured.notes, "its RoPE form too (split halves, cos/sin with each angle once)"
    status, message = outcomes["jetmoe"]  # no 3-D expert weights: its routing cannot run on meta
    assert status == "refused" and "JetMoeParallelExperts" in message and "\n" not in message
    # experts with a gate of their own that is not GPT-OSS's: planned without them, and said
    from transformers.models.mixtral import modeling_mixtral
    monkeypatch.setattr(modeling_mixtral.MixtralExperts, "_apply_gate",
                        lambda self, gate_up: torch.nn.functional.gelu(gate_up.chunk(2, dim=-1)[0]), raising=False)
    captured = capture({**default_config("mixtral"), "vocab_size": 1234}, "mixtral-gelu")
    assert not any(i.signature.op == "moe.experts" for i in captured.instances)
    assert any("experts in a form no op computes" in note for note in captured.notes), captured.notes


@pytest.mark.parametrize("variant", [{}, {"num_local_experts": 128, "interleave_moe_layer_step": 2, "moe_layers": None,
                                      "use_qk_norm": False, "num_experts_per_tok": 2}])
@pytest.mark.parametrize("tp", [1, 8])
def test_llama4_text_plans_its_prescaled_experts_and_names_its_attention_features(variant, tp):
    """Llama 4 (Scout's default config; a Maverick-like variant: 128 experts every other layer, dense
    MLPs between, no QK-norm, two experts a token): its experts take each token's rows scaled by the
    router's weights, served as moe.experts over those rows (one expert and weight 1 each); its router
    (sigmoid of the top-k logits) is not moe.router's softmax and is said; chunked layers, layers
    without RoPE and its complex RoPE are named."""
    cfg = {**default_config("llama4_text"), **variant}
    captured = capture(cfg, "l4", tp=tp)
    ops = {str(i.signature): i.calls_per_forward for i in captured.instances}
    experts = variant.get("num_local_experts", 16)
    moe_layers = 24 if variant else 48
    assert ops[f"moe.experts[experts={experts},top_k=1,hidden=5120,inter={8192 // tp},transposed,bf16]"] == moe_layers
    assert ops[f"act.swiglu[width={8192 // tp},bf16]"] == moe_layers, "the shared expert"
    assert ops.get(f"act.swiglu[width={16384 // tp},bf16]", 0) == 48 - moe_layers, "the dense layers' MLPs"
    assert not any(op.startswith("moe.router") for op in ops)
    heads = f"hq={40 // tp},hkv={max(8 // tp, 1)},d=128"
    if variant:
        assert ops[f"attention.prefill[{heads},causal,bf16]"] == 48
    else:  # QK-norm on the 36 RoPE layers only
        assert ops[f"attention.prefill[{heads},causal,qk_norm,bf16]"] == 36
        assert ops[f"attention.prefill[{heads},causal,bf16]"] == 12
    notes = "\n".join(captured.notes)
    for said in ("chunked attention (36 of 48 layers, chunks of 8192 tokens): tuned as causal attention",
                 "12 of 48 layers apply no RoPE (their queries scaled by position",
                 "self_attn: rotary embedding in a form no op computes",
                 "Llama4Router", "the routing (sigmoid of the top-k logits) runs as torch ops",
                 f"each token's {variant.get('num_experts_per_tok', 1)} scaled row(s)"):
        assert said in notes, notes


# Types of transformers' causal-LM mapping whose default configs capture sees no attention call in:
# state-space and recurrent mixers really run none; the others run attention inside their own modules
# (written out as matmuls), and are refused naming what stops capture. (BLOOM's, with ALiBi biases, is
# its own module too, captured as patch() serves it: test_bloom_plans_attention_with_alibi.)
NO_ATTENTION = {
    "falcon_mamba": "FalconMambaForCausalLM runs no attention", "mamba": "MambaForCausalLM runs no attention",
    "mamba2": "Mamba2ForCausalLM runs no attention", "xlstm": "xLSTMForCausalLM runs no attention",
    **{t: f"not supported yet: attention computed in its own modules' forward, calling no attention function that "
          f"capture observes ({cls})"
       for t, cls in (("gpt_neox_japanese", "GPTNeoXJapaneseAttention"), ("mvp", "MvpAttention"),
                      ("trocr", "TrOCRAttention"), ("xglm", "XGLMAttention"))},
}


@pytest.mark.parametrize("model_type", list(NO_ATTENTION))
def test_models_without_an_observed_attention_call_are_refused_for_what_they_run(model_type):
    """"runs no attention" only where the model has none; attention written out in the model's own
    modules is refused naming that, not as a model that runs no attention."""
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    with pytest.raises(LzError) as e:
        capture(default_config(model_type), model_type)
    message = str(e.value)
    assert NO_ATTENTION[model_type] in message and "\n" not in message, message
    assert ("runs no attention" in message) == NO_ATTENTION[model_type].endswith("runs no attention"), message


# Falcon (transformers >= 5.25) asks for its causal mask materialised whatever its config
# (allow_is_causal_skip=False, so that ALiBi can be added to it): its attention then has a mask, which
# the ops do not take, and stays transformers' own; capture must say so.
MASK_MATERIALISED = {"falcon"}


def test_every_captured_model_has_attention_and_linears(outcomes):
    for model_type in DENSE:
        status, captured = outcomes[model_type]
        if status == "ok":
            ops = {i.signature.op for i in captured.instances}
            expected = {"attention.prefill", "attention.decode", "linear", "embedding"}
            if model_type in MASK_MATERIALISED and not ops & {"attention.prefill", "attention.decode"}:
                expected -= {"attention.prefill", "attention.decode"}
                assert any("attention with options" in note for note in captured.notes), captured.notes
            assert expected <= ops, (model_type, ops)


def test_null_fields_take_transformers_defaults_and_say_so(outcomes):
    # the default configs of ministral and nemotron hold head_dim / num_key_value_heads as null
    for model_type, field in (("ministral", "head_dim"), ("nemotron", "num_key_value_heads")):
        status, captured = outcomes[model_type]
        assert status == "ok", captured
        assert any(note.startswith(f"{field} is null") for note in captured.notes), captured.notes


def test_what_no_op_covers_is_named(outcomes):
    # GPT-NeoX's exact GELU has no op here; it must be said, not skipped
    status, captured = outcomes["gpt_neox"]
    assert status == "ok"
    assert any("gelu activation" in note for note in captured.notes), captured.notes


def test_plan_config_of_a_new_type_and_bad_input(tmp_path):
    import json
    path = tmp_path / "olmo2" / "config.json"
    path.parent.mkdir()
    cfg = {**default_config("olmo2"), "num_hidden_layers": 2}
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(cli, ["plan", "--config", str(path.parent), "--device", "cpu", "--grid", "tiny"])
    assert result.exit_code == 0, result.output
    assert "attention.prefill" in result.output and "olmo2" in result.output
    # bad input is an LzError (main() prints it in one line and exits 2), never another exception
    path.write_text(json.dumps({**cfg, "model_type": "no_such_model"}))
    result = CliRunner().invoke(cli, ["plan", "--config", str(path), "--device", "cpu"])
    assert isinstance(result.exception, LzError) and "no_such_model" in str(result.exception)
    # transformers' own validation errors span lines: one line of them is said
    path.write_text(json.dumps({**default_config("gemma2"), "num_hidden_layers": 2}))  # 26 layer_types
    result = CliRunner().invoke(cli, ["plan", "--config", str(path), "--device", "cpu"])
    assert isinstance(result.exception, LzError) and "\n" not in str(result.exception), result.exception
    path.write_text(json.dumps({**default_config("jetmoe"), "num_hidden_layers": 2}))
    result = CliRunner().invoke(cli, ["plan", "--config", str(path), "--device", "cpu"])
    assert isinstance(result.exception, LzError) and "mixture-of-experts" in str(result.exception)


# --- FP8 checkpoints (issue 18) ----------------------------------------------------------------------
def compressed_tensors(strategy: str, dynamic: bool = True) -> dict:
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 8, "type": "float", "strategy": strategy},
                                          "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                                "dynamic": dynamic}}}}


@pytest.mark.parametrize("quant,flags", [
    ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}, ("per_channel",)),
    (compressed_tensors("channel"), ("per_channel",)),
    (compressed_tensors("tensor"), ()),
])
def test_fp8_checkpoints_tune_their_linears_as_linear_fp8(quant, flags):
    from tests.test_cli import TINY_LLAMA

    captured = capture({**TINY_LLAMA, "quantization_config": quant}, "tiny-fp8", tp=2)
    linears = {str(i.signature): i.roles for i in captured.instances if i.signature.op.startswith("linear")}
    fp8 = [s for s in linears if s.startswith("linear.fp8")]
    assert len(fp8) == 3 and all(set(flags) <= set(s[s.index("[") + 1:-1].split(",")) for s in fp8), linears
    assert "linear.fp8[k=128,n=256" in " ".join(fp8), "o_proj row-parallel: k sharded, as a dense linear"
    # q/k/v and gate/up read a norm's output alone, down_proj the SwiGLU's: those quantise it for them
    assert {role.rsplit(".", 1)[1] for s in fp8 if s.startswith("linear.fp8_prequantised[") for role in linears[s]} \
        == {"q_proj+k_proj+v_proj", "gate_proj+up_proj", "down_proj"}, linears
    assert [s for s in linears if s.startswith("linear[")] == ["linear[k=256,n=500,bf16]"], "the ignored lm_head"
    assert any("linear.fp8" in n and "cannot serve" in n for n in captured.notes), captured.notes


@pytest.mark.parametrize("quant,what", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "quantized weights (fp8)"),  # block-wise scales
    (compressed_tensors("channel", dynamic=False), "quantized weights (compressed-tensors)"),  # static activation scales
    ({"quant_method": "awq", "bits": 4}, "quantized weights (awq)"),
])
def test_other_quantized_checkpoints_are_refused_by_format(quant, what):
    from tests.test_cli import TINY_LLAMA

    with pytest.raises(LzError, match=rf"not supported yet: {re.escape(what)}: only FP8 W8A8"):
        capture({**TINY_LLAMA, "quantization_config": quant}, "tiny-q")


def test_a_cpu_tune_of_an_fp8_checkpoint_serves_its_linears_from_the_table(tmp_path):
    """With an FP8 KV cache too: the dequantising baselines are the CPU's kernels; the CUDA-only FP8
    GEMM says why it is not here."""
    import json

    from lzsolve.pipeline import ModelSource
    from tests.tables import assert_replays_references, tuned
    from tests.test_cli import TINY_LLAMA

    config = tmp_path / "tiny-fp8" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({**TINY_LLAMA, "quantization_config": compressed_tensors("channel")}))
    out = tuned(ModelSource(config=config, fp8_kv=True), tmp_path / "out").artifact
    ops = [e["op"] for e in json.loads((out / "dispatch.json").read_text())["ops"]]
    assert ops.count("linear.fp8") == 1, "o_proj"
    assert ops.count("linear.fp8_prequantised") == 3, "q/k/v as one GEMM, gate/up as one, down_proj"
    assert {"norm.rms_fp8", "norm.rms_add_fp8", "act.swiglu_fp8"} <= set(ops), "the ops that quantise for them"
    assert "attention.decode_fp8kv" in ops and "attention.decode" not in ops, "the decode over the FP8 cache"
    assert_replays_references(out)
    plan = CliRunner().invoke(cli, ["plan", "--config", str(config), "--device", "cpu"])
    assert "torch.scaled_mm_fp8" in plan.output and "PLATFORM_MISMATCH" in plan.output, plan.output


def test_dtype_fp8_plans_the_model_as_its_fp8_deployment(tmp_path):
    result = CliRunner().invoke(cli, ["plan", "--model", "llama3-70b", "--tp", "8", "--dtype", "fp8", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("llama3-70b-fp8:") and ", bf16 on cpu" in result.output.splitlines()[0]
    assert "linear.fp8_prequantised[k=8192,n=1280,per_channel,bf16]" in result.output  # q/k/v as one FP8 GEMM
    assert "linear.fp8[k=1024,n=8192,per_channel,bf16]" in result.output, "o_proj quantises its input itself"
    assert "act.swiglu_fp8[width=3584,bf16]" in result.output, "the SwiGLU quantises for down_proj"
    assert "linear.fp8_prequantised[k=3584,n=8192,per_channel,bf16]" in result.output, "down_proj, row-parallel"
    assert "\nlinear[k=8192,n=16032,bf16]" in result.output, "the lm_head stays bf16"
    # every layer's two norms quantise for the FP8 linears after them; the final one feeds the bf16 lm_head
    assert "norm.rms_add_fp8[hidden=8192,bf16]  x159 per forward" in result.output
    assert "norm.rms_fp8[hidden=8192,bf16]  x1 per forward" in result.output
    assert "\nnorm.rms_add[hidden=8192,bf16]  x1 per forward  roles: model.norm" in result.output
    recorded = tmp_path / "w.json"
    recorded.write_text("{}")
    refused = CliRunner().invoke(cli, ["plan", "--workload", str(recorded), "--dtype", "fp8"])
    assert isinstance(refused.exception, LzError) and "--dtype fp8 describes a model" in str(refused.exception)


def test_fp8_kv_decodes_over_the_fp8_cache_where_an_op_computes_it():
    from lzsolve.models.capture import fp8_kv_cache, load

    llama = load("llama3-8b", None, 1, "bf16", fp8_kv=True)
    decodes = {str(i.signature): i.calls_per_forward for i in llama.instances if "decode" in i.signature.op}
    assert decodes == {"attention.decode_fp8kv[hq=32,hkv=8,d=128,bf16]": 32} and llama.name == "llama3-8b-fp8kv"
    assert llama.summary_line.startswith("llama3-8b-fp8kv:")
    gemma = load("gemma3-1b", None, 1, "bf16", fp8_kv=True)  # sliding layers: a window no FP8-cache op takes
    decodes = {str(i.signature): i.calls_per_forward for i in gemma.instances if "decode" in i.signature.op}
    assert decodes == {"attention.decode[hq=4,hkv=1,d=256,window=512,qk_norm,bf16]": 22,
                       "attention.decode_fp8kv[hq=4,hkv=1,d=256,bf16]": 4}
    assert any("over an FP8 KV cache" in n and "window=512" in n for n in gemma.notes)
    # MLA: v's head dim is not q's (dv), which no FP8-cache op takes either
    deepseek = fp8_kv_cache(capture(default_config("deepseek_v3"), "deepseek-v3"))
    decodes = {str(i.signature) for i in deepseek.instances if "decode" in i.signature.op}
    assert decodes == {"attention.decode[hq=128,hkv=128,d=192,dv=128,bf16]"}

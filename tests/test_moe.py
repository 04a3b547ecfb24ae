"""Mixture-of-experts models end to end on CPU: tiny random-weight Qwen3-MoE, Mixtral and GPT-OSS captured,
tuned, replayed strictly against the fp32 reference, and served by patch() with the logits and
generations of the unpatched model."""
import json

import pytest
import torch

import runtime_loader
from lzsolve.errors import LzError
from lzsolve.models.capture import capture
from lzsolve.ops import CONTRACTS
from runtime_loader import Dispatcher

from .tables import (
    QUICK,
    assert_replays_references,
    assert_served_by_its_own_table,
    serving_fallbacks,
    table_serves,
    tune_what_patched_models_call,
    tuned,
    unfused,
)

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=128, num_experts_per_tok=2)
MODELS = {  # model type -> (config class, its expert count and width keys)
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=8, moe_intermediate_size=32, intermediate_size=96)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=6, intermediate_size=48)),
    # biased, interleaved, clamped experts stored (experts, in, out); attention with sinks (left to the model)
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=4, intermediate_size=32, sliding_window=4,
                                     layer_types=["sliding_attention", "full_attention"], attn_implementation="eager")),
}


def router_of(model):
    mlp = model.model.layers[0].mlp
    return getattr(mlp, "gate", None) or mlp.router


def tiny(model_type: str):
    config_class, experts = MODELS[model_type]
    config = getattr(transformers, config_class)(**TINY, **experts)
    torch.manual_seed(5)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # transformers leaves 3-D expert weights to _init_weights: make them O(1)-preserving
        for _name, p in model.named_parameters():
            if p.dim() == 3:
                p.normal_(0, p.shape[-1] ** -0.5)
    return model


@pytest.fixture(scope="module")
def moe_artifact(tmp_path_factory):
    """One CPU tune of what both tiny models call once patched (generate() recorded with no table)."""
    return tune_what_patched_models_call(tmp_path_factory.mktemp("moe"), "tiny-moe", [tiny(t) for t in MODELS])


def test_the_table_tunes_the_experts_and_replays_the_reference(moe_artifact):
    table = json.loads((moe_artifact / "dispatch.json").read_text())
    experts = {e["signature"] for e in table["ops"] if e["op"] == "moe.experts"}
    assert experts == {"moe.experts[experts=8,top_k=2,hidden=64,inter=32,fp32]",
                       "moe.experts[experts=6,top_k=2,hidden=64,inter=48,fp32]",
                       "moe.experts[experts=4,top_k=2,hidden=64,inter=32,alpha=1.702,limit=7.0,interleaved,bias,"
                       "transposed,fp32]"}
    routers = {e["signature"] for e in table["ops"] if e["op"] == "moe.router"}
    assert routers == {"moe.router[experts=8,top_k=2,fp32]", "moe.router[experts=6,top_k=2,renorm,fp32]",
                       "moe.router[experts=4,top_k=2,renorm,fp32]"}, \
        "Qwen3-MoE's config leaves norm_topk_prob off; Mixtral always renormalises; GPT-OSS's softmax over the top-k"
    assert_replays_references(moe_artifact)


@pytest.mark.parametrize("model_type", list(MODELS))
def test_patched_moe_model_is_served_from_its_table(model_type, moe_artifact, restore_active):
    """The experts and the router served where the table serves them beyond their fallback (each
    module replaced exactly there), every call the table's, logits and generate() as unpatched."""
    from runtime_loader.integrations.transformers import observe, patch

    model = tiny(model_type)
    calls, _ = observe(model)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = model(ids).logits
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    d = runtime_loader.load(moe_artifact, strict=True)
    report = patch(model, d)
    modules = {"moe.experts": (model.model.layers[0].mlp.experts, "model.layers.0.mlp.experts"),
               "moe.router": (router_of(model), next(name for name, m in model.named_modules() if m is router_of(model)))}
    served = {op for op, (module, name) in modules.items() if table_serves(d, calls, name, op)}
    assert {op for op, (module, _) in modules.items() if report.replaced[type(module).__name__] == 2} == served, report
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
    assert_served_by_its_own_table(d)
    stats = d.stats()
    for op in served:
        assert sum(n for kernel, n in stats[op].items() if not kernel.endswith("(fallback)")) > 0, stats[op]
        assert sum(stats[op].values()) == 2 * (1 + 6), "both layers, every forward"


@pytest.mark.parametrize("model_type", list(MODELS))
def test_capture_covers_what_the_patched_model_calls(model_type, tmp_path, restore_active):
    """`tune --config` and patch() agree on the experts' signature (and every other one)."""
    from runtime_loader.integrations.transformers import patch

    model = tiny(model_type)
    captured = {str(i.signature).replace("norm.rms_add", "norm.rms")
                for i in capture(model.config.to_dict(), model_type, dtype="fp32").instances}
    patch(model, Dispatcher(None), all_ops=True)
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        model.generate(torch.randint(1, 128, (2, 12)), max_new_tokens=2, do_sample=False)
    called = {unfused(call["name"]) for call in json.loads((tmp_path / "w.json").read_text())["calls"]}
    assert any(name.startswith("moe.experts") for name in called)
    assert called <= captured, sorted(called - captured)


def test_bf16_model_keeps_its_dtype_through_the_experts(restore_active):
    """Routers hand the experts float32 or bf16 weights: the output stays in the activations' dtype."""
    from runtime_loader.integrations.transformers import patch

    model = tiny("qwen3_moe").to(torch.bfloat16)
    ids = torch.randint(1, 128, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        reference = model(ids).logits
        patch(model, serving_fallbacks())
        served = model(ids).logits
    assert served.dtype == torch.bfloat16
    torch.testing.assert_close(served.float(), reference.float(), rtol=3e-2, atol=3e-2)


def test_gpt_oss_is_served_whole_sinks_included(restore_active):
    """GPT-OSS: its router, its biased, interleaved, clamped experts (weights stored (experts, in,
    out)), its RoPE and its attention with sinks, sliding and full layers, are served, and the model
    computes what it did; a call the table cannot take (a padding mask) goes to the model's own
    eager attention, which keeps the sinks."""
    from runtime_loader.integrations.transformers import attention_forward, patch

    config = transformers.GptOssConfig(**{**TINY, "num_local_experts": 4, "intermediate_size": 32,
                                          "layer_types": ["sliding_attention", "full_attention"],
                                          "sliding_window": 4}, attn_implementation="eager")
    torch.manual_seed(2)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(1.0, 1.0)  # zeros at init: make them take a share of each row
    ids = torch.randint(1, 128, (1, 9), generator=torch.Generator().manual_seed(6))
    # SDPA cannot take sinks; the reference can
    d = serving_fallbacks(attention_prefill="eager.attention", attention_decode="eager.attention")
    with torch.no_grad():
        reference = model(ids).logits
        report = patch(model, d)
        served = model(ids).logits
    assert not report.left, f"every module served: {report}"
    assert report.replaced["GptOssTopKRouter"] == 2 and report.replaced["GptOssExperts"] == 2, report
    stats = d.stats()
    assert stats["attention.prefill"] == {"eager.attention": 2}, "sinks served, by the reference"
    assert sum(stats["posenc.rope"].values()) == 2, "its RoPE form: split halves, cos/sin with each angle once"
    torch.testing.assert_close(served, reference, rtol=1e-5, atol=1e-5)
    padded = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9])  # a padding mask: the model's own eager attention
    batch = torch.cat([ids, ids])
    with torch.no_grad():
        d_padded = model(batch, attention_mask=padded).logits
        model.set_attn_implementation("eager")
        expected_padded = model(batch, attention_mask=padded).logits
    torch.testing.assert_close(d_padded[:, 3:], expected_padded[:, 3:], rtol=1e-5, atol=1e-5)
    attn = model.model.layers[1].self_attn
    q, mask = torch.randn(1, 4, 3, 16), torch.zeros(1, 1, 3, 3)
    kv = q[:, :2]
    with torch.no_grad():
        expected = transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward(
            attn, q, kv, kv, mask, scaling=0.25, s_aux=attn.sinks)[0]
        torch.testing.assert_close(attention_forward(attn, q, kv, kv, mask, scaling=0.25, s_aux=attn.sinks)[0],
                                   expected)


# Mixture-of-experts model types these tests were not written around, each shrunk from transformers'
# default config: shared experts with a sigmoid gate (Qwen2-MoE), no renormalisation (OLMoE's
# default), float32 router logits (GraniteMoE), a sparsemixer router no op computes (PhiMoE),
# hybrid linear-attention layers (Qwen3-Next), dense first layers and a grouped sigmoid router (GLM-4 MoE)
HELD_OUT = {"qwen2_moe": 2, "olmoe": 2, "granitemoe": 2, "phimoe": 0, "qwen3_next": 4, "glm4_moe": 0}


@pytest.mark.parametrize("model_type", list(HELD_OUT))
def test_held_out_moe_types_are_served_and_compute_what_they_did(model_type, restore_active):
    from runtime_loader.integrations.transformers import patch

    from .test_families import shrink

    small = {"num_experts": 6, "num_local_experts": 6, "n_routed_experts": 6, "moe_intermediate_size": 24,
             "shared_expert_intermediate_size": 40, "num_experts_per_tok": 2, "intermediate_size": 48}
    cfg = shrink(transformers.AutoConfig.for_model(model_type).to_dict())
    cfg.update({k: v for k, v in small.items() if k in cfg})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 3:
                p.normal_(0, p.shape[-1] ** -0.5)
    ids = torch.randint(1, cfg["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    d = serving_fallbacks()
    with torch.no_grad():
        reference = model(ids).logits
        report = patch(model, d)
        served = model(ids).logits
    torch.testing.assert_close(served, reference, rtol=1e-5, atol=1e-5)
    stats = d.stats()
    experts_layers = sum(stats.get("moe.experts", {}).values())
    assert experts_layers >= 1 and not any("experts" in why for why in report.left.values()), report
    assert sum(stats.get("moe.router", {}).values()) == HELD_OUT[model_type], (stats.get("moe.router"), report)
    assert not any(cls.endswith("Activation") for cls in report.left), "the experts' act_fn is part of them"


def test_expert_parallel_table_serves_a_rank_and_patch_leaves_transformers_ep(tmp_path, restore_active):
    """`tune --tp 2 --ep 2`: the experts of one rank of two (4 of 8, whole), tuned on CPU, and replayed
    strictly on a rank's view of the routing (the other rank's slots as sentinel ids, weight 0) against
    the fp32 reference; a call without ep is another signature. Experts transformers has divided over
    ranks itself are left to its EP forward, which holds their own."""
    import dataclasses

    from lzsolve.pipeline import GridConfig, ModelSource, SearchConfig
    from runtime_loader.integrations.transformers import patch

    model = tiny("qwen3_moe")
    config = tmp_path / "tiny-qwen3-moe" / "config.json"
    config.parent.mkdir()
    config.write_text(model.config.to_json_string())
    source = ModelSource(config=config, tp=2, ep=2, dtype="fp32")
    grid = GridConfig(grid="tiny", kernels=("torch.grouped_mm", "eager.moe*"))
    out = tuned(source, tmp_path / "artifact", grid, search=SearchConfig(trials=0)).artifact
    table = json.loads((out / "dispatch.json").read_text())
    assert table["model"]["id"] == "tiny-qwen3-moe-ep2"
    (experts,) = [e for e in table["ops"] if e["op"] == "moe.experts"]
    assert experts["signature"] == "moe.experts[experts=4,top_k=2,hidden=64,inter=32,ep=2,fp32]"
    d = assert_replays_references(out)
    sig = next(s for s in d.table.trees if s.op == "moe.experts")
    kernel_args = CONTRACTS["moe.experts"].make_inputs(sig, {"tokens": 6}, torch.device("cpu"), torch.Generator())
    assert (kernel_args[1] == 4).any(), "some slots are the other rank's"
    assert d.kernel_for("moe_experts", *kernel_args[:5]) == "torch.grouped_mm", "ep=1: outside the table"
    with pytest.raises(LzError, match="--ep 3 is not a multiple of --tp 2"):
        tuned(dataclasses.replace(source, ep=3), tmp_path / "bad", grid, search=SearchConfig(trials=0))

    for layer in model.model.layers:
        layer.mlp.experts._is_expert_parallel = True  # as transformers' expert-parallel plan marks them
    report = patch(model, serving_fallbacks())
    experts_class = type(model.model.layers[0].mlp.experts).__name__
    assert experts_class not in report.replaced and "expert parallelism" in report.left[experts_class]
    assert report.replaced[type(router_of(model)).__name__] == 2, "the router still is served"


def test_routing_skew_is_a_tune_setting_recorded_and_not_mixed(tmp_path):
    """`tune --routing-skew`: the experts' inputs are drawn with it (in the worker process too), each
    moe.experts record and the artifact say which, and a tune at another skew measures the experts
    again while reusing every other record; evaluate draws as the tune did."""
    from click.testing import CliRunner

    from lzsolve.cli import cli
    from lzsolve.store.perfdb import PerfDB
    from runtime_loader.inputs import ROUTING_SKEW, SKEW_ENV, routing_skew, skewed_routing
    from runtime_loader.ops.moe import routing

    def fullest(skew):  # the fullest expert's share of the slots, over 128 experts
        ids, _ = routing(4096, 128, 8, torch.float32, "cpu", torch.Generator().manual_seed(0), skew)
        return torch.bincount(ids.flatten(), minlength=128).max().item() / (4096 * 8 / 128)

    assert fullest(0.0) < 1.3 < 2 < fullest(ROUTING_SKEW), "uniform, then about 2.4x the mean load"
    with skewed_routing(0.0):
        assert routing_skew() == 0.0
    assert routing_skew() == ROUTING_SKEW and SKEW_ENV not in __import__("os").environ

    config = tmp_path / "tiny-qwen3-moe" / "config.json"
    config.parent.mkdir()
    config.write_text(tiny("qwen3_moe").config.to_json_string())
    out = tmp_path / "artifact"

    def tune(*extra):
        result = CliRunner().invoke(cli, ["tune", "--config", str(config), "--grid", "tiny", "--trials", "0", "--dtype",
                                          "fp32", "--device", "cpu", "--no-probe", "--validate", "0", "--kernels",
                                          "torch.grouped_mm,eager.moe*", "--out", str(out), "--json", *QUICK, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["run_id"]

    skewed, uniform = tune(), tune("--routing-skew", "0")
    assert SKEW_ENV not in __import__("os").environ, "the setting ends with the command"
    assert json.loads((out / "dispatch.json").read_text())["model"]["routing_skew"] == 0.0
    evaluated = CliRunner().invoke(cli, ["evaluate", str(out), "--random", "2", "--op", "moe.experts", "--no-isolate"])
    assert evaluated.exit_code == 0, evaluated.output
    rows = PerfDB(out / "perfdb").rows("SELECT run_id, op, routing_skew, count(*) AS n FROM records "
                                       "WHERE stage <> 'capability' GROUP BY ALL")
    by_run = {(r["run_id"], r["op"]): (r["routing_skew"], r["n"]) for r in rows}
    assert by_run[(uniform, "moe.experts")][0] == 0.0 and by_run[(skewed, "moe.experts")][0] == ROUTING_SKEW
    assert by_run[(skewed, "moe.experts")][1] == by_run[(uniform, "moe.experts")][1], "measured again, all of it"
    assert not [op for run, op in by_run if run == uniform and op != "moe.experts"], "the rest reused"
    assert all(skew is None for (run, op), (skew, _) in by_run.items() if op != "moe.experts")
    (evaluation,) = [skew for (run, op), (skew, _) in by_run.items() if run.startswith("eval-")]
    assert evaluation == 0.0, "evaluate draws as the artifact's tune did"


def tiny_llama4(top_k: int = 1):
    """A tiny Llama 4 text model: MoE layers (sigmoid top-k router, experts taking each token scaled by
    its weight, a shared expert) between dense ones, chunked attention with chunks shorter than the
    prompt, QK-norm on its RoPE layers and a layer without RoPE (with the query temperature)."""
    config = transformers.Llama4TextConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=32, intermediate_size_mlp=48, num_local_experts=4, num_experts_per_tok=top_k,
        interleave_moe_layer_step=2, attention_chunk_size=4, max_position_embeddings=128, pad_token_id=0,
        floor_scale=2, attn_scale=0.5)  # the no-RoPE layer's query temperature grows every 2 positions
    torch.manual_seed(5)
    model = transformers.Llama4ForCausalLM(config).eval()
    with torch.no_grad():  # 3-D expert weights stored (experts, in, out): O(1)-preserving
        for p in model.parameters():
            if p.dim() == 3:
                p.normal_(0, p.shape[1] ** -0.5)
    assert config.layer_types.count("chunked_attention") == 3 and 0 in config.no_rope_layers
    assert config.attn_temperature_tuning and config.use_qk_norm
    return model


@pytest.mark.parametrize("top_k,kernel", [(1, "torch.grouped_mm"), (2, "torch.grouped_mm"), (2, "eager.moe_experts")])
def test_llama4_experts_are_served_and_the_model_computes_what_it_did(top_k, kernel, tmp_path, restore_active):
    """Llama 4's MoE layer served through moe.experts (each token's rows scaled by its router weights,
    one expert and weight 1 each), its router left and said why, its chunked layers handed to SDPA
    past a chunk: logits and generate() as unpatched; what the patched model calls is what capture
    planned from its config."""
    from runtime_loader.integrations.transformers import patch

    model = tiny_llama4(top_k)
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = model(ids).logits
        expected = model.generate(ids, **kw)
        d = serving_fallbacks(moe_experts=kernel)
        report = patch(model, d)
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, **kw), expected)
    assert report.replaced["Llama4TextMoe"] == 2, report
    assert "sigmoid of the top-k logits" in report.left["Llama4Router"], report
    # its layer's `hidden_states = residual + attention_states` before the norm: the fused add + norm capture plans
    assert report.fused["residual add+post_attention_layernorm"] == 4, report
    stats = d.stats()
    assert stats["moe.experts"] == {kernel: 2 * (1 + 6)}, "both MoE layers, every forward"
    assert stats["norm.rms_add"] == {"eager.rms_norm_add": 4 * (1 + 6)}, stats
    assert "moe.router" not in stats
    captured = {str(i.signature).replace("norm.rms_add", "norm.rms")
                for i in capture(model.config.to_dict(), "tiny-llama4", dtype="fp32").instances}
    recorded = tiny_llama4(top_k)
    patch(recorded, Dispatcher(None), all_ops=True)
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        # a prompt past a chunk, as capture's (its chunked layers are SDPA's, with their mask)
        recorded.generate(torch.randint(1, 128, (2, 7)), max_new_tokens=2, do_sample=False, pad_token_id=0)
    called = {unfused(call["name"]) for call in json.loads((tmp_path / "w.json").read_text())["calls"]}
    assert "moe.experts[experts=4,top_k=1,hidden=64,inter=32,transposed,fp32]" in called, called
    assert called <= captured, sorted(called - captured)


def test_llama4_experts_are_served_from_their_table(tmp_path, restore_active):
    """A table tuned for what the patched model calls serves its experts (moe.experts, transposed,
    one expert a row) from its own kernels where it chose one beyond the op's fallback, with the
    unpatched logits and generations."""
    from runtime_loader.integrations.transformers import observe, patch

    artifact = tune_what_patched_models_call(tmp_path, "tiny-llama4", [tiny_llama4()])
    model = tiny_llama4()
    ids = torch.randint(1, 128, (2, 3), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = model(ids).logits
        expected = model.generate(ids, **kw)
    calls, _ = observe(model)
    d = runtime_loader.load(artifact, strict=True)
    report = patch(model, d)
    layer = "model.layers.1.feed_forward"
    assert "moe.experts[experts=4,top_k=1,hidden=64,inter=32,transposed,fp32]" in {str(s) for s in calls[layer]}
    served = table_serves(d, calls, layer, "moe.experts")  # beyond its fallback, which the module's own code is
    assert (report.replaced["Llama4TextMoe"] == 2) == served, report
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, **kw), expected)
    assert_served_by_its_own_table(d)
    if served:
        assert sum(n for k, n in d.stats()["moe.experts"].items() if not k.endswith("(fallback)")) > 0, d.stats()

"""A real client: tiny random-initialised Hugging Face models with attn_implementation="lzsolve"."""
import copy
import dataclasses
import json
import warnings

import pytest
import torch

import runtime_loader
from runtime_loader import Dispatcher
from runtime_loader.ops import Signature
from runtime_loader.policies import Policy
from runtime_loader.table import parse_table
from tests.tables import (
    RMS,
    assert_served_by_its_own_table,
    entry,
    fused_groups,
    served_beyond_fallback,
    serving_fallbacks,
    table,
    table_serves,
    tune_what_patched_models_call,
    unfused,
    unpatch,
)

transformers = pytest.importorskip("transformers")
from runtime_loader.integrations import transformers as integration  # noqa: E402
from runtime_loader.integrations.transformers import register  # noqa: E402


class Counting(Dispatcher):
    def __init__(self):
        super().__init__(None)
        self.calls = 0

    def attention(self, *args, **kwargs):
        self.calls += 1
        return super().attention(*args, **kwargs)


COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
FAMILIES = {  # (model class, config class, options beyond COMMON)
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16)),  # QK-norm on (batch, seq, heads, d)
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig",  # (1 + w) norms, GeGLU, QK-norm after the transpose
               dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=8)),
}


def tiny(family: str):
    model_class, config_class, options = FAMILIES[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"this transformers has no {model_class}")
    config = getattr(transformers, config_class)(**COMMON, **options)
    return getattr(transformers, model_class)(config).eval()


def assert_trains_as(reference, model, ids, run=None) -> None:
    """The loss of `model` (called through `run`: compiled, say) and every parameter's gradient
    equal the unpatched `reference`'s, on a language-modelling step over `ids`."""
    losses = [(model if run is None else run)(ids, labels=ids).loss, reference(ids, labels=ids).loss]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def logits(model, impl, ids, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, **kw).logits


@pytest.fixture
def counting():
    d = Counting()
    register(d)
    yield d
    runtime_loader.custom_ops.activate(Dispatcher(None))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_same_logits_as_sdpa(family, counting):
    torch.manual_seed(0)
    model = tiny(family)
    ids = torch.randint(0, 128, (2, 12))
    ref = logits(model, "sdpa", ids)
    out = logits(model, "lzsolve", ids)
    assert counting.calls == 2, "both layers went through the dispatcher"
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    flagged = {key[-1] for key in counting._caches["attention"]}  # the last key field is qk_norm
    assert flagged == {family == "qwen3"}, "Qwen3's QK-norm reaches the signature, so its tuned entries serve it"


def test_generation_matches_sdpa(counting):
    torch.manual_seed(1)
    model = tiny("llama")
    ids = torch.randint(0, 128, (1, 6))
    kw = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    model.set_attn_implementation("sdpa")
    expected = model.generate(ids, **kw)
    model.set_attn_implementation("lzsolve")
    assert torch.equal(model.generate(ids, **kw), expected)
    assert counting.calls >= 2 * 6, "prefill and every decode step used the dispatcher"


def test_padding_masks_are_handed_to_sdpa(counting):
    torch.manual_seed(2)
    model = tiny("llama")
    ids = torch.randint(0, 128, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    ref = logits(model, "sdpa", ids, attention_mask=mask)
    out = logits(model, "lzsolve", ids, attention_mask=mask)
    torch.testing.assert_close(out, ref)
    assert counting.calls == 0, "a padding mask is not a case the table covers"


def test_compiled_model_fullgraph(counting):
    torch.manual_seed(3)
    model = tiny("llama")
    ids = torch.randint(0, 128, (1, 16))
    ref = logits(model, "sdpa", ids)
    model.set_attn_implementation("lzsolve")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # raises on any graph break
    with torch.no_grad():
        out = compiled(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert counting.calls == 2, "the compiled graph calls torch.ops.lzsolve.attention in both layers"


def test_sliding_window_layers_go_through_the_table(counting):
    # Mistral with a window shorter than the prompt: the window reaches the table as an argument
    # (no mask), and prefill and decode match SDPA with transformers' own sliding mask
    config = transformers.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                        max_position_embeddings=128)
    model = transformers.MistralForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(0))
    reference = logits(model, "sdpa", ids)
    assert torch.allclose(logits(model, "lzsolve", ids), reference, atol=1e-4, rtol=1e-4)
    assert counting.calls == 2, "both layers' prefill served by the table"
    model.set_attn_implementation("sdpa")
    expected = model.generate(ids, max_new_tokens=12, do_sample=False)
    model.set_attn_implementation("lzsolve")
    assert torch.equal(model.generate(ids, max_new_tokens=12, do_sample=False), expected)
    assert counting.calls > 2 + 2 * 11 - 1, "decode steps served by the table too"


# --- patch: every module the table serves --------------------------------------------------------
def llama_of(config: dict):
    torch.manual_seed(5)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()


def test_patch_serves_attention_norms_rope_mlp_and_linears_from_the_table(tiny_llama_artifact, restore_active):
    from runtime_loader.integrations.transformers import observe, patch
    from tests.test_cli import TINY_LLAMA

    model = llama_of(TINY_LLAMA)
    calls, groups = observe(model)
    ids = torch.randint(0, 1000, (1, 11))
    ref = logits(model, "sdpa", ids)
    d = runtime_loader.load(tiny_llama_artifact, strict=True)
    report = patch(model, d)
    kinds = {"LlamaMLP": "model.layers.0.mlp", "LlamaRMSNorm": "model.layers.0.input_layernorm",
             "Embedding": "model.embed_tokens", "apply_rotary_pos_emb": "model.layers.0.self_attn"}
    assert {kind for kind, name in kinds.items() if table_serves(d, calls, name, None if kind != "apply_rotary_pos_emb"
                                                                 else "posenc.rope")} == set(report.replaced) & set(kinds)
    fused = fused_groups(d, model, calls, groups)
    assert {k: n for k, n in report.fused.items() if k.endswith("_proj")} == fused, \
        "q/k/v and gate/up as one GEMM exactly where the table serves it beyond the fallback"
    with torch.no_grad():
        out = model(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_served_by_its_own_table(d)
    served = served_beyond_fallback(d)
    # a linear served only where the table serves one beyond the fallback (the input's 11 tokens may
    # still fall in a bucket where it chose the fallback)
    assert "linear" not in served or fused or any(table_serves(d, calls, name, "linear") for name in calls), d.stats()
    assert ("attention.prefill" in served) == table_serves(d, calls, "model.layers.0.self_attn", "attention.prefill")


def test_served_modules_take_their_forward_from_a_class_and_a_second_patch_changes_nothing(tiny_llama_artifact,
                                                                                           restore_active):
    """patch() gives a served module a subclass of its class whose forward serves it, not a forward
    of its own: Dynamo guards an instance's own forward on every call of a compiled model (about
    100 guard lines a layer, benchmark log §11.9). The module stays an instance of its class, under its
    name, and patching the model again serves it the same way."""
    from runtime_loader.integrations.transformers import patch
    from tests.test_cli import TINY_LLAMA

    model = llama_of(TINY_LLAMA)
    classes = {name: type(module) for name, module in model.named_modules()}
    ids = torch.randint(0, 1000, (1, 11))
    ref = logits(model, "sdpa", ids)
    # linears locked to a kernel other than their fallback: the sibling groups are fused too
    d = runtime_loader.load(tiny_llama_artifact, strict=True, lock={"linear": "eager.linear"})
    first = patch(model, d)
    assert not [name for name, module in model.named_modules() if "forward" in vars(module)]
    swapped = {name for name, module in model.named_modules() if type(module) is not classes[name]}
    assert swapped and all(isinstance(module, classes[name]) and type(module).__name__ == classes[name].__name__
                           for name, module in model.named_modules()), swapped
    assert "model.layers.0.self_attn.q_proj" in swapped and "model.layers.0.mlp.gate_proj" in swapped
    second = patch(model, d)
    assert second.replaced == first.replaced and second.fused == first.fused, (first, second)
    assert all(type(type(module)).__name__ == "type" and type(module).__mro__[1] is classes[name]
               for name, module in model.named_modules() if name in swapped)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_patched_generation_with_padding_equals_unpatched(family, restore_active):
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(6)
    model = tiny(family)
    ids = torch.randint(1, 128, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: attention takes SDPA, the other modules the dispatcher
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expected = model.generate(ids, **kw)
        d = serving_fallbacks()
        patch(model, d)
        got = model.generate(ids, **kw)
    assert torch.equal(got, expected)
    stats = d.stats()
    assert {"norm.rms", "posenc.rope", "act.swiglu", "linear"} <= set(stats)
    assert ("norm.qk" in stats) == (family == "qwen3")


def test_patched_model_compiles_with_fullgraph(restore_active):
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(7)
    model = tiny("llama")
    ids = torch.randint(0, 128, (1, 16))
    ref = logits(model, "sdpa", ids)
    d = serving_fallbacks()
    patch(model, d)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # raises on any graph break
    before = d.stats()
    with torch.no_grad():
        out = compiled(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    after = d.stats()
    for op in ("norm.rms", "linear", "act.swiglu", "posenc.rope", "attention.prefill"):
        assert sum(after[op].values()) > sum(before.get(op, {}).values()), f"{op} runs through torch.ops.lzsolve"



@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_bf16_model_with_fp32_layer_norms_compiles_and_computes_what_it_did(backend, restore_active):
    """A bf16 GPT-NeoX whose LayerNorms are kept in fp32: nn.LayerNorm returns x's dtype (bf16), and so
    must the norm.layer fallback its fp32 weight sends the call to. Compiled, the patch calls the custom
    op, which never hands back to the module's own code: a fallback (or fake) promoting to fp32 fed the
    next bf16 linear an fp32 input ('mat1 and mat2 must have the same dtype')."""
    from runtime_loader.integrations.transformers import patch

    if not hasattr(transformers, "GPTNeoXForCausalLM"):
        pytest.skip("this transformers has no GPT-NeoX")
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=128)
    model = transformers.GPTNeoXForCausalLM(config).to(torch.bfloat16).eval()
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.float()
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    d = Dispatcher(None, policy=Policy(lock={"norm.layer": "torch.layer_norm"}))
    patch(model, d)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, backend=backend)(ids).logits
    assert eager.dtype == compiled.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(eager, ref)
    torch.testing.assert_close(compiled, ref)
    # eager: the patch hands each of the 5 norms back to nn.LayerNorm; compiled: the custom op's fallback
    assert d.stats()["norm.layer"] == {"own code (fallback)": 5, "eager.layer_norm (fallback)": 5}

# --- four families, each tuned on CPU from what its patched forward calls ------------------------
def seeded_tiny(family: str):
    torch.manual_seed(11)
    return tiny(family)


def tiny_gemma4(**second_layer):
    """Gemma 4 (transformers 5.2x), whose layers differ: the full-attention layer's head_dim is its
    own (a per-layer config; more of its fields from second_layer), and each layer's v_norm is an
    RMSNorm of q_norm's class built without a weight. None where this transformers has no Gemma 4."""
    if not hasattr(transformers, "Gemma4ForCausalLM"):
        return None
    torch.manual_seed(11)
    config = transformers.Gemma4TextConfig(**COMMON, head_dim=16, sliding_window=8,
                                           layer_types=["sliding_attention", "full_attention"],
                                           hidden_size_per_layer_input=16, vocab_size_per_layer_input=128,
                                           per_layer_config={"01": {"head_dim": 32, **second_layer}})
    return transformers.Gemma4ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def families_artifact(tmp_path_factory):
    """One CPU tune of what the four tiny families (and a tiny Gemma 4) call once patched:
    generate() under record (no table yet), then tune --workload on it (tiny grid, no probes or
    validation: the tests check serving, not decisions)."""
    models = [seeded_tiny(family) for family in FAMILIES] + [m for m in [tiny_gemma4()] if m is not None]
    return tune_what_patched_models_call(tmp_path_factory.mktemp("families"), "tiny-families", models)


def patched(model, artifact):
    """(dispatcher, report, ids, logits, generated): the model's logits and greedy generate() on
    fixed ids before it is patched, then the model patched with the artifact's table."""
    from runtime_loader.integrations.transformers import patch

    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    reference = logits(model, "sdpa", ids)
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    d = runtime_loader.load(artifact, strict=True)
    return d, patch(model, d), ids, reference, expected


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_family_is_served_from_its_table(family, families_artifact, restore_active):
    """Logits and generate() equal to the unpatched model; every call the table's (one of its kernels,
    or its choice of the op's fallback handed to the module's own code); each kind of module served
    exactly where the table serves some call of it beyond the fallback; the same under
    torch.compile(fullgraph=True)."""
    from runtime_loader.integrations.transformers import observe

    model = seeded_tiny(family)
    calls, groups = observe(model)
    d, report, ids, reference, expected = patched(model, families_artifact)
    norm = "pre_feedforward_layernorm" if family == "gemma3" else "post_attention_layernorm"
    adds = table_serves(d, calls, "model.layers.0", "norm.rms_add")
    assert report.fused == {**fused_groups(d, model, calls, groups),
                            **({f"residual add+{norm}": 2} if adds else {})}, report
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
    assert_served_by_its_own_table(d)
    stats = d.stats()
    served = served_beyond_fallback(d)
    act = "act.geglu" if family == "gemma3" else "act.swiglu"
    # each op kind by the modules that call it (the q and k norms differ in heads: two signatures, two decisions)
    kinds = {"embedding": ("model.embed_tokens",), act: ("model.layers.0.mlp",),
             "posenc.rope": ("model.layers.0.self_attn",), "norm.rms": ("model.layers.0.input_layernorm",),
             "norm.rms_add": ("model.layers.0",),
             **({"norm.qk": ("model.layers.0.self_attn.q_norm", "model.layers.0.self_attn.k_norm")}
                if family in ("qwen3", "gemma3") else {})}
    assert ({op for op, names in kinds.items() if any(table_serves(d, calls, name, op) for name in names)}
            == served & set(kinds)), stats
    if fused := fused_groups(d, model, calls, groups):  # each fused group ("q_proj+k_proj+v_proj": layers)
        assert sum(stats["linear"].values()) >= (1 + 6) * sum(fused.values()), "one GEMM a group, every forward"
    if adds:
        assert sum(stats["norm.rms_add"].values()) == (1 + 6) * 2, "each layer's residual add and its norm in one call"

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # raises on any graph break
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, reference, rtol=1e-5, atol=1e-5)
    assert_served_by_its_own_table(d)  # the compiled calls too (the custom ops hand nothing back)


def test_a_fused_residual_add_leaves_the_hidden_states_the_caller_keeps(restore_active, tmp_path):
    """The layer's input is a hidden state output_hidden_states returns (and the user's
    inputs_embeds for the first layer): the fused add and norm asks for keep_inputs, which no
    in-place kernel (a serving engine's) may serve. All hidden states as unpatched."""
    from runtime_loader.integrations.transformers import patch

    model = seeded_tiny("llama")
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        kept = embeds.clone()
        expected = model(inputs_embeds=embeds, output_hidden_states=True).hidden_states
        d = serving_fallbacks()
        report = patch(model, d)
        got = model(inputs_embeds=embeds, output_hidden_states=True).hidden_states
    assert report.fused["residual add+post_attention_layernorm"] == 2
    assert "norm.rms_add" in d.stats(), "the fused call was served"
    assert torch.equal(embeds, kept)
    for layer, (g, e) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=f"hidden state {layer}")
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        model(inputs_embeds=embeds)
    adds = [c["name"] for c in json.loads((tmp_path / "w.json").read_text())["calls"] if "rms_add" in c["name"]]
    assert adds and all("keep_inputs" in name for name in adds), adds


def test_a_model_whose_layers_differ_is_served_from_its_table(families_artifact, restore_active, tmp_path):
    """Gemma 4: both head dims from the table, the weightless v_norm left to its own forward (it
    was once patched as its class's q_norm and raised), logits and generate() as unpatched."""
    model = tiny_gemma4()
    if model is None:
        pytest.skip("this transformers has no Gemma 4")
    from runtime_loader.integrations.transformers import observe

    observed, groups = observe(model)
    d, report, ids, reference, expected = patched(model, families_artifact)
    # per layer q_norm, k_norm, the four around the blocks and the per-layer input's; two after the layers
    norms = [name for name, module in model.named_modules() if type(module).__name__ == "Gemma4RMSNorm"
             and getattr(module, "weight", None) is not None]
    assert len(norms) == 2 * 7 + 2
    assert report.replaced["Gemma4RMSNorm"] == sum(table_serves(d, observed, name) for name in norms), report
    assert all("forward" not in vars(layer.self_attn.v_norm) for layer in model.model.layers), "v_norm is left"
    assert "Gemma4RMSNorm with parameters none" in report.left, report
    with torch.no_grad():
        with runtime_loader.record(tmp_path / "served.json"):
            torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
    calls = json.loads((tmp_path / "served.json").read_text())["calls"]
    assert calls and {c["served"] for c in calls} == {"table"}, [c["name"] for c in calls if c["served"] != "table"]
    assert "linear" not in {c["signature"]["op"] for c in calls} or fused_groups(d, model, observed, groups) or any(
        table_serves(d, observed, n, "linear") for n in observed), "a linear served only where the table serves one"
    if table_serves(d, observed, "model.layers.0.self_attn", "attention.prefill"):
        assert {c["signature"]["static"]["d"] for c in calls if c["signature"]["op"] == "attention.prefill"} == {16, 32}


def test_a_config_whose_heads_differ_by_layer_is_patched_and_computes_what_it_did(restore_active):
    """A per-layer config raises for a field its layers set apart (here the KV heads: reading
    num_key_value_heads off the model's config is an error); patch reads each QK-norm's heads
    without it (once it raised, and patch with it). Logits and generate() as unpatched."""
    from runtime_loader.integrations.transformers import patch

    model = tiny_gemma4(num_key_value_heads=1)
    if model is None:
        pytest.skip("this transformers has no Gemma 4")
    with pytest.raises(RuntimeError):
        getattr(model.config.get_text_config(), "num_key_value_heads")  # noqa: B009 - the read is the test
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference, expected = model(ids).logits, model.generate(ids, max_new_tokens=5, do_sample=False)
        d = serving_fallbacks()
        report = patch(model, d)
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False), expected)
    assert report.replaced["Gemma4RMSNorm"] and "norm.qk" in d.stats(), report


def lzsolve_nodes(graphs) -> int:
    return sum("lzsolve" in str(node.target) for g in graphs for node in g.graph.nodes if node.op == "call_function")


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_traced_patch_puts_the_tables_kernels_in_the_graph(family, families_artifact, restore_active):
    """patch(traced=True): under torch.compile the table's choice is made while tracing and its
    kernels' torch ops are in the one graph (no opaque torch.ops.lzsolve node, no graph break);
    the default keeps one opaque node per call. Same logits either way, every call from the table;
    traced with fuse (the default: norms, activations, RoPE in their torch form) and without."""
    from runtime_loader.integrations.transformers import patch

    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    reference = logits(seeded_tiny(family), "sdpa", ids)
    for traced, fuse in ((False, True), (True, True), (True, False)):
        model = seeded_tiny(family)
        # linears locked to a kernel other than their fallback: served whatever the CPU tune chose elsewhere
        d = runtime_loader.load(families_artifact, strict=True, lock={"linear": "eager.linear"})
        patch(model, d, traced=traced, fuse=fuse)
        torch._dynamo.reset()
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(ids)
        assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
        assert (lzsolve_nodes(explained.graphs) == 0) == traced, "traced: the kernels' own ops, not custom ops"
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        with torch.no_grad():
            for _ in range(3):  # the second and third calls run the first one's graph: no recompile
                torch.testing.assert_close(compiled(ids).logits, reference, rtol=1e-5, atol=1e-5)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        assert graphs == 1, f"{graphs} graphs compiled for one shape"
        if not traced:  # the custom ops count their calls; traced calls are not counted
            stats = d.stats()
            assert stats and not any("(fallback)" in k for kernels in stats.values() for k in kernels), stats


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_tune_from_the_config_covers_what_the_patched_model_calls(family, tmp_path, restore_active):
    """`tune --config` (capture) and patch() must agree on signatures, or a table tuned from a
    config would serve nothing of the patched model. Norms capture calls fused residual adds are
    served by patch as plain norms (same signature but for the op)."""
    from lzsolve.models.capture import capture
    from runtime_loader.integrations.transformers import patch

    model = seeded_tiny(family)
    cfg = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    captured = {str(i.signature).replace("norm.rms_add", "norm.rms")
                for i in capture(cfg, family, dtype="fp32").instances}
    patch(model, Dispatcher(None), all_ops=True)
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        model.generate(torch.randint(1, 128, (2, 12)), max_new_tokens=2, do_sample=False)
    called = {unfused(call["name"]) for call in json.loads((tmp_path / "w.json").read_text())["calls"]}
    assert called <= captured, sorted(called - captured)


# --- patch serves only what the table serves: every state a user can be in ----------------------
def unchanged(model, classes: dict, functions: dict) -> bool:
    """Every module of its class, with no forward of its own, and the modelling functions as they were."""
    return (all(type(module) is classes[name] and "forward" not in vars(module)
                for name, module in model.named_modules())
            and all(getattr(module, name) is function for (module, name), function in functions.items()))


def as_it_is(model) -> tuple[dict, dict]:
    from runtime_loader.integrations.modules import modelling_modules
    functions = {(m, "apply_rotary_pos_emb"): m.apply_rotary_pos_emb for m in modelling_modules(model)
                 if hasattr(m, "apply_rotary_pos_emb")}
    return {name: type(module) for name, module in model.named_modules()}, functions


def test_patch_with_no_table_changes_nothing_and_warns_once(tmp_path, restore_active):
    from runtime_loader.integrations.transformers import patch

    model = tiny("llama")
    classes, functions = as_it_is(model)
    implementation, active = model.config._attn_implementation, runtime_loader.custom_ops.active()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = runtime_loader.load(tmp_path / "not-tuned-yet")
        report = patch(model, d)
    assert [str(w.message) for w in caught if "patch() changed nothing" in str(w.message)] == [
        f"lzsolve: patch() changed nothing (no table: {d.load_error}); the model runs as it was"]
    assert "no artifact folder" in report.table and not report.replaced and "every module" in report.left
    assert unchanged(model, classes, functions)
    assert model.config._attn_implementation == implementation and runtime_loader.custom_ops.active() is active
    for dispatcher in (Dispatcher(None), Dispatcher(parse_table(table()), policy=Policy(disable=True))):
        assert not patch(model, dispatcher).replaced and unchanged(model, classes, functions)


def test_a_partial_table_patches_exactly_its_signatures(restore_active):
    """tables.table() holds the tiny Llama's RMSNorm and its causal prefill attention, nothing else:
    those are served, every other module keeps its own forward, and the logits are unpatched's."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(4)
    model = tiny("llama")
    classes, functions = as_it_is(model)
    ids = torch.randint(0, 128, (1, 8))
    reference = logits(model, "sdpa", ids)
    d = Dispatcher(parse_table(table()))
    report = patch(model, d)
    assert dict(report.replaced) == {"LlamaRMSNorm": 5} and not report.fused, report
    served = {name for name, module in model.named_modules() if type(module) is not classes[name]}
    assert served == {name for name in classes if name.endswith("layernorm") or name == "model.norm"}
    assert all(getattr(module, name) is function for (module, name), function in functions.items()), "RoPE left"
    assert model.config._attn_implementation == "lzsolve", "attention: its prefill is in the table"
    assert "not in the table" in report.left["Linear"]
    assert "not in the table" in report.left["LlamaMLP"] and "not in the table" in report.left["q_proj+k_proj+v_proj as one GEMM"]
    with torch.no_grad():
        torch.testing.assert_close(logits(model, "lzsolve", ids), reference, rtol=1e-5, atol=1e-5)
    assert set(d.stats()) == {"norm.rms", "attention.prefill"}, d.stats()
    assert d.coverage()["share"] == 1.0


def test_a_traced_patch_leaves_the_modules_whose_torch_form_inductor_fuses(restore_active):
    """patch(traced=True) (fuse, the default) serves no call of a fusible op (norms, activations, RoPE,
    the embedding: they trace their fallback), so it leaves their modules as they are: a patched module
    there only added Dynamo guards. The rest of the table is still served; fuse=False and an eager
    patch serve the norms."""
    from runtime_loader.dispatcher import TRACED_FUSIBLE
    from runtime_loader.integrations.transformers import patch

    norms_only = table(ops=[entry(RMS, {"kernel_id": "torch.rms_norm"})], timing_mode="graph")
    for raw, attention in ((norms_only, False), (table(timing_mode="graph"), True)):
        model = tiny("llama")
        classes, functions = as_it_is(model)
        report = patch(model, Dispatcher(parse_table(raw)), traced=True)
        assert not report.replaced and report.left["LlamaRMSNorm"] == f"norm.rms[hidden=64,fp32]: {TRACED_FUSIBLE}"
        assert unchanged(model, classes, functions)
        assert (model.config._attn_implementation == "lzsolve") == attention, "attention is not fusible: served"
    for traced, fuse in ((True, False), (False, True)):
        model = tiny("llama")
        assert dict(patch(model, Dispatcher(parse_table(norms_only)), traced=traced, fuse=fuse).replaced) == {
            "LlamaRMSNorm": 5}


def test_calls_past_the_tuned_range_run_the_modules_own_code_warn_once_and_count(restore_active):
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(4)
    model = tiny("llama")
    d = Dispatcher(parse_table(table()))  # norm.rms tuned at tokens 1 and 16: served up to 24
    patch(model, d)
    long = torch.randint(0, 128, (2, 20))  # 40 tokens: past the range
    reference = logits(tiny_copy(model), "sdpa", long)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            first = model(long).logits
            model(long)
    past = sorted(str(w.message) for w in caught if "past the tuned range" in str(w.message))
    assert len(past) == 2, "once per signature, not per call"
    assert "attention.prefill[hq=4,hkv=2,d=16,causal,fp32] past the tuned range (batch=2 > 1.5)" in past[0]
    assert "norm.rms[hidden=64,fp32] past the tuned range (tokens=40 > 24)" in past[1] and "--workload" in past[1]
    torch.testing.assert_close(first, reference, rtol=1e-5, atol=1e-5)
    assert d.stats()["norm.rms"] == {"own code (fallback)": 2 * 5}
    coverage = d.coverage()
    assert coverage["outside"]["norm.rms[hidden=64,fp32]"] == {"calls": 10, "why": {"past the tuned range (tokens=40 > 24)": 10}}
    assert coverage["calls"] == 10 + 2 * 2 and coverage["served"] == 0, coverage
    assert d.stats()["attention.prefill"] == {"sdpa.default (fallback)": 2 * 2}, "builds the mask patch left out"


def test_a_shape_handed_back_once_skips_the_tables_lookup_after_and_still_counts(restore_active, monkeypatch, tmp_path):
    """A patched module remembers the shapes the table handed back (Dispatcher.own_calls_memo): their
    later calls run its own forward without the table's lookup (a call less through the method and its
    key), counted as before; a served shape is never remembered; clear_cache (a recording's start, a
    kernel dropped) forgets them, and a recording sees every call."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(4)
    model = tiny("llama")
    d = Dispatcher(parse_table(table()))  # norm.rms tuned at tokens 1 and 16: served up to 24
    patch(model, d)
    norm = model.model.norm
    lookups = []
    real = d.served.rms_norm
    monkeypatch.setattr(d.served, "rms_norm", lambda *args: lookups.append(args[0].shape) or real(*args))
    past, inside = torch.randn(1, 40, 64), torch.randn(1, 8, 64)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for _ in range(3):
            torch.testing.assert_close(norm(past), type(norm)._lzsolve_base.forward(norm, past))
            norm(inside)
    assert lookups == [past.shape] + [inside.shape] * 3, "the handed-back shape is looked up once"
    assert list(norm._lzsolve_own) == [(past.shape, past.dtype)]
    assert d.stats()["norm.rms"] == {"own code (fallback)": 3, "torch.rms_norm": 3}, d.stats()
    d.clear_cache()
    assert not norm._lzsolve_own and d.stats()["norm.rms"] == {"own code (fallback)": 3, "torch.rms_norm": 3}
    with runtime_loader.record(tmp_path / "workload.json") as recording, torch.no_grad():
        norm(past)
        norm(past)
    assert not norm._lzsolve_own and lookups[-2:] == [past.shape] * 2, "a recording resolves every call"
    assert sum(recording.calls.values()) == 2


def test_a_patched_model_copied_after_it_ran_counts_and_records_every_call(restore_active, tmp_path):
    """copy.deepcopy of a patched model that already ran (a client's second replica): its modules'
    memos of handed-back shapes must be the dispatcher's own, or their counters were copies the
    dispatcher never sees nor clears: the copy's calls went missing from stats() and from a recording
    (a table tuned on that workload then lacked them)."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(4)
    model = tiny("llama")
    d = Dispatcher(parse_table(table()))  # norm.rms tuned at tokens 1 and 16: served up to 24
    patch(model, d)
    past = torch.randint(0, 128, (1, 40))
    with torch.no_grad():
        model(past)
        twin = copy.deepcopy(model)
        twin(past)
    assert d.stats()["norm.rms"] == {"own code (fallback)": 2 * 5}, "the copy's calls are counted"
    with runtime_loader.record(tmp_path / "w.json") as recording, torch.no_grad():
        twin(past)
    assert {sig.op: n for (sig, *_), n in recording.calls.items()}.get("norm.rms") == 5, recording.calls


@pytest.mark.parametrize("traced", [False, True])
def test_a_partial_table_compiles_whole_and_calls_past_its_range_trace_the_modules_own_code(traced, restore_active):
    """Under torch.compile(fullgraph=True): the served norms as custom ops (or traced, their kernels'
    ops in the graph), calls past the tuned range as the module's own code when traced (the
    custom ops take the op's fallback); no graph break, the unpatched model's logits."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(4)
    model = tiny("llama")
    d = Dispatcher(parse_table(table()))
    patch(model, d, traced=traced, fuse=False)
    for tokens in (8, 40):  # inside norm.rms's range (24), past it
        ids = torch.randint(0, 128, (1, tokens))
        reference = logits(tiny_copy(model), "sdpa", ids)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids).logits, reference, rtol=1e-5, atol=1e-5)
        if traced:
            expected = "torch.rms_norm" if tokens == 8 else "eager.rms_norm"
            x = torch.randn(tokens, 64)
            assert d.traced_kernel_for("rms_norm", x, torch.randn(64), 1e-6) == expected


def tiny_copy(model):
    """The unpatched twin of a tiny patched model: the same weights in a fresh model of its base class."""
    from runtime_loader.integrations.transformers import _base_class
    fresh = _base_class(model)(copy.deepcopy(model.config)).eval()
    fresh.load_state_dict(model.state_dict())
    return fresh


def test_another_models_table_another_dtype_or_device_patch_nothing(restore_active, monkeypatch):
    from runtime_loader.integrations.transformers import patch

    other = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**COMMON, "hidden_size": 96})).eval()
    classes, functions = as_it_is(other)
    report = patch(other, Dispatcher(parse_table(table())))  # tuned for hidden 64
    assert not report.replaced and unchanged(other, classes, functions), report
    assert "norm.rms[hidden=96,fp32]: not in the table" in report.left["LlamaRMSNorm"]
    half = tiny("llama").to(torch.bfloat16)
    classes, functions = as_it_is(half)
    assert not patch(half, Dispatcher(parse_table(table()))).replaced and unchanged(half, classes, functions)
    cuda = parse_table(table(hardware={**table()["hardware"], "device": "cuda", "name": "NVIDIA H200", "sm": 90}))
    from runtime_loader import dispatcher
    from runtime_loader.specs import DeviceInfo
    monkeypatch.setattr(dispatcher, "device_info", lambda device: DeviceInfo("cuda", 90))  # (a CUDA machine)
    monkeypatch.setattr(dispatcher, "hardware_signature", lambda device: cuda.hardware)
    model = tiny("llama")
    classes, functions = as_it_is(model)
    report = patch(model, Dispatcher(cuda))
    assert not report.replaced and unchanged(model, classes, functions) and "tuned on cuda" in report.table


def test_patch_warns_when_the_table_ranked_kernels_by_gpu_time_alone(restore_active):
    from runtime_loader.integrations.transformers import patch

    with pytest.warns(UserWarning, match="graph mode"):
        patch(tiny("llama"), Dispatcher(parse_table(table(timing_mode="graph"))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch(tiny("llama"), Dispatcher(parse_table(table())))  # an eager table: no warning
        # a traced patch is for a compiled model, which a graph-mode table fits
        patch(tiny("llama"), Dispatcher(parse_table(table(timing_mode="graph"))), traced=True)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_patched_generation_with_a_static_cache_equals_unpatched(family, restore_active):
    """A static cache hands attention the whole preallocated cache with a mask (SDPA serves it);
    the other modules go through the dispatcher, and the tokens are unpatched's."""
    from runtime_loader.integrations.transformers import patch

    model = seeded_tiny(family)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expected = model.generate(ids, **kw)
        d = serving_fallbacks()
        patch(model, d)
        assert torch.equal(model.generate(ids, **kw), expected)
    assert {"norm.rms", "posenc.rope", "linear"} <= set(d.stats())


def test_a_model_that_cannot_be_twinned_is_left_as_it_was_and_says_so(restore_active):
    """What a module calls is found on a meta copy made with type(model)(config); a class that needs
    more than its config cannot be copied so: patch() cannot tell what the table serves, leaves the
    model as it was and says why; all_ops=True serves it whole, its linears unfused."""
    from runtime_loader.integrations.transformers import patch

    class NeedsMore(transformers.LlamaForCausalLM):
        def __init__(self, config, extra):
            super().__init__(config)

    torch.manual_seed(12)
    model = NeedsMore(transformers.LlamaConfig(**COMMON), extra=1).eval()
    classes = {name: type(module) for name, module in model.named_modules()}
    ids = torch.randint(1, 128, (1, 9))
    reference = logits(model, "sdpa", ids)
    report = patch(model, serving_fallbacks())
    assert not report.replaced and "TypeError" in report.left["every module"], report
    assert all(type(module) is classes[name] for name, module in model.named_modules())
    report = patch(model, serving_fallbacks(), all_ops=True)
    assert report.replaced["LlamaRMSNorm"] == 5, report
    assert not [k for k in report.fused if k.endswith("_proj")] and "TypeError" in report.left["sibling linears"], report
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)


def test_sibling_linears_with_biases_are_one_gemm_over_shared_storage(restore_active):
    """Qwen2's q/k/v carry biases: fused with them; each member's weight and bias are views of the
    fused ones (no second copy), and a member moved to a new storage is fused again."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(13)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON)).eval()
    ids = torch.randint(1, 128, (2, 9))
    reference = logits(model, "sdpa", ids)
    d = serving_fallbacks()
    report = patch(model, d)
    assert {k: n for k, n in report.fused.items() if k.endswith("_proj")} == {"q_proj+k_proj+v_proj": 2,
                                                                             "gate_proj+up_proj": 2}
    attn = model.model.layers[0].self_attn
    siblings = attn.q_proj._lzsolve_siblings
    assert siblings.bias is not None
    assert attn.k_proj.bias.data_ptr() == siblings.bias.data_ptr() + attn.q_proj.out_features * siblings.bias.element_size()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == siblings.weight.untyped_storage().data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        model.double()  # every parameter gets new storage: the fused weights are built again
        torch.testing.assert_close(model(ids).logits.float(), reference, rtol=1e-5, atol=1e-5)
    assert siblings.weight.dtype == torch.float64
    # fp32: served, one GEMM per group; fp64, a dtype no signature holds: the groups' GEMM on the op's
    # fallback (one GEMM still), the other linears' own forwards
    assert d.stats()["linear"] == {"torch.linear": 2 * 4 + 1, "torch.linear (fallback)": 2 * 2,
                                   "own code (fallback)": 2 * 2 + 1}


def test_token_embeddings_are_served_with_their_scale_and_others_left(restore_active):
    """Gemma's scaled embedding (weight[ids] * sqrt(hidden) in the weight's dtype) goes through the
    embedding op with its scale; one that renormalises rows (max_norm) keeps its own forward."""
    from runtime_loader.integrations.transformers import patch

    model = tiny("gemma3").to(torch.bfloat16)
    ids = torch.randint(1, 128, (2, 7))
    with torch.no_grad():
        reference = model.model.embed_tokens(ids)
    d = serving_fallbacks()
    report = patch(model, d)
    assert report.replaced["Gemma3TextScaledWordEmbedding"] == 1
    with torch.no_grad():
        assert torch.equal(model.model.embed_tokens(ids), reference)
    [(kernel, calls)] = d.stats()["embedding"].items()
    assert calls == 1 and model.model.embed_tokens._lzsolve_scale == pytest.approx(64 ** 0.5, rel=1e-2)

    llama = tiny("llama")
    llama.model.embed_tokens.max_norm = 1.0
    report = patch(llama, serving_fallbacks())
    assert "Embedding" in report.left and "Embedding" not in report.replaced


def test_a_sliced_input_reads_each_weight_once(restore_active):
    """The lm_head over hidden[:, -1:] (logits_to_keep=1): rows that are not one matrix. With weights
    that need no grad, F.linear runs them as a batched GEMM that reads the weight once per batch row
    (4x the lm_head's traffic at batch 4 on the H100); the patch folds them into one GEMM."""
    from torch.profiler import ProfilerActivity, profile

    from runtime_loader.integrations.transformers import patch

    model = tiny("llama").requires_grad_(False)
    ids = torch.randint(1, 128, (4, 9))
    reference = logits(model, "sdpa", ids, logits_to_keep=1)
    patch(model, serving_fallbacks())
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        out = model(ids, logits_to_keep=1).logits
    gemms = {e.key: e.count for e in prof.key_averages() if e.key in ("aten::mm", "aten::bmm")}
    assert gemms == {"aten::mm": 2 * 4 + 1}, gemms
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


HELD_OUT = {  # types the patch was not written around: interleaved RoPE (Cohere), GLM's own RoPE form,
    # whole-projection QK-norm (OLMo 2), fused gate_up (Phi-3), LayerNorm + plain GELU MLP (Starcoder2)
    "cohere": ("CohereForCausalLM", "CohereConfig", {}),
    "glm": ("GlmForCausalLM", "GlmConfig", dict(pad_token_id=0)),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", {}),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(pad_token_id=0)),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", {}),
}


@pytest.mark.parametrize("family", list(HELD_OUT))
def test_patched_held_out_types_compute_what_they_did(family, restore_active):
    """Whatever patch serves must compute the module's own result: logits within fp32 rounding
    and the same greedy tokens; a RoPE form no op serves (GLM's) is left, and said so."""
    from runtime_loader.integrations.transformers import patch

    model_class, config_class, options = HELD_OUT[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"this transformers has no {model_class}")
    torch.manual_seed(14)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**COMMON, **options)).eval()
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = logits(model, "sdpa", ids)
        expected = model.generate(ids, **kw)
        d = serving_fallbacks()
        report = patch(model, d)
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, **kw), expected)
    rope_left = any(name.endswith("apply_rotary_pos_emb") for name in report.left)
    assert rope_left == (family == "glm"), report
    assert ("posenc.rope" in d.stats()) == (family != "glm")


def test_a_fused_residual_add_keeps_the_layout_of_the_layers_own_sum(restore_active):
    """The layer's `total = residual + x` takes residual's layout; x from a sublayer may be a
    transposed view (Inkling's short convolution). The fused add serves contiguous inputs alone,
    handing the rest to the sum in the order the layer wrote it."""
    from runtime_loader import custom_ops
    from runtime_loader.integrations.transformers import _add_norm
    from runtime_loader.ops.norm import rms_norm

    norm = torch.nn.Module()
    norm.weight = torch.nn.Parameter(torch.rand(64) + 0.5, requires_grad=False)  # served: autograd records nothing
    norm._lzsolve_eps, norm._lzsolve_unit_offset = 1e-6, False

    def own_norm(h):  # the module's own forward, as the fallback path calls it
        return rms_norm(h, norm.weight, 1e-6)

    norm.forward = own_norm
    d = serving_fallbacks()
    custom_ops.activate(d)
    residual = torch.randn(2, 11, 64)
    transposed = torch.randn(2, 64, 11).transpose(1, 2)
    for x, residual_first in ((transposed, True), (transposed, False), (transposed.contiguous(), True)):
        expected = residual + x if residual_first else x + residual
        normed, total = _add_norm(norm, x, residual, residual_first)
        assert total.stride() == expected.stride(), (residual_first, x.is_contiguous())
        torch.testing.assert_close(total, expected)
        torch.testing.assert_close(normed, own_norm(expected))
    assert d.stats()["norm.rms_add"] == {"eager.rms_norm_add": 1}, "the contiguous pair alone went to the table"


def test_inklings_moe_reads_a_contiguous_total_after_the_fused_add(restore_active):
    """Inkling's layer adds a transposed sublayer output to its residual and its MoE .view()s the
    normed sum, which a fused add in x's layout broke (a RuntimeError). Same logits as unpatched."""
    from runtime_loader.integrations.transformers import patch

    if not hasattr(transformers, "InklingForCausalLM"):
        pytest.skip("this transformers has no Inkling")
    torch.manual_seed(3)
    config = transformers.InklingTextConfig(**COMMON, head_dim=16, layer_types=["hybrid_sliding", "hybrid"],
                                            mlp_layer_types=["sparse", "sparse"], moe_intermediate_size=32,
                                            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1)
    model = transformers.InklingForCausalLM(config).eval()
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(ids).logits
        report = patch(model, serving_fallbacks())
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
    assert report.fused["residual add+post_attention_layernorm"] == 2, report


EAGER_ONLY = {  # models that declare no SDPA, whose attention runs eager: the table's calls aside, it must stay so
    # a relative position bias and per-token sinks, which SDPA drops
    "inkling2": ("Inkling2ForCausalLM", "Inkling2TextConfig", dict(head_dim=16, layer_types=["hybrid_sliding", "hybrid"],
                                                                    moe_intermediate_size=32, n_routed_experts=4,
                                                                    num_experts_per_tok=2)),
    # sinks and a window: padded rows as eager's mask has them (SDPA's mask differs there)
    "mimo_v2_flash": ("MiMoV2FlashForCausalLM", "MiMoV2FlashConfig", dict(
        head_dim=16, v_head_dim=16, sliding_window=8, layer_types=["full_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse"], moe_intermediate_size=32, num_experts_per_tok=2, n_routed_experts=4,
        n_group=1, topk_group=1)),
    # its attention pads a tensor mask with its compressed keys' bias, and adds none to a mask left out
    "deepseek_v4": ("DeepseekV4ForCausalLM", "DeepseekV4Config", dict(
        head_dim=16, q_lora_rank=32, qk_rope_head_dim=16, sliding_window=8, num_experts_per_tok=2, n_routed_experts=4,
        n_shared_experts=1, moe_intermediate_size=32, mlp_layer_types=["hash_moe", "moe"],
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention"])),
}


@pytest.mark.parametrize("family", list(EAGER_ONLY))
def test_a_model_that_ran_eager_attention_keeps_it_for_what_the_table_does_not_serve(family, restore_active):
    """Attention served by a kernel (eager.attention, as a table might choose): every call the table
    does not take runs the model's own eager attention with eager's mask, never SDPA (which dropped
    Inkling 2's position bias and sinks, and changed MiMo's padded rows); a model whose attention
    reads its mask keeps its attention whole (DeepSeek V4's lost its causal mask). Logits with and
    without padding as unpatched."""
    from runtime_loader.integrations.transformers import NAME, patch

    model_class, config_class, options = EAGER_ONLY[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"this transformers has no {model_class}")
    torch.manual_seed(5)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**COMMON, **options)).eval()
    assert model.config._attn_implementation == "eager"
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    padding = torch.ones_like(ids)
    padding[1, :3] = 0
    with torch.no_grad():
        reference, padded = model(ids).logits, model(ids, attention_mask=padding).logits
        d = serving_fallbacks(attention_prefill="eager.attention", attention_decode="eager.attention")
        report = patch(model, d)
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(ids, attention_mask=padding).logits, padded, rtol=1e-5, atol=1e-5)
    if family == "deepseek_v4":
        assert "DeepseekV4Attention" in report.left and model.config._attn_implementation == "eager", report
    else:
        assert model.config._attn_implementation == NAME + "_eager", report


def test_a_softcapped_call_the_table_cannot_take_keeps_the_models_eager_attention(restore_active):
    """Gemma 2 caps its logits, which SDPA cannot: a call the table does not describe (a padding mask,
    a static cache's mask) goes to the model's own eager attention, as unpatched, not to SDPA."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(15)
    config = transformers.Gemma2Config(**COMMON, head_dim=16, attn_logit_softcapping=5.0, sliding_window=8,
                                       attn_implementation="eager")
    model = transformers.Gemma2ForCausalLM(config).eval()
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        expected, unmasked = model(ids, attention_mask=mask).logits, model(ids).logits
        d = serving_fallbacks(attention_prefill="eager.attention", attention_decode="eager.attention")
        patch(model, d)
        assert model.config._attn_implementation == "lzsolve_eager", "it ran eager: what the table leaves stays so"
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, expected, rtol=1e-5, atol=1e-5)
        assert "attention.prefill" not in d.stats(), "a padding mask: the model's own attention"
        torch.testing.assert_close(model(ids).logits, unmasked, rtol=1e-5, atol=1e-5)
    assert d.stats()["attention.prefill"] == {"eager.attention": 2}, "no mask: the table's, softcap and all"


def test_rope_layouts_are_found_by_running_the_function():
    from transformers.models.cohere import modeling_cohere
    from transformers.models.llama import modeling_llama

    from runtime_loader.integrations.modules import rope_layout
    assert rope_layout(modeling_llama.apply_rotary_pos_emb) == "split_half"
    assert rope_layout(modeling_cohere.apply_rotary_pos_emb) == "interleaved"
    assert rope_layout(lambda q, k, cos, sin: (q, k)) is None  # computes something else
    assert rope_layout(lambda q, k, cos, sin, position_ids: (q, k)) is None  # another signature


# --- Qwen3.5: Gated DeltaNet layers (issue 20) --------------------------------------------------
def tiny_qwen35():
    """Three linear-attention layers and a full one, as the real model's period; 4 value heads on 2 key heads."""
    if not hasattr(transformers, "Qwen3_5ForCausalLM"):
        pytest.skip("this transformers has no Qwen3_5ForCausalLM")
    torch.manual_seed(12)
    config = transformers.Qwen3_5TextConfig(
        **{**COMMON, "num_hidden_layers": 4}, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, pad_token_id=0,
        layer_types=["linear_attention"] * 3 + ["full_attention"])
    return transformers.Qwen3_5ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def qwen35_artifact(tmp_path_factory):
    return tune_what_patched_models_call(tmp_path_factory.mktemp("qwen35"), "tiny-qwen3.5", [tiny_qwen35()])


@pytest.mark.parametrize("tuned", [True, False])
def test_patched_qwen35_serves_its_linear_attention_layers(tuned, qwen35_artifact, restore_active):
    """The conv1d (prompt and decode step on the cache's rolling state), the delta rule (chunked
    and recurrent), the gated norm and the linears, from the tuned table (each where it serves more
    than the fallback: on CPU the delta rule's and the conv's choice is their fallback) or from every
    op's fallback as a table would choose it; logits and generate() equal."""
    from runtime_loader.integrations.transformers import observe, patch

    model = tiny_qwen35()
    calls, _ = observe(model)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=6, do_sample=False)
    with torch.no_grad():
        reference = model(ids).logits
        expected = model.generate(ids, **kw)
    d = runtime_loader.load(qwen35_artifact, strict=True) if tuned else serving_fallbacks()
    report = patch(model, d)
    functions = {"causal_conv1d_fn": "conv.causal_depthwise", "causal_conv1d_update": "conv.causal_depthwise",
                 "torch_chunk_gated_delta_rule": "recurrent.gated_deltanet",
                 "torch_recurrent_gated_delta_rule": "recurrent.gated_deltanet"}
    linear_attention = "model.layers.0.linear_attn"
    served = {name for name, op in functions.items() if table_serves(d, calls, linear_attention, op)}
    assert served == set(report.replaced) & set(functions), report
    # the gated norm (norm.rms, then the gate in the module's own code) is replaced where the table
    # serves its norm beyond the fallback: a tuned CPU table may choose the fallback there
    gated_norm = not tuned or table_serves(d, calls, "model.layers.0.linear_attn.norm", "norm.rms")
    assert ("Qwen3_5RMSNormGated" in report.replaced) == gated_norm, report
    if not tuned:
        assert served == set(functions), "every op's fallback, as a table would choose it: all four served"
    assert not d.stats(), "patch checks an MLP's form with the op's definition, not the table"
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, **kw), expected)
    stats = d.stats()
    if tuned:
        assert_served_by_its_own_table(d)
    forwards, linear_layers = 1 + 6, 3
    for op in {functions[name] for name in served}:
        assert sum(stats[op].values()) == forwards * linear_layers, (op, stats[op])
    if not tuned:
        assert sum(stats["act.swiglu"].values()) == forwards * (linear_layers + 4), "gated norms and MLPs"


def test_a_qwen35_tune_from_its_config_covers_what_the_patched_model_calls(tmp_path, restore_active):
    from lzsolve.models.capture import capture
    from runtime_loader.integrations.transformers import patch

    model = tiny_qwen35()
    cfg = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    captured = capture(cfg, "tiny-qwen3.5", dtype="fp32")
    assert not [n for n in captured.notes if "conv" in n.lower()], captured.notes
    patch(model, Dispatcher(None), all_ops=True)
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        model.generate(torch.randint(1, 128, (2, 12)), max_new_tokens=2, do_sample=False)
    called = {unfused(call["name"]) for call in json.loads((tmp_path / "w.json").read_text())["calls"]}
    tuned = {str(i.signature).replace("norm.rms_add", "norm.rms") for i in captured.instances}
    assert {n for n in called if n.startswith(("conv.", "recurrent."))}, called
    assert called <= tuned, sorted(called - tuned)


def test_meta_runs_never_call_what_a_kernel_library_backs(monkeypatch, restore_active):
    """With FLA installed, transformers backs Qwen3.5's delta rules with its Triton kernels, which
    meta tensors would launch on null pointers (an illegal memory access on the H100): the meta
    twin of patch() and the capture call shape-only stand-ins instead."""
    from lzsolve.models.capture import capture
    from runtime_loader.integrations.modules import META_FUNCTIONS
    from runtime_loader.integrations.transformers import observe

    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

    def library_kernel(*args, **kwargs):
        raise AssertionError("a library kernel ran on meta tensors")
    for name in META_FUNCTIONS:
        monkeypatch.setattr(qwen, name, library_kernel)
    model = tiny_qwen35()
    assert ("model.layers.0.linear_attn.in_proj_qkv", "model.layers.0.linear_attn.in_proj_z",
            "model.layers.0.linear_attn.in_proj_b", "model.layers.0.linear_attn.in_proj_a") in observe(model)[1]
    cfg = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    ops = {i.signature.op for i in capture(cfg, "tiny-qwen3.5", dtype="fp32").instances}
    assert {"conv.causal_depthwise", "recurrent.gated_deltanet"} <= ops
    assert qwen.torch_chunk_gated_delta_rule is library_kernel, "put back after"


def test_calls_outside_the_table_keep_transformers_own_conv_and_delta_rules(monkeypatch, restore_active):
    """Where no table serves a call, patch() hands it to the function it replaced: transformers'
    choice there may be FLA's or causal-conv1d's kernels, faster than the op's torch fallback."""
    from collections import Counter

    from runtime_loader.integrations.transformers import patch

    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    calls = Counter()
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        original = getattr(qwen, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(qwen, name, counted)
    model = tiny_qwen35()
    ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=3, do_sample=False)
        calls.clear()
        d = Dispatcher(None)
        report = patch(model, d, all_ops=True)
        assert {"causal_conv1d_fn", "torch_chunk_gated_delta_rule"} <= set(report.replaced), report
        assert torch.equal(model.generate(ids, max_new_tokens=3, do_sample=False), expected)
    assert set(calls) == {"torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                          "causal_conv1d_update"}, calls
    stats = d.stats()
    assert {kernel for op in ("recurrent.gated_deltanet", "conv.causal_depthwise") for kernel in stats[op]} == {
        "own code (fallback)"}, stats


# --- DeepSeek-V2/V3: multi-head latent attention (issue 60) ---------------------------------------------
def tiny_deepseek(dtype=torch.float32, v3: bool = False):
    """DeepSeek-V2-Lite's shape, shrunk: no q latent (q_proj), a kv latent of 32 with k's shared RoPE part
    of 8, q/k heads of 16 + 8 and v heads of 16 (attention's dv); the first layer dense, then 8 routed
    experts (2 per token) beside 2 shared ones; V2-Lite's YaRN scaling (its mscale scales attention).
    v3: DeepSeek-V3's modelling (grouped sigmoid routing, interleaved RoPE weights) at the same sizes.
    Built as from_pretrained builds it: in bf16 the router's weight stays float32 (the models'
    _keep_in_fp32_modules_strict)."""
    if not hasattr(transformers, "DeepseekV2ForCausalLM"):
        pytest.skip("this transformers has no DeepseekV2ForCausalLM")
    torch.manual_seed(13)
    options = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=128, q_lora_rank=None, kv_lora_rank=32,
                   qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                   n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1)
    if v3:
        config = transformers.DeepseekV3Config(**options, n_group=2, topk_group=1)
    else:
        config = transformers.DeepseekV2Config(**options, topk_method="greedy", rope_scaling={
            "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.707,
            "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1})
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def deepseek_artifact(request, tmp_path_factory):
    """(dtype, a CPU tune of what the tiny DeepSeek-V2-Lite calls once patched in that dtype)."""
    folder = tmp_path_factory.mktemp("deepseek")
    return request.param, tune_what_patched_models_call(folder, "tiny-deepseek-v2-lite", [tiny_deepseek(request.param)])


@pytest.mark.parametrize("tuned", [True, False])
def test_patched_deepseek_v2_lite_is_served_from_its_table(tuned, deepseek_artifact, restore_active):
    """MLA through the table: attention with q/k of 24 and v of 16 (its own signature, dv), the
    latent's RMSNorm, q_proj and kv_a_proj_with_mqa as one GEMM, kv_b_proj; the routed and shared
    experts. From the tuned table (each module where it serves more than the fallback) or from every
    op's fallback as a table would choose it (attention: the eager reference, which takes dv too):
    logits as unpatched and generate() equal, every call the table's; fp32 and bf16."""
    from runtime_loader.integrations.transformers import observe, patch

    dtype, artifact = deepseek_artifact
    model = tiny_deepseek(dtype)
    calls, groups = observe(model)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = model(ids).logits
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    d = runtime_loader.load(artifact, strict=True) if tuned else serving_fallbacks(
        attention_prefill="eager.attention", attention_decode="eager.attention")
    report = patch(model, d)
    name = "fp32" if dtype == torch.float32 else "bf16"
    if tuned:
        signatures = {str(sig) for sig in d.table.trees}
        assert {f"attention.prefill[hq=4,hkv=4,d=24,dv=16,causal,{name}]",
                f"attention.decode[hq=4,hkv=4,d=24,dv=16,{name}]", f"norm.rms[hidden=32,{name}]"} <= signatures
    linears = {k: n for k, n in report.fused.items() if not k.startswith("residual add")}
    if tuned:
        assert linears == fused_groups(d, model, calls, groups), report
    else:
        assert linears["q_proj+kv_a_proj_with_mqa"] == 2, report
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=tolerance, atol=tolerance)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
    if tuned:
        assert_served_by_its_own_table(d)
    stats = d.stats()
    # two layers: the logits' forward and generate()'s prompt, then its 5 decode steps; the one MoE layer
    counts = {("attention.prefill", "model.layers.0.self_attn"): 2 * 2,
              ("attention.decode", "model.layers.0.self_attn"): 2 * 5,
              ("norm.rms", "model.layers.0.self_attn.kv_a_layernorm"): 2 * 7,
              ("moe.experts", "model.layers.1.mlp.experts"): 7}
    for (op, module), count in counts.items():
        if not tuned or table_serves(d, calls, module, op):
            assert sum(stats[op].values()) >= count, (op, stats[op])
    if not tuned:
        assert set(stats["attention.decode"]) == {"eager.attention"}, stats["attention.decode"]


@pytest.mark.parametrize("v3", [False, True])
def test_a_deepseek_tune_from_its_config_covers_what_the_patched_model_calls(v3, tmp_path, restore_active):
    """What capture plans from the config (MLA's linears, latent norms, attention with dv, experts) is
    what the patched model calls; DeepSeek's RoPE forms are noted, V3's grouped routing named."""
    from lzsolve.models.capture import capture
    from runtime_loader.integrations.transformers import patch

    model = tiny_deepseek(v3=v3)
    cfg = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    captured = capture(cfg, "tiny-deepseek", dtype="fp32")
    assert "model.layers.*.self_attn: rotary embedding in a form no op computes" in captured.notes
    assert any("DeepseekV3TopkRouter" in note for note in captured.notes) == v3, captured.notes
    patch(model, Dispatcher(None), all_ops=True)
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        model.generate(torch.randint(1, 128, (2, 12)), max_new_tokens=2, do_sample=False)
    called = {unfused(call["name"]) for call in json.loads((tmp_path / "w.json").read_text())["calls"]}
    tuned = {str(i.signature).replace("norm.rms_add", "norm.rms") for i in captured.instances}
    assert "attention.decode[hq=4,hkv=4,d=24,dv=16,fp32]" in called
    assert called <= tuned, sorted(called - tuned)


def test_an_mla_decode_workload_is_tuned_and_replayed(tmp_path, restore_active):
    """attention.mla_decode (MLA's decode over the latent cache, absorbed), as a server calls it:
    recorded, tuned on CPU and replayed from the table against its fp32 reference."""
    from lzsolve.pipeline import ModelSource
    from tests.tables import assert_replays_references, tuned

    d = Dispatcher(None)
    with runtime_loader.record(tmp_path / "w.json", name="mla"):
        for batch, kv_len in ((1, 40), (2, 100)):
            q_nope, q_pe = torch.randn(batch, 4, 1, 64), torch.randn(batch, 4, 1, 16)
            kv, k_pe = torch.randn(batch, 1, kv_len, 64), torch.randn(batch, 1, kv_len, 16)
            assert d.mla_decode(q_nope, q_pe, kv, k_pe, 0.1).shape == (batch, 4, 1, 64)
    artifact = tuned(ModelSource(workload=tmp_path / "w.json"), tmp_path / "artifact").artifact
    served = assert_replays_references(artifact)
    assert [str(sig) for sig in served.table.trees] == ["attention.mla_decode[hq=4,rank=64,rope=16,fp32]"]


# --- BLOOM: ALiBi attention in its own module (issue 60) ----------------------------------------------------
def tiny_bloom(dtype=torch.float32):
    """BLOOM's form, shrunk: fused query_key_value, ALiBi biases, LayerNorms and a tanh-GELU MLP; 6 heads
    (ALiBi's slopes past a power of two). Token 0 pads, so random prompts of ids >= 1 have none."""
    torch.manual_seed(17)
    config = transformers.BloomConfig(vocab_size=128, hidden_size=48, n_layer=2, n_head=6, pad_token_id=0)
    return transformers.BloomForCausalLM(config).to(dtype).eval()


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def bloom_artifact(request, tmp_path_factory):
    """(dtype, a CPU tune of what the tiny BLOOM calls once patched in that dtype)."""
    folder = tmp_path_factory.mktemp("bloom")
    return request.param, tune_what_patched_models_call(folder, "tiny-bloom", [tiny_bloom(request.param)])


@pytest.mark.parametrize("serving", ["tuned", "sdpa.default", "eager.attention"])
def test_patched_bloom_is_served_from_its_table(serving, bloom_artifact, restore_active):
    """BLOOM's attention through the table's attention with the alibi flag (its own module: q/k/v from
    query_key_value, its KV cache updated as its forward does), from the tuned table or from every op's
    fallback as a table would choose it, attention by SDPA's default (the biases as a float mask) or
    the eager reference: logits as unpatched and generate() equal;
    a padded batch (BLOOM's biases then count from each row's first token) and attention weights asked
    for are handed back to BLOOM's own forward, with the mask it expects; fp32 and bf16."""
    from runtime_loader.integrations.transformers import observe, patch

    dtype, artifact = bloom_artifact
    model = tiny_bloom(dtype)
    calls, _ = observe(model)
    name = "fp32" if dtype == torch.float32 else "bf16"
    assert calls["transformer.h.0.self_attention"] == {
        Signature.make("attention.prefill", {"hq": 6, "hkv": 6, "d": 8}, ("causal", "alibi"), name),
        Signature.make("attention.decode", {"hq": 6, "hkv": 6, "d": 8}, ("alibi",), name)}
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    padding = torch.ones_like(ids)
    padding[0, :3] = 0  # left padding
    with torch.no_grad():
        reference = model(ids).logits
        padded = model(ids, attention_mask=padding).logits
        weights = model(ids, output_attentions=True)
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
        expected_padded = model.generate(ids, attention_mask=padding, max_new_tokens=4, do_sample=False)
    tuned = serving == "tuned"
    d = runtime_loader.load(artifact, strict=True) if tuned else serving_fallbacks(
        attention_prefill=serving, attention_decode=serving)
    report = patch(model, d)
    if tuned:
        assert {f"attention.prefill[hq=6,hkv=6,d=8,causal,alibi,{name}]",
                f"attention.decode[hq=6,hkv=6,d=8,alibi,{name}]"} <= {str(sig) for sig in d.table.trees}
    if not tuned or table_serves(d, calls, "transformer.h.0.self_attention"):
        assert report.replaced["BloomAttention"] == 2, report
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    served = sum(sum(d.stats().get(op, {}).values()) for op in ("attention.prefill", "attention.decode"))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=tolerance, atol=tolerance)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)
        after = sum(sum(d.stats().get(op, {}).values()) for op in ("attention.prefill", "attention.decode"))
        torch.testing.assert_close(model(ids, attention_mask=padding).logits[1], padded[1], rtol=tolerance,
                                   atol=tolerance)
        torch.testing.assert_close(model(ids, attention_mask=padding).logits[0, 3:], padded[0, 3:], rtol=tolerance,
                                   atol=tolerance)
        assert torch.equal(model.generate(ids, attention_mask=padding, max_new_tokens=4, do_sample=False),
                           expected_padded)
        got = model(ids, output_attentions=True)
        torch.testing.assert_close(got.logits, weights.logits, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(got.attentions, weights.attentions, rtol=tolerance, atol=tolerance)
    if report.replaced["BloomAttention"]:  # two layers: the logits' forward, generate()'s prompt and 5 steps
        assert after - served >= 2 * 7, d.stats()
    if tuned:
        assert_served_by_its_own_table(d)


def test_patched_bloom_in_training_gets_the_unpatched_gradients(restore_active, monkeypatch):
    """BLOOM's attention, served whole (alibi_attention), runs its own forward while autograd records,
    as every served module does (_records): its attention locked to a forward-only kernel (as the
    table's Triton or FlashAttention kernels are: no autograd node) left query_key_value's gradient
    out. The loss and every parameter's gradient are the unpatched model's."""
    from runtime_loader import registry
    from runtime_loader.integrations.transformers import patch

    sdpa = registry.get("sdpa.default")

    def forward_only(q, k, v, *args):
        return sdpa.impl(q.detach(), k.detach(), v.detach(), *args)

    monkeypatch.setitem(registry.REGISTRY, "test.forward_only", dataclasses.replace(
        sdpa, kernel_id="test.forward_only", library="testlib", impl=forward_only))
    model = tiny_bloom().train()
    reference = copy.deepcopy(model)
    report = patch(model, serving_fallbacks(attention_prefill="test.forward_only", attention_decode="test.forward_only"))
    assert report.replaced["BloomAttention"] == 2, report
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(integration, "_told_records", False)
    with pytest.warns(UserWarning, match="inference_mode"):
        assert_trains_as(reference, model, ids)


def test_a_bloom_tune_from_its_config_covers_what_the_patched_model_calls(tmp_path, restore_active):
    """What capture plans from BLOOM's config (attention with the alibi flag, its fused q/k/v GEMM) is
    what the patched model calls."""
    from lzsolve.models.capture import capture
    from runtime_loader.integrations.transformers import patch

    model = tiny_bloom()
    cfg = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    captured = capture(cfg, "tiny-bloom", dtype="fp32")
    patch(model, Dispatcher(None), all_ops=True)
    with runtime_loader.record(tmp_path / "w.json"), torch.no_grad():
        model.generate(torch.randint(1, 128, (2, 12)), max_new_tokens=2, do_sample=False)
    called = {unfused(call["name"]) for call in json.loads((tmp_path / "w.json").read_text())["calls"]}
    tuned = {str(i.signature) for i in captured.instances}
    assert {"attention.prefill[hq=6,hkv=6,d=8,causal,alibi,fp32]", "attention.decode[hq=6,hkv=6,d=8,alibi,fp32]",
            "linear[k=48,n=144,bias,fp32]"} <= called
    assert called <= tuned, sorted(called - tuned)


def test_patched_bloom_compiles_with_fullgraph(restore_active):
    """BLOOM's served attention under torch.compile(fullgraph=True): q, k and v made contiguous for the
    custom op (whose fake output is; its kernel's follows q's layout, a view of the fused qkv)."""
    from runtime_loader.integrations.transformers import patch

    model = tiny_bloom()
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(ids).logits
    d = serving_fallbacks()
    patch(model, d)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # raises on any graph break
    with torch.no_grad():
        out = compiled(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert sum(d.stats()["attention.prefill"].values()) >= 2, "through torch.ops.lzsolve"


def tiny_config_of(model_type: str):
    """transformers' default config of the type, shrunk as test_families shrinks catalogue models, with
    what some types need beside (pad ids inside the small vocabulary, 8 experts of 2 a token, MLA's
    latent ranks and rope/nope split kept consistent)."""
    from .test_families import shrink
    cfg = shrink(transformers.AutoConfig.for_model(model_type).to_dict())
    if "kv_lora_rank" in cfg:
        cfg.update(kv_lora_rank=16, q_lora_rank=32 if cfg.get("q_lora_rank") else cfg.get("q_lora_rank"),
                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8)
    if isinstance(cfg.get("pad_token_id"), int) and cfg["pad_token_id"] >= 256:
        cfg["pad_token_id"] = 0
    for key, most in (("num_experts", 8), ("n_routed_experts", 8), ("num_local_experts", 8),
                      ("num_experts_per_tok", 2), ("moe_topk", 2), ("top_k", 2)):
        if isinstance(cfg.get(key), int) and cfg[key] > most:
            cfg[key] = most
    return transformers.AutoConfig.for_model(**cfg)


# CPU kernels that are not the op's fallback, so that a served call computes its result another way
OTHER_KERNELS = dict(norm_rms="torch.rms_norm", norm_rms_add="torch.rms_norm_add", norm_qk="torch.qk_norm",
                     norm_layer="torch.layer_norm", linear="eager.linear", embedding="torch.embedding",
                     posenc_learned="torch.learned_positions", attention_prefill="sdpa.math",
                     attention_decode="sdpa.math", moe_experts="eager.moe_experts")
CAUSAL_LM_TYPES = sorted(transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())


@pytest.mark.parametrize("model_type,class_name", CAUSAL_LM_TYPES, ids=[t for t, _ in CAUSAL_LM_TYPES])
def test_every_causal_lm_type_patched_computes_what_it_did(model_type, class_name, restore_active):
    """Held-out models: every causal LM this transformers has, tiny and random. With no table, patch()
    changes no module and no logit; serving every op through the patch's forwards (the norms, linears,
    embeddings and attention by kernels other than the model's own code, the rest by their fallbacks)
    the logits stay within fp32 rounding and greedy generation keeps its tokens."""
    from runtime_loader.integrations.transformers import patch

    try:  # a type whose default config does not build or run tiny is not the patch's to judge
        config = tiny_config_of(model_type)
        model_class = getattr(transformers, class_name)
        with torch.device("meta"):
            size = sum(p.numel() for p in model_class(config).parameters())
        if size > 20_000_000:  # what shrink() leaves large (an encoder-decoder's vocabulary...): too slow here
            raise ValueError(f"{size / 1e6:.0f}M parameters after shrinking")
        torch.manual_seed(0)
        model = model_class(config).eval()
        vocab = config.get_text_config().vocab_size
        ids = torch.randint(3, min(vocab, 200), (2, 11), generator=torch.Generator().manual_seed(1))
        kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            reference = model(ids).logits
            expected = model.generate(ids, **kw)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no unpatched tiny model to compare with: {type(e).__name__}: {str(e)[:120]}")
    classes = [type(m) for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch(model, Dispatcher(None))
    assert [type(m) for m in model.modules()] == classes
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference)
        patch(model, serving_fallbacks(**OTHER_KERNELS))
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-4, atol=1e-5)
        assert torch.equal(model.generate(ids, **kw), expected)


@pytest.mark.parametrize("model_type", ["moshi", "gemma4"])
def test_a_model_handing_its_masks_position_ids_is_observed_and_served(model_type, restore_active):
    """Moshi's and Gemma 4's forwards hand explicit position ids to transformers' mask builders, which
    look for packed sequences by reading their values: the meta twin, which has none, answers that it
    holds one sequence, so what the modules call is known and the table serves them."""
    from runtime_loader.integrations.transformers import patch

    model_class = dict(CAUSAL_LM_TYPES).get(model_type)
    if model_class is None or not hasattr(transformers, model_class):
        pytest.skip(f"this transformers has no {model_type}")
    model = getattr(transformers, model_class)(tiny_config_of(model_type)).eval()
    report = patch(model, serving_fallbacks(**OTHER_KERNELS))
    assert "every module" not in report.left, report.left
    assert report.replaced


def test_a_weightless_norm_is_not_served_whatever_memory_its_copy_gets(monkeypatch):
    """FalconMamba's dt/B/C norms hold a ones buffer named weight that their forward never reads. The
    classifier runs a copy whose buffers to_empty leaves as it finds them; where that memory was zero
    (forced here), the norm read as (1 + w) * x and was served with a weight of another width."""
    from runtime_loader.integrations.modules import _classify_norm

    falcon = pytest.importorskip("transformers.models.falcon_mamba.modeling_falcon_mamba")
    if not hasattr(falcon, "FalconMambaWeightlessRMSNorm"):
        pytest.skip("this transformers has no weightless FalconMamba norm")
    with torch.device("meta"):
        norm = falcon.FalconMambaWeightlessRMSNorm(16)
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: torch.zeros_like(t, **kw))
    assert _classify_norm(norm) is None


# --- autograd: a patched model trains as the unpatched one -----------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_patched_model_in_training_gets_the_unpatched_gradients(family, restore_active, monkeypatch):
    """With autograd recording, every served module runs its own code (the table's kernels are
    forward-only; the fused q/k/v and gate/up weight is detached from the members' parameters), so
    the loss and every parameter's gradient are the unpatched model's: q/k/v, gate/up, and the
    embedding's padding row (left at zero by nn.Embedding's padding_idx) included. Those calls are
    counted, under AUTOGRAD (the fused members' by their own linear), as the calls the table hands
    back are under their reasons: none served; and none of their shapes is kept from the table
    once autograd stops recording (no_grad's calls of them are served)."""
    from runtime_loader.dispatcher import AUTOGRAD
    from runtime_loader.integrations.transformers import patch

    model_class, config_class, options = FAMILIES[family]
    torch.manual_seed(17)
    config = getattr(transformers, config_class)(**COMMON, **options, pad_token_id=0)
    model = getattr(transformers, model_class)(config).train()
    reference = copy.deepcopy(model)
    d = serving_fallbacks()
    report = patch(model, d)
    assert report.fused["q_proj+k_proj+v_proj"] == 2 and any("Embedding" in name for name in report.replaced)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    ids[0, :3] = 0  # left-padded
    monkeypatch.setattr(integration, "_told_records", False)
    with pytest.warns(UserWarning, match="inference_mode"):  # once: a server that forgot no_grad is told why
        assert_trains_as(reference, model, ids)
    if not config.tie_word_embeddings:  # (a tied lm_head gives the padding row a gradient of its own: Gemma 3's)
        assert not model.model.embed_tokens.weight.grad[0].any()  # the padding row
    coverage = d.coverage()
    assert coverage["calls"] and not coverage["served"], coverage
    assert {why for row in coverage["outside"].values() for why in row["why"]} == {AUTOGRAD}, coverage
    # k_proj's and v_proj's own (2 kv heads of 16), not the fused q/k/v's: no other linear has 32 outputs
    assert "linear[k=64,n=32,fp32]" in coverage["outside"], sorted(coverage["outside"])
    with torch.no_grad():
        model(ids)
    assert d.coverage()["outside"] == coverage["outside"] and d.coverage()["served"], d.coverage()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_patched_model_serves_under_inference_mode(family, restore_active):
    """torch.inference_mode(), what a server wraps its forwards in: its tensors keep no version
    counter, so the fused siblings know their input by identity alone there, and the patched model
    answers and generates as the unpatched one, its weights made under inference_mode too."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(23)
    ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(5))
    kw = dict(max_new_tokens=4, do_sample=False)
    for weights_made_inside in (False, True):
        with torch.inference_mode(weights_made_inside):
            model = tiny(family)
        reference = copy.deepcopy(model) if not weights_made_inside else tiny(family)
        if weights_made_inside:
            reference.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        patch(model, serving_fallbacks())
        with torch.inference_mode():
            torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-5)
            assert torch.equal(model.generate(ids, **kw), reference.generate(ids, **kw))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_patched_model_under_autocast_runs_its_own_code(family, restore_active):
    """torch.autocast casts what a module's own code calls op by op (its GEMMs and attention to bf16
    while the weights stay fp32), where a table's kernel computes in the dtypes it is handed: an fp32
    GEMM served would be slower than the bf16 one the unpatched model ran. Under autocast every call
    of a patched module runs the module's own code, counted under AUTOCAST; logits and generate()
    equal the unpatched model's, eager and compiled whole; after it the table serves again. A patch
    made under autocast replaces what one made outside it does."""
    from runtime_loader.dispatcher import AUTOCAST
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(31)
    model = tiny(family)
    reference = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = patch(copy.deepcopy(reference), serving_fallbacks())
    unpatch()
    d = serving_fallbacks()
    report = patch(model, d)
    assert report.replaced and inside.replaced == report.replaced, (inside, report)
    ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(5))
    kw = dict(max_new_tokens=4, do_sample=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(ids).logits
        assert want.dtype == torch.bfloat16
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)
        assert torch.equal(model.generate(ids, **kw), reference.generate(ids, **kw))
        coverage = d.coverage()
        assert coverage["served"] == 0 and coverage["calls"] > 0, coverage
        assert {why for row in coverage["outside"].values() for why in row["why"]} == {AUTOCAST}, coverage
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(ids).logits, want, rtol=0, atol=0)
    with torch.no_grad():
        model(ids)
    assert d.coverage()["served"] > 0, "served again once autocast is off"


@pytest.mark.gpu
def test_an_fp32_model_tuned_on_cuda_runs_under_autocast_as_it_did(tmp_path, restore_active):
    """An fp32 model patched with an fp32 table tuned on this GPU (its Triton kernels among the
    candidates), then run under torch.autocast(bf16): every call runs the module's own code, as
    autocast casts it, and the logits after a prompt and a decode step are the unpatched model's."""
    from lzsolve.pipeline import MeasureConfig, ModelSource
    from runtime_loader.dispatcher import AUTOCAST
    from runtime_loader.integrations.transformers import patch
    from tests.tables import NO_COMPILE, plugin_kernels, tuned
    from tests.test_cli import TINY_LLAMA, tiny_llama_config

    grid = dataclasses.replace(NO_COMPILE, exclude=NO_COMPILE.exclude + plugin_kernels())
    artifact = tuned(ModelSource(config=tiny_llama_config(tmp_path), dtype="fp32"), tmp_path / "artifact", grid,
                     MeasureConfig(device="cuda", isolate=False, sample_time=0.05)).artifact
    model = llama_of(TINY_LLAMA).cuda()
    reference = copy.deepcopy(model)
    d = runtime_loader.load(artifact, strict=True)
    assert patch(model, d).replaced, "the fp32 table serves the fp32 model"
    ids = torch.randint(0, 1000, (1, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(3))  # in range
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        steps = [(m(ids, use_cache=True), m) for m in (model, reference)]
        nxt = steps[1][0].logits[:, -1:].argmax(-1)
        decoded = [m(nxt, past_key_values=out.past_key_values).logits for out, m in steps]
    torch.testing.assert_close(steps[0][0].logits, steps[1][0].logits)
    torch.testing.assert_close(decoded[0], decoded[1])
    coverage = d.coverage()
    assert coverage["served"] == 0 and coverage["calls"] > 0, coverage
    assert {why for row in coverage["outside"].values() for why in row["why"]} == {AUTOCAST}, coverage


@pytest.mark.parametrize("traced", [False, True])
def test_a_compiled_patched_model_in_training_gets_the_unpatched_gradients(traced, restore_active):
    """Compiled in grad mode, a call autograd records runs the module's own code too, where the
    custom ops (forward-only: no autograd formula) would fail the backward's compile; fullgraph, so
    the check costs no graph break. AOT autograd (aot_eager) is what traces the backward."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(29)
    model = tiny("llama").train()
    reference = copy.deepcopy(model)
    patch(model, serving_fallbacks(), traced=traced)
    ids = torch.randint(1, 128, (2, 10), generator=torch.Generator().manual_seed(7))
    torch._dynamo.reset()
    assert_trains_as(reference, model, ids, run=torch.compile(model, backend="aot_eager", fullgraph=True))


def test_fused_siblings_recompute_after_their_input_or_weights_change_in_place(restore_active):
    """The first sibling called computes every member's output; a later member takes its own only
    while its input and its weights are as they were (their version counters), else the GEMM runs
    again: an in-place change between the calls is seen, as the unpatched model sees it."""
    from runtime_loader.integrations.transformers import patch

    torch.manual_seed(19)
    model = tiny("llama")
    reference = copy.deepcopy(model)
    patch(model, serving_fallbacks())
    attn, ref = model.model.layers[0].self_attn, reference.model.layers[0].self_attn
    assert attn.k_proj._lzsolve_siblings is attn.q_proj._lzsolve_siblings
    with torch.no_grad():
        x = torch.randn(1, 3, 64)
        attn.q_proj(x)
        x.mul_(2)  # the input, in place
        torch.testing.assert_close(attn.k_proj(x), ref.k_proj(x))
        attn.q_proj(x)
        x[0, 0].zero_()  # a view of the input, in place
        torch.testing.assert_close(attn.v_proj(x), ref.v_proj(x))
        attn.q_proj(x)
        attn.k_proj.weight.mul_(0)  # a member's weight, in place
        ref.k_proj.weight.mul_(0)
        torch.testing.assert_close(attn.k_proj(x), ref.k_proj(x))
        assert not attn.k_proj(x).any()
        assert attn.q_proj._lzsolve_siblings.pending is None or attn.q_proj._lzsolve_siblings.pending[0] is x

"""Every model family end to end on CPU: plan for each catalogue entry and its config.json, a tune of a
shrunk member of each family, the QK-norm gate, and the one-line note for ops only a reference computes."""
import json

import pytest
from click.testing import CliRunner

import runtime_loader
from lzsolve.cli import cli
from lzsolve.models import CATALOGUE
from lzsolve.models.capture import capture
from lzsolve.pipeline import GridConfig, ModelSource
from lzsolve.store.perfdb import PerfDB
from runtime_loader.ops import required_features

from .tables import assert_replays_references, leaf_ids, tuned

# Small but structurally faithful: every family keeps its layer pattern, GQA, head layout and options.
SMALL = {"hidden_size": 64, "n_embd": 64, "intermediate_size": 128, "num_attention_heads": 4, "n_head": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "num_hidden_layers": 2, "n_layer": 2,
         "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
         "linear_value_head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16,
         "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 256}
FAMILIES = {"gpt2": "gpt2", "llama": "nanbeige4.1-3b", "qwen2": "qwen2-0.5b", "qwen3": "qwen3-0.6b",
            "qwen3.5": "qwen3.5-0.8b", "gemma3": "gemma3-270m"}


def shrink(cfg: dict) -> dict:
    small = {k: (SMALL[k] if k in SMALL and cfg[k] is not None else v) for k, v in cfg.items()}
    if "layer_types" in cfg:  # keep one whole period of the pattern (Qwen3.5: 3 linear + 1 full)
        period = next(i + 1 for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
        small["layer_types"] = cfg["layer_types"][:max(period, 2)]
        for key in ("num_hidden_layers", "n_layer"):
            if key in small:
                small[key] = len(small["layer_types"])
    if isinstance(cfg.get("per_layer_config"), dict):  # layers that differ (Gemma 4): as much, scaled down
        layers = small.get("num_hidden_layers", cfg.get("num_hidden_layers"))
        small["per_layer_config"] = {
            index: {k: small[k] * (v // cfg[k]) if k in SMALL and v % cfg[k] == 0 else v for k, v in fields.items()}
            for index, fields in cfg["per_layer_config"].items() if int(index) < layers}
    if isinstance(cfg.get("text_config"), dict):
        small["text_config"] = shrink(cfg["text_config"])
    return small


def write_config(tmp_path, name: str, cfg: dict):
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_plan_every_catalogue_model_and_its_config_json(tmp_path, name):
    runner = CliRunner()
    by_name = runner.invoke(cli, ["plan", "--model", name, "--device", "cpu"])
    assert by_name.exit_code == 0, by_name.output
    by_file = runner.invoke(cli, ["plan", "--config", str(write_config(tmp_path, name, CATALOGUE[name])),
                                  "--device", "cpu"])
    assert by_file.exit_code == 0, by_file.output
    assert by_name.output.split("\n", 1)[1] == by_file.output.split("\n", 1)[1], "same plan either way"


def tune_small(tmp_path, family: str, kernels: tuple[str, ...] = (), plugins: tuple[str, ...] = ()):
    name = FAMILIES[family]
    config = write_config(tmp_path, f"small-{name}", shrink(CATALOGUE[name]))
    # no probes or validation: these tests check what a family tunes and serves, not the decisions
    # (the default tune's: tests/test_validate.py, conftest's tiny_llama_artifact)
    grid = GridConfig(grid="tiny", kernels=kernels, exclude=("compile.*",), plugins=plugins)
    return tuned(ModelSource(config=config, dtype="fp32"), tmp_path / "out", grid).artifact


# ops a family is told apart by: each must be tuned and replayed from the table
FAMILY_OPS = {"gpt2": {"embedding", "posenc.learned", "norm.layer", "act.gelu"},
              "llama": {"norm.rms_add", "posenc.rope", "act.swiglu"},
              "qwen2": {"posenc.rope", "act.swiglu"},
              "qwen3": {"norm.qk", "attention.prefill"},
              "qwen3.5": {"recurrent.gated_deltanet", "recurrent.deltanet_gates", "conv.causal_depthwise",
                          "act.sigmoid_gate", "norm.qk"},
              "gemma3": {"norm.qk", "act.geglu", "embedding"}}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tune_a_small_member_of_every_family(tmp_path, family):
    out = tune_small(tmp_path, family)
    table = json.loads((out / "dispatch.json").read_text())
    ops = {e["op"] for e in table["ops"]}
    assert FAMILY_OPS[family] <= ops
    d = runtime_loader.load(out, strict=True)  # validates every kernel id and its features again
    assert d.table is not None and len(d.table.trees) == len(table["ops"])
    if family == "gemma3":
        windowed = [e["signature"] for e in table["ops"] if "window=8" in e["signature"]]
        assert windowed and all("qk_norm" in s for s in windowed), "sliding layers tuned as such"
    if family == "qwen2":
        qkv = [e for e in table["ops"] if e["op"] == "linear" and "bias" in e["flags"]]
        assert len(qkv) == 1, "q/k/v carry a bias, o_proj does not"
    if family == "qwen3.5":  # no optimised kernel runs the delta rule on CPU: its reference serves it
        deltanet = next(e for e in table["ops"] if e["op"] == "recurrent.gated_deltanet")
        assert leaf_ids(deltanet["tree"]) == {"eager.gated_deltanet"}


# Model types no catalogue entry or walker describes, each with what capture had to learn for it:
# Phi (parallel attention + MLP, partial rotary, LayerNorm, tanh-GELU), Gemma 2 (softcapped
# attention, alternating sliding windows, (1 + weight) norms, GeGLU), Cohere (parallel block,
# LayerNorm without bias), StarCoder2 (biases everywhere, sliding window, plain GELU MLP), OLMo 2
# (QK-norm over the whole projection, norms after the sublayers), Gemma 4 (a config whose layers
# differ: its full-attention layers' head_dim, transformers' per-layer attributes).
NEW_TYPES = {"phi": {"norm.layer", "act.gelu", "posenc.rope"}, "gemma2": {"act.geglu", "norm.rms"},
             "cohere": {"norm.layer", "act.swiglu"}, "starcoder2": {"norm.layer", "act.gelu"},
             "olmo2": {"norm.qk", "norm.rms_add", "act.swiglu"},
             "gemma4_text": {"norm.qk", "act.geglu", "attention.prefill"}}


@pytest.mark.parametrize("model_type", list(NEW_TYPES))
def test_tune_and_replay_a_tiny_model_of_a_type_no_walker_knows(tmp_path, model_type):
    import torch
    import transformers

    from runtime_loader.integrations.transformers import register

    cfg = shrink(transformers.AutoConfig.for_model(model_type).to_dict())
    if model_type == "starcoder2":
        cfg["sliding_window"] = 8  # its default config has none; starcoder2-3b has 4096
    config = write_config(tmp_path, f"tiny-{model_type}", cfg)
    out = tuned(ModelSource(config=config, dtype="fp32"), tmp_path / "out").artifact
    table = json.loads((out / "dispatch.json").read_text())
    assert NEW_TYPES[model_type] <= {e["op"] for e in table["ops"]}
    d = assert_replays_references(out)
    assert d.warmup(strict=True) > 0
    if model_type in ("gemma2", "starcoder2"):
        assert any("window=8" in e["signature"] for e in table["ops"]), "sliding layers tuned as such"
    if model_type == "gemma2":
        assert any("softcap=" in e["signature"] for e in table["ops"])
    if model_type == "gemma4_text":  # its full-attention layers have a head_dim of their own
        assert {s.split("d=")[1].split(",")[0] for s in (e["signature"] for e in table["ops"])
                if s.startswith("attention.prefill")} == {"16", "32"}
    if model_type == "cohere":  # its LayerNorm has no bias: a signature of its own, kernels gated for it
        assert {e["signature"] for e in table["ops"] if e["op"] == "norm.layer"} == {"norm.layer[hidden=64,no_bias,fp32]"}

    # the real client: the same model in transformers, attention served by the table, against fp32 eager
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    # longer than the window (sliding masks matter), one row (the tiny grid tunes prefill at batch 1)
    ids = torch.randint(0, cfg["vocab_size"], (1, 13))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        reference = model(ids).logits
        register(d)
        model.set_attn_implementation("lzsolve")
        try:
            with runtime_loader.record(tmp_path / "served.json"):
                served = model(ids).logits
        finally:
            runtime_loader.custom_ops.activate(runtime_loader.Dispatcher(None))
    calls = json.loads((tmp_path / "served.json").read_text())["calls"]
    assert calls and {c["served"] for c in calls} == {"table"}, calls
    torch.testing.assert_close(served, reference, rtol=1e-4, atol=1e-4)


def test_a_kernel_without_qk_norm_is_never_chosen_for_qwen3_attention(tmp_path):
    out = tune_small(tmp_path, "qwen3", ("plain.*",), ("tests.plain_attention",))
    rows = PerfDB(out / "perfdb").rows("SELECT signature, status, reason_code FROM records "
                                       "WHERE kernel_id = 'plain.attention'")
    assert rows and all(r["status"] == "rejected" and r["reason_code"] == "FEATURE_UNSUPPORTED:qk_norm"
                        for r in rows)
    table = json.loads((out / "dispatch.json").read_text())
    assert not any("plain.attention" in leaf_ids(e["tree"]) for e in table["ops"])
    # the same kernel is a fair candidate where no QK-norm is needed: the gate is specific
    llama_out = tune_small(tmp_path / "llama", "llama", ("plain.*",), ("tests.plain_attention",))
    admitted = PerfDB(llama_out / "perfdb").rows("SELECT count(*) AS n FROM admitted WHERE kernel_id = 'plain.attention'")
    assert admitted[0]["n"] > 0


def test_an_op_no_optimised_kernel_supports_runs_on_its_reference_and_says_so(tmp_path):
    config = write_config(tmp_path, "small-qwen3.5", shrink(CATALOGUE["qwen3.5-0.8b"]))
    result = CliRunner().invoke(cli, ["plan", "--config", str(config), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    deltanet = [n for n in notes if "recurrent.gated_deltanet" in n]
    assert len(deltanet) == 1 and "reference fallback eager.gated_deltanet" in deltanet[0]
    # on a GPU FLA's kernels serve it; here they say why they cannot
    assert "fla.chunk_gated_deltanet (NOT_INSTALLED" in deltanet[0] or "PLATFORM_MISMATCH" in deltanet[0], deltanet
    assert any("not tuned" in n and "vision" in n for n in notes), "unmodelled parts are named, not dropped"
    # (that the tune serves it from the reference: test_tune_a_small_member_of_every_family[qwen3.5])


def test_shrunk_configs_keep_their_family():
    """A shrunk member runs the same ops, and needs every kernel feature (GQA, windows, unit-offset
    norms...) the checkpoint it is shrunk from needs: tuning it exercises those gates. (It may need
    more: Qwen3.5's 2 key / 4 value linear-attention heads are GQA, as in the larger Qwen3.5
    checkpoints; the 0.8b has 16 / 16.)"""
    def ops_and_features(cfg: dict, name: str) -> dict[str, frozenset[str]]:
        found: dict[str, frozenset[str]] = {}
        for instance in capture(cfg, name).instances:
            sig = instance.signature
            found[sig.op] = found.get(sig.op, frozenset()) | required_features(sig)
        return found

    for name in FAMILIES.values():
        small, real = ops_and_features(shrink(CATALOGUE[name]), "small"), ops_and_features(CATALOGUE[name], name)
        assert set(small) == set(real) and all(small[op] >= real[op] for op in real), (name, small, real)

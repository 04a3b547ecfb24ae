"""Workloads: a recorded run as a model to tune (signatures exactly as recorded, buckets at its
shapes), and the loop a user runs: record a real client, tune the file, serve every call from it."""
import json
from collections import Counter

import pytest
import torch
from click.testing import CliRunner

import runtime_loader
from lzsolve.cli import cli
from lzsolve.errors import LzError
from lzsolve.measure.grid import buckets
from lzsolve.models import workload
from runtime_loader import Dispatcher
from tests.tables import QUICK

transformers = pytest.importorskip("transformers")
from runtime_loader.integrations.transformers import register  # noqa: E402


def test_buckets_crowd_where_calls_crowd():
    # decode: kv_len grows by one per step, most calls at short lengths
    calls = Counter({v: 10 for v in range(100, 110)} | {v: 1 for v in range(110, 200)})
    assert workload.placed(calls, 3) == [100, 109, 199]  # smallest, the calls' median (95th of 190), largest
    assert workload.placed(calls, 5) == [100, 104, 109, 152, 199]
    assert workload.placed(Counter({1: 500, 64: 3, 2048: 1}), 3) == [1, 64, 2048]
    assert workload.placed(Counter({7: 1, 9: 1}), 4) == [7, 9]  # no more values than recorded
    assert workload.placed(Counter({1: 9, 8: 1, 64: 1}), 1) == [64], "one bucket: every recorded call inside the range"


def write_workload(path, calls, **fields):
    data = {"format": "lzsolve-workload", "version": 1, "name": "w", "calls": calls, **fields}
    path.write_text(json.dumps(data))
    return path


RMS_CALL = {"signature": {"op": "norm.rms", "static": {"hidden": 64}, "flags": [], "dtype": "fp32"},
            "dims": {"tokens": 12}, "count": 5}


def test_grid_has_as_many_buckets_per_dim_as_the_grid_it_is_like(tmp_path):
    calls = [{**RMS_CALL, "dims": {"tokens": t}, "count": n} for t, n in ((1, 90), (5, 3), (12, 5), (700, 1))]
    recorded = workload.read(write_workload(tmp_path / "w.json", calls))
    assert buckets(workload.grid(recorded, "tiny"), "norm.rms") == {"tokens": [1, 700]}
    # the median call is at 1 already: the next bucket goes to the most called value left
    assert buckets(workload.grid(recorded, "small"), "norm.rms") == {"tokens": [1, 12, 700]}
    (instance,) = workload.captured(recorded).instances
    # 99 calls at 4 shapes: about 25 calls per shape (what one forward makes of it, at one shape)
    assert str(instance.signature) == "norm.rms[hidden=64,fp32]" and instance.calls_per_forward == 25


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"calls": []}), "not a workload file"),
    (json.dumps({"format": "lzsolve-workload", "version": 9, "calls": []}), "version 9"),
    (json.dumps({"format": "lzsolve-workload", "version": 1, "calls": []}), "recorded no call"),
    (json.dumps({"format": "lzsolve-workload", "version": 1, "calls": [{**RMS_CALL, "dims": {"seq": 3}}]}),
     "malformed workload"),
    (json.dumps({"format": "lzsolve-workload", "version": 1,
                 "calls": [{**RMS_CALL, "signature": {**RMS_CALL["signature"], "op": "norm.nope"}}]}), "unknown op"),
    # true is 1 to Python, not to JSON
    (json.dumps({"format": "lzsolve-workload", "version": True, "calls": [RMS_CALL]}), "version True"),
    (json.dumps({"format": "lzsolve-workload", "version": 1, "calls": [{**RMS_CALL, "count": True}]}),
     "count True is not a positive int"),
    (json.dumps({"format": "lzsolve-workload", "version": 1, "calls": [{**RMS_CALL, "dims": {"tokens": True}}]}),
     "are not positive ints"),
])
def test_bad_workload_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "w.json"
    path.write_text(content)
    with pytest.raises(LzError, match=message) as e:
        workload.read(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("extra,message", [
    (["--tp", "2"], "--tp does not apply"),
    (["--dtype", "bf16"], "recorded fp32 calls"),
    (["--model", "gpt2"], "not several"),
])
def test_options_that_contradict_a_workload(tmp_path, extra, message):
    path = write_workload(tmp_path / "w.json", [RMS_CALL])
    result = CliRunner().invoke(cli, ["plan", "--workload", str(path), "--device", "cpu", *extra])
    assert isinstance(result.exception, LzError) and message in str(result.exception), result.output


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()


def run_client(model, ids):
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                       pad_token_id=0)
        return model(ids[:1, :9]).logits


def test_record_a_client_tune_the_file_and_serve_every_call(tmp_path):
    model = tiny_llama()
    ids = torch.randint(0, 128, (3, 13))
    register(Dispatcher(None))
    model.set_attn_implementation("lzsolve")
    try:
        with runtime_loader.record(tmp_path / "client.json"):
            run_client(model, ids)
        recorded = json.loads((tmp_path / "client.json").read_text())
        assert {c["signature"]["op"] for c in recorded["calls"]} == {"attention.prefill", "attention.decode"}

        out = tmp_path / "artifact"
        result = CliRunner().invoke(cli, ["tune", "--workload", str(tmp_path / "client.json"), "--device", "cpu",
                                          "--grid", "tiny", "--exclude", "compile.*", "--out", str(out), *QUICK])
        assert result.exit_code == 0, result.output
        table = json.loads((out / "dispatch.json").read_text())
        assert table["model"]["id"] == "client" and table["grid"] == "workload/tiny"
        assert table["buckets"]["attention.prefill"]["seq"] == [9, 13]  # the recorded prefill lengths

        d = runtime_loader.load(out, strict=True)
        register(d)
        with runtime_loader.record(tmp_path / "replay.json"):
            served = run_client(model, ids)
        replay = json.loads((tmp_path / "replay.json").read_text())
        assert {c["name"] for c in replay["calls"]} == {c["name"] for c in recorded["calls"]}
        assert {c["served"] for c in replay["calls"]} == {"table"}, replay["calls"]
        assert replay["outside"] == []
        model.set_attn_implementation("sdpa")
        torch.testing.assert_close(served, run_client(model, ids), rtol=1e-5, atol=1e-5)
    finally:
        runtime_loader.custom_ops.activate(Dispatcher(None))

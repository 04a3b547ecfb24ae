"""Record mode: every Dispatcher call in the block is counted by signature, dims and serving kernel."""
import json

import pytest
import torch

import runtime_loader
from runtime_loader import Dispatcher, custom_ops
from runtime_loader.table import parse_table

from .tables import RMS, table


def calls_by_name(data: dict) -> dict:
    return {(c["name"], tuple(sorted(c["dims"].items()))): c for c in data["calls"]}


def test_counts_every_call_even_those_cached_before(tmp_path):
    d = Dispatcher(parse_table(table()))
    x, w = torch.randn(4, 64), torch.randn(64)
    d.rms_norm(x, w)  # cached before the recording starts: must still be counted
    assert d.cached_keys() == 1
    path = tmp_path / "w.json"
    with runtime_loader.record(path):
        for _ in range(3):
            d.rms_norm(x, w)
        d.rms_norm(torch.randn(3, 5, 64), w)
        q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
        d.attention(q, k, k, causal=True)
        d.attention(q[:, :, :3], k, k, causal=True)  # chunked prefill: no signature describes it
    data = json.loads(path.read_text())
    assert data["format"] == "lzsolve-workload" and data["name"] == "w"
    calls = calls_by_name(data)
    rms_4 = calls[(str(RMS), (("tokens", 4),))]
    assert (rms_4["count"], rms_4["kernel"], rms_4["served"]) == (3, "torch.rms_norm", "table")
    assert calls[(str(RMS), (("tokens", 15),))]["kernel"] == "eager.rms_norm"  # the tree's other leaf
    attn = [c for c in data["calls"] if c["signature"]["op"] == "attention.prefill"]
    assert [(c["dims"], c["count"], c["served"]) for c in attn] == [({"batch": 1, "seq": 8}, 1, "table")]
    assert data["outside"] == [{"ops": ["attention.decode", "attention.prefill"], "kernel": "sdpa.default",
                                "count": 1}]
    # after the block, caching resumes
    d.rms_norm(x, w)
    assert d.cached_keys() >= 1


def test_a_recorded_call_costs_a_lookup_not_a_resolution(tmp_path, monkeypatch):
    """While recording, a call key resolves once and its later calls are served from the cache, their
    count read when the recording stops: a recording costs what serving does, so a server can leave it
    on for a while (before, every call resolved its signature). Once it stops, the entries it made
    (which never hand a call back) are dropped."""
    d = Dispatcher(parse_table(table()))
    resolved = []
    real = Dispatcher._resolve
    monkeypatch.setattr(Dispatcher, "_resolve", lambda self, *args: resolved.append(args[1]) or real(self, *args))
    x, w = torch.randn(4, 64), torch.randn(64)
    with runtime_loader.record(tmp_path / "w.json"):
        for _ in range(50):
            d.rms_norm(x, w)
            d.served.rms_norm(x, w)
    assert len(resolved) == 2, "one resolution per key (the method's and the served one's)"
    (call,) = json.loads((tmp_path / "w.json").read_text())["calls"]
    assert call["count"] == 100 and call["kernel"] == "torch.rms_norm"
    assert d.cached_keys() == 0, "the recording's entries are dropped when it stops"
    assert d.stats()["norm.rms"] == {"torch.rms_norm": 100}

def test_records_without_a_table_and_through_the_custom_ops(tmp_path):
    d = Dispatcher(None)
    custom_ops.activate(d)
    try:
        with runtime_loader.record(tmp_path / "w.json", name="my-model"):
            torch.ops.lzsolve.rms_norm(torch.randn(2, 7, 32), torch.randn(32), 1e-6)
    finally:
        custom_ops.activate(Dispatcher(None))
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["name"] == "my-model"
    (call,) = data["calls"]
    assert (call["name"], call["dims"], call["served"]) == ("norm.rms[hidden=32,fp32]", {"tokens": 14}, "fallback")


def test_written_when_the_block_raises_and_never_half(tmp_path):
    d = Dispatcher(None)
    with pytest.raises(KeyboardInterrupt):
        with runtime_loader.record(tmp_path / "w.json"):
            d.gelu(torch.randn(3, 8))
            raise KeyboardInterrupt
    assert len(json.loads((tmp_path / "w.json").read_text())["calls"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"]  # no temporary file left


def test_recordings_do_not_nest(tmp_path):
    with runtime_loader.record(tmp_path / "a.json"):
        with pytest.raises(RuntimeError, match="do not nest"):
            with runtime_loader.record(tmp_path / "b.json"):
                pass
    assert not (tmp_path / "b.json").exists()


def test_a_path_that_cannot_take_the_recording_is_refused_before_the_run(tmp_path):
    """A folder, or a file where its folder should be: refused at entry, before a run is recorded for
    nothing (the write at the end raised, and hid the block's own error)."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    for path in (tmp_path, blocker / "w.json"):
        with pytest.raises(ValueError, match="record"), runtime_loader.record(path):
            pytest.fail("the block ran")


def test_the_blocks_error_reaches_the_caller_and_what_ran_is_kept(tmp_path):
    target = tmp_path / "w.json"
    with pytest.raises(KeyError, match="the server's"), runtime_loader.record(target):
        raise KeyError("the server's")
    assert json.loads(target.read_text())["calls"] == []
    later = tmp_path / "later.json"
    with pytest.warns(RuntimeWarning, match="could not be written"), pytest.raises(KeyError, match="the server's"):
        with runtime_loader.record(later):
            later.mkdir()  # the path stops being writable during the run
            raise KeyError("the server's")



def test_an_empty_call_is_recorded_outside_so_the_workload_reads(tmp_path):
    """A call with 0 tokens is the fallback's, never tuned (a workload's dims are >= 1): recorded among
    its calls, it made `lzsolve tune --workload` refuse the whole file as malformed."""
    from lzsolve.models import workload
    d = Dispatcher(parse_table(table()))
    path = tmp_path / "w.json"
    with runtime_loader.record(path):
        d.rms_norm(torch.randn(0, 64), torch.randn(64))
        d.rms_norm(torch.randn(4, 64), torch.randn(64))
    data = json.loads(path.read_text())
    assert [c["dims"] for c in data["calls"]] == [{"tokens": 4}]
    assert data["outside"] == [{"ops": ["norm.rms"], "kernel": "eager.rms_norm", "count": 1}]
    assert workload.read(path).calls == {RMS: {(("tokens", 4),): 1}}

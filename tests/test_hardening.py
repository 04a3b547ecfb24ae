"""Issue 17: the circuit breaker, ranked leaves, operator policy, explain, and a lazy start."""
import logging
import warnings

import pytest
import torch

import runtime_loader
from runtime_loader import Dispatcher, TableError, registry
from runtime_loader.dispatcher import BREAKER_LIMIT
from runtime_loader.ops import Signature
from runtime_loader.ops.conv import causal_conv1d as eager_causal_conv1d
from runtime_loader.ops.norm import rms_norm as eager_rms_norm
from runtime_loader.ops.norm import rms_norm_add as eager_rms_norm_add
from runtime_loader.policies import PolicyError, from_env, parse_lock
from runtime_loader.specs import KernelSpec
from runtime_loader.table import TableError as _TableError
from runtime_loader.table import parse_table

from .tables import RMS, entry, table, write

ALL = frozenset({"bf16", "fp16", "fp32"})
_state = {"calls": 0, "fail_after": None}


def _flaky(x, w, eps):
    """Right until fail_after calls, then raises (a driver update mid-run)."""
    _state["calls"] += 1
    if _state["fail_after"] is not None and _state["calls"] > _state["fail_after"]:
        raise RuntimeError("injected fault")
    return eager_rms_norm(x, w, eps)


def _scribbling_add(x, residual, w, eps):
    """Overwrites its inputs, then raises: what a fused in-place kernel failing half-way does."""
    x.zero_()
    residual.fill_(7.0)
    raise RuntimeError("injected fault after writing")


FAULTY = (KernelSpec("test.flaky_rms", frozenset({"norm.rms"}), "testlib", _flaky,
                     platforms=frozenset({"cpu", "cuda"}), dtypes=ALL),
          KernelSpec("test.scribbling_add", frozenset({"norm.rms_add"}), "testlib", _scribbling_add,
                     platforms=frozenset({"cpu", "cuda"}), dtypes=ALL))
FLAKY, SCRIBBLE = (spec.kernel_id for spec in FAULTY)
RMS_ADD = Signature.make("norm.rms_add", {"hidden": 64}, (), "fp32")


@pytest.fixture(autouse=True, scope="module")
def faulty_kernels_registered():
    """In the registry while this module runs only (conftest.registry_restored takes them out)."""
    for spec in FAULTY:
        registry.register(spec)


@pytest.fixture(autouse=True)
def reset():
    _state.update(calls=0, fail_after=None)


def ranked_table(chosen=FLAKY, ranked=(("torch.rms_norm", 1.1),)) -> dict:
    leaf = {"kernel_id": chosen, "gain": 1.5, "ranked": [{"kernel_id": k, "ratio": r} for k, r in ranked]}
    return table([entry(RMS, leaf)])


def norm_args(tokens=4):
    return torch.randn(tokens, 64), torch.randn(64)


def expected(x, w):
    return eager_rms_norm(x, w, 1e-6)


def test_older_tables_without_ranked_leaves_still_load():
    t = parse_table(table())
    leaf = t.trees[RMS].le
    assert leaf.kernel_id == "torch.rms_norm" and leaf.ranked == () and leaf.gain is None


def test_ranked_kernels_are_checked_like_chosen_ones():
    with pytest.raises(_TableError, match="unknown kernel id"):
        parse_table(ranked_table(ranked=(("nope.kernel", 1.1),)))
    with pytest.raises(_TableError, match="cannot compute"):
        parse_table(ranked_table(ranked=(("eager.swiglu", 1.1),)))


def test_a_kernel_that_raises_mid_run_is_replaced_and_counted():
    d = Dispatcher(parse_table(ranked_table()))
    x, w = norm_args()
    _state["fail_after"] = 5
    with pytest.warns(RuntimeWarning, match="test.flaky_rms raised") as caught:
        for _ in range(10):
            torch.testing.assert_close(d.rms_norm(x, w), expected(x, w))
    assert sum("raised" in str(c.message) for c in caught) == 1, "warned once"
    assert d.kernel_for("rms_norm", x, w) == "torch.rms_norm", "the key moved to the next ranked kernel"
    assert d.stats()["norm.rms"] == {FLAKY: 5, f"{FLAKY} (failed)": 1, "torch.rms_norm": 5}


def test_a_failing_runner_up_is_skipped_too():
    from . import faulty_kernels  # noqa: F401 - registers fault.raise

    d = Dispatcher(parse_table(ranked_table(ranked=(("fault.raise", 1.05), ("torch.rms_norm", 1.2)))))
    _state["fail_after"] = 0
    x, w = norm_args()
    with pytest.warns(RuntimeWarning):
        torch.testing.assert_close(d.rms_norm(x, w), expected(x, w))
    assert d.stats()["norm.rms"] == {f"{FLAKY} (failed)": 1, "fault.raise (failed)": 1, "torch.rms_norm": 1}


def test_after_the_limit_a_failing_kernel_is_dropped_for_every_key():
    d = Dispatcher(parse_table(ranked_table(ranked=())))
    _state["fail_after"] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tokens in range(1, BREAKER_LIMIT + 1):
            x, w = norm_args(tokens)
            torch.testing.assert_close(d.rms_norm(x, w), expected(x, w))
    assert any("no longer used" in str(c.message) for c in caught)
    x, w = norm_args(50)  # a key that never failed
    assert d.kernel_for("rms_norm", x, w) == "eager.rms_norm"
    assert d.stats()["norm.rms"][f"{FLAKY} (failed)"] == BREAKER_LIMIT


def test_warmup_drops_a_failing_kernel_and_warms_the_next_ranked_one():
    d = Dispatcher(parse_table(ranked_table()))
    _state["fail_after"] = 0
    with pytest.warns(RuntimeWarning, match="test.flaky_rms failed its warm-up"):
        assert d.warmup() == 2, "torch.rms_norm, at the smallest and largest grid point"
    assert d.kernel_for("rms_norm", *norm_args(20)) == "torch.rms_norm"
    with pytest.raises(TableError, match="warm-up of test.flaky_rms"):
        Dispatcher(parse_table(ranked_table())).warmup(strict=True)


def test_strict_lets_the_kernel_error_through():
    d = Dispatcher(parse_table(ranked_table()), strict=True)
    _state["fail_after"] = 0
    with pytest.raises(RuntimeError, match="injected fault"):
        d.rms_norm(*norm_args())


def test_the_callers_errors_reach_the_caller_and_blame_no_kernel():
    d = Dispatcher(parse_table(table()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(BREAKER_LIMIT + 1):  # the fallback fails too: bad arguments, not a bad kernel
            with pytest.raises(RuntimeError, match="normalized_shape"):
                d.rms_norm(torch.randn(4, 64), torch.randn(32))
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "torch.rms_norm"


def test_a_consuming_kernel_that_raises_on_the_first_call_gets_its_inputs_back():
    d = Dispatcher(parse_table(table([entry(RMS_ADD, {"kernel_id": SCRIBBLE})])))
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    want = eager_rms_norm_add(x.clone(), r.clone(), w, 1e-6)
    with pytest.warns(RuntimeWarning, match="raised"):
        out = d.rms_norm_add(x, r, w)
    torch.testing.assert_close(out, want)
    assert d.stats()["norm.rms_add"] == {f"{SCRIBBLE} (failed)": 1, "eager.rms_norm_add (fallback)": 1}


def test_a_consuming_op_whose_consumed_input_is_absent_is_served_from_the_table():
    """conv.causal_depthwise consumes its state, which a prompt has none of (None)."""
    sig = Signature.make("conv.causal_depthwise", {"channels": 8, "width": 4}, ("silu",), "fp32")
    d = Dispatcher(parse_table(table([entry(sig, {"kernel_id": "compile.causal_conv1d"})])))
    x, weight = torch.randn(2, 5, 8), torch.randn(8, 4)
    assert d.kernel_for("causal_conv1d", x, weight) == "compile.causal_conv1d"
    out, state = d.causal_conv1d(x, weight)
    torch.testing.assert_close(out, eager_causal_conv1d(x, weight, None, None, True)[0])
    assert d.stats()["conv.causal_depthwise"] == {"compile.causal_conv1d": 1}


# --- policy --------------------------------------------------------------------------------------

def loaded(tmp_path, raw=None, **kwargs):
    return runtime_loader.load(write(tmp_path / "art", raw or ranked_table()), **kwargs)


def test_disable_by_argument_and_by_environment(tmp_path, monkeypatch):
    x, w = norm_args()
    assert loaded(tmp_path, disable=True).kernel_for("rms_norm", x, w) == "eager.rms_norm"
    monkeypatch.setenv("LZSOLVE_DISABLE", "1")
    assert loaded(tmp_path).kernel_for("rms_norm", x, w) == "eager.rms_norm"
    with runtime_loader.policy():  # the block's policy replaces the environment's
        assert loaded(tmp_path).kernel_for("rms_norm", x, w) == FLAKY


def test_avoid_reroutes_to_the_next_ranked_kernel(tmp_path, monkeypatch):
    x, w = norm_args()
    assert loaded(tmp_path, avoid=["testlib"]).kernel_for("rms_norm", x, w) == "torch.rms_norm"
    assert loaded(tmp_path, avoid="testlib").kernel_for("rms_norm", x, w) == "torch.rms_norm", "one name, not letters"
    monkeypatch.setenv("LZSOLVE_AVOID", "testlib")
    assert loaded(tmp_path).kernel_for("rms_norm", x, w) == "torch.rms_norm"
    with runtime_loader.policy(avoid=["testlib", "torch"]):  # nothing left to rank: the fallback
        assert loaded(tmp_path).kernel_for("rms_norm", x, w) == "eager.rms_norm"


def test_lock_by_argument_and_environment(tmp_path, monkeypatch, caplog):
    x, w = norm_args()
    with caplog.at_level(logging.WARNING, logger="runtime_loader"):
        d = loaded(tmp_path, lock={"norm.rms": "torch.rms_norm"})
    assert "lock norm.rms=torch.rms_norm" in caplog.text, "the policy is logged at load"
    assert d.kernel_for("rms_norm", x, w) == "torch.rms_norm"
    assert d.kernel_for("rms_norm", torch.randn(4, 32), torch.randn(32)) == "torch.rms_norm", "outside the table too"
    monkeypatch.setenv("LZSOLVE_LOCK", "norm.rms=torch.rms_norm")
    assert loaded(tmp_path).kernel_for("rms_norm", x, w) == "torch.rms_norm"


def test_a_lock_that_cannot_serve_a_call_falls_back_with_a_warning(tmp_path):
    with runtime_loader.policy(lock={"norm.rms": "torch.rms_norm"}):
        d = loaded(tmp_path)
    x = torch.randn(4, 64, dtype=torch.float64)  # not a dtype any signature holds: the plain fallback
    assert d.kernel_for("rms_norm", x, torch.randn(64, dtype=torch.float64)) == "eager.rms_norm"
    with pytest.warns(RuntimeWarning, match="ignored: .*implements"):
        d = loaded(tmp_path, lock={"norm.rms": "eager.swiglu"})
    assert d.kernel_for("rms_norm", *norm_args()) == FLAKY
    with pytest.raises(TableError, match="unknown kernel id"):
        loaded(tmp_path, lock={"norm.rms": "nope.kernel"}, strict=True)


def test_a_dispatcher_without_a_table_honours_its_locks_on_any_device():
    """Dispatcher(None, policy=...) has no table's device: a lock serves GPU calls too, so a patched
    model locked to the eager kernels runs them (benchmarks/qwen35_linear_attention.py's reference
    ran transformers' FLA path instead: every CUDA call was "another device than the table's")."""
    d = Dispatcher(None, policy=runtime_loader.Policy(lock={"norm.rms": "torch.rms_norm"}))
    sig = Signature.make("norm.rms", {"hidden": 64}, (), "bf16")
    for on_cuda in (False, True):
        spec, from_table, reason = d._pick(sig, {"tokens": 4}, on_cuda)
        assert (spec.kernel_id, from_table) == ("torch.rms_norm", True), reason


def test_a_malformed_lock_item_is_dropped_alone_and_the_kill_switch_holds(tmp_path, monkeypatch):
    """A typo in LZSOLVE_LOCK used to drop the whole environment's policy, LZSOLVE_DISABLE=1 with it:
    the table served while the operator had switched it off."""
    x, w = norm_args()
    monkeypatch.setenv("LZSOLVE_LOCK", "norm.rms")
    monkeypatch.setenv("LZSOLVE_DISABLE", "1")
    with pytest.warns(RuntimeWarning, match="'norm.rms' is not op=kernel_id; ignored .*op=kernel_id"):
        d = loaded(tmp_path)
    assert d.policy.disable and d.kernel_for("rms_norm", x, w) == "eager.rms_norm"
    monkeypatch.delenv("LZSOLVE_DISABLE")
    monkeypatch.setenv("LZSOLVE_AVOID", "testlib")
    with pytest.warns(RuntimeWarning, match="not op=kernel_id"):
        assert loaded(tmp_path).kernel_for("rms_norm", x, w) == "torch.rms_norm", "the environment's avoid holds"
    monkeypatch.delenv("LZSOLVE_AVOID")
    monkeypatch.setenv("LZSOLVE_LOCK", "norm.rms, norm.rms=eager.rms_norm")
    with pytest.warns(RuntimeWarning, match="not op=kernel_id"):
        assert loaded(tmp_path).kernel_for("rms_norm", x, w) == "eager.rms_norm", "the well-formed lock holds"
    with pytest.raises(TableError, match="policy: .*not op=kernel_id"):
        loaded(tmp_path, strict=True)


@pytest.mark.parametrize("argument, message", [
    ({"lock": "norm.rms=torch.rms_norm"}, "lock='norm.rms=torch.rms_norm': pass a dict of op to kernel id"),
    ({"lock": {"norm.rms": 3}}, "lock={'norm.rms': 3}: pass a dict"),
    ({"disable": "no"}, "disable='no': pass True or False"),
    ({"avoid": 5}, "avoid=5: pass library names"),
    ({"avoid": [b"liger-kernel"]}, "avoid=[b'liger-kernel']: pass library names"),
    ({"avoid": b"liger-kernel"}, "avoid=b'liger-kernel': pass library names"),
])
def test_load_names_an_argument_of_the_wrong_type(tmp_path, argument, message):
    """Python's own messages named neither the argument nor its form ("'str' object is not a mapping")."""
    with pytest.raises(TypeError) as e:
        runtime_loader.load(tmp_path, **argument)
    assert str(e.value).startswith(message), e.value


def test_lock_parsing_keeps_configured_ids_whole():
    assert parse_lock("norm.rms=triton.rms_norm[block=1024,warps=4], linear=torch.linear") == {
        "norm.rms": "triton.rms_norm[block=1024,warps=4]", "linear": "torch.linear"}
    with pytest.raises(PolicyError):
        parse_lock("norm.rms", strict=True)
    assert from_env({"LZSOLVE_DISABLE": "0"}).disable is False
    assert from_env({"LZSOLVE_AVOID": "a, b"}).avoid == {"a", "b"}


# --- explain -------------------------------------------------------------------------------------

def test_explain_names_leaf_kernel_gain_runner_ups_and_policy():
    raw = table([entry(RMS, {"dim": "tokens", "threshold": 8.0,
                             "le": {"kernel_id": FLAKY, "gain": 1.5, "ranked": [{"kernel_id": "torch.rms_norm",
                                                                                  "ratio": 1.1}]},
                             "gt": {"kernel_id": "eager.rms_norm"}})])
    d = Dispatcher(parse_table(raw), policy=runtime_loader.Policy(avoid=frozenset({"testlib"})))
    out = d.explain("norm.rms", hidden=64, tokens=4)
    assert out["signature"] == str(RMS) and out["kernel"] == "torch.rms_norm" and out["reason"] == "ranked #2"
    assert out["leaf"]["path"] == ["tokens <= 8"] and out["leaf"]["kernel_id"] == FLAKY
    assert out["leaf"]["gain"] == 1.5 and out["leaf"]["ranked"][0]["kernel_id"] == "torch.rms_norm"
    assert out["policy"] == "avoid testlib"
    outside = d.explain("norm.rms", hidden=32, tokens=4)
    assert outside["leaf"] is None and outside["kernel"] == "eager.rms_norm"


# --- a lazy start --------------------------------------------------------------------------------

LAZY_LOAD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])  # lazy_library.py: a module nothing else imports
import runtime_loader
from runtime_loader.registry import register
from runtime_loader.specs import KernelSpec
from tests.tables import RMS, entry, table, write

def lazy_rms(x, w, eps):
    import lazy_library  # noqa: F401 - as a real adapter imports its library at its first call
    return runtime_loader.ops.norm.rms_norm(x, w, eps)

register(KernelSpec("test.lazy_rms", frozenset({"norm.rms"}), "pyarrow", lazy_rms, platforms=frozenset({"cpu"}),
                    dtypes=frozenset({"fp32"}), requires=("lazy_library",)))
folder = write(Path(sys.argv[1]), table([entry(RMS, {"kernel_id": "test.lazy_rms"})]))
d = runtime_loader.load(folder, strict=True)
imported_at_load = "lazy_library" in sys.modules
import torch
kernel = d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64))
d.rms_norm(torch.randn(4, 64), torch.randn(64))
print(json.dumps([imported_at_load, kernel, "lazy_library" in sys.modules]))
"""


def test_load_leaves_kernel_libraries_to_their_first_call(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "lazy_library.py").write_text("LOADED = True\n")
    run = subprocess.run([sys.executable, "-c", LAZY_LOAD, str(tmp_path / "art"), str(tmp_path)], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [False, "test.lazy_rms", True]

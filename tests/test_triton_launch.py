"""runtime_loader/kernels/triton_ops/launch.py: a key's first call goes through Triton's JIT
function, later ones launch its compiled kernel directly; a key never meets two specialisations.

On CPU, Triton's JIT function is a real one whose `run` (compile and launch) is replaced by a fake
that hands out a new compiled kernel per call, and the driver is a fake with a settable device; the
GPU test compares against Triton's own binder on real launches."""
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from runtime_loader.kernels.triton_ops import launch  # noqa: E402 - after the skip: it imports triton


@triton.jit
def _kernel(x_ptr, n, eps, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    pass


class Compiled:
    """What Triton's JIT function returns: a compiled kernel, whose `run` is its launcher."""

    def __init__(self, launches: list):
        self.function, self.packed_metadata, self.launches = object(), object(), launches

    def launch_metadata(self, grid, stream, *values):
        return None

    def run(self, *launch):
        self.launches.append((self, *launch))


@pytest.fixture
def fake(monkeypatch):
    """A launcher over _kernel whose Triton calls (jit) and direct launches (launches) are recorded."""
    state = SimpleNamespace(device=0, jit=[], launches=[])

    def run(*args, grid, warmup, **options):  # Triton's JIT function: compiles (here: a new kernel) and launches
        state.jit.append((args, grid, options))
        return Compiled(state.launches)

    monkeypatch.setattr(_kernel, "run", run)
    monkeypatch.setattr(launch, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: state.device, get_current_stream=lambda device: 100 + device)))
    state.launcher = launch.Launcher(_kernel)
    return state


def aligned(dtype=torch.bfloat16):
    base = torch.zeros(64, dtype=torch.float32)  # 16-byte aligned by the allocator
    return base.view(dtype)[:16]


def test_a_keys_later_calls_launch_its_compiled_kernel_with_every_parameter(fake):
    x = aligned()
    first = fake.launcher[(3,)](x, 7, 1e-6, BLOCK=64, num_warps=4)
    assert len(fake.jit) == 1 and not fake.launches  # Triton launched the first call itself
    again = fake.launcher[(3,)](x, 7, 1e-6, BLOCK=64, num_warps=4)
    assert again is first and len(fake.jit) == 1
    kernel, *launched = fake.launches[0]
    # grid padded to 3 dims, the stream of the current device, then the constexprs (FLAG by its default)
    assert kernel is first and launched[:4] == [3, 1, 1, 100]
    assert launched[-5:] == [x, 7, 1e-6, 64, False]


def test_a_new_pointer_of_the_same_alignment_and_dtype_is_the_same_key(fake):
    fake.launcher[(1,)](aligned(), 7, 1e-6, BLOCK=64)
    fake.launcher[(1,)](aligned(), 7, 1e-6, BLOCK=64)
    assert len(fake.jit) == 1 and len(fake.launches) == 1


@pytest.mark.parametrize("change", [
    "misaligned", "dtype", "none", "int_one", "bool_true", "float_one", "eps", "constexpr", "default_given",
    "num_warps", "device"])
def test_what_triton_specialises_on_is_a_new_key(fake, change):
    """Each change from the first call gets Triton's own call (a kernel for it), never the first's."""
    x = aligned()
    fake.launcher[(1,)](x, 7, 1e-6, BLOCK=64)
    args, options = [x, 7, 1e-6], {"BLOCK": 64}
    if change == "misaligned":
        args[0] = aligned()[1:]  # 2 bytes past 16-byte alignment
    elif change == "dtype":
        args[0] = aligned(torch.float16)
    elif change == "none":
        args[0] = None
    elif change in ("int_one", "bool_true", "float_one"):
        fake.launcher[(1,)](x, 1, 1e-6, BLOCK=64)  # True == 1 == 1.0 in a dict; Triton types them apart
        args[1] = {"int_one": 1, "bool_true": True, "float_one": 1.0}[change]
    elif change == "eps":
        args[2] = 1e-5
    elif change == "constexpr":
        options["BLOCK"] = 128
    elif change == "default_given":
        options["FLAG"] = True
    elif change == "num_warps":
        options["num_warps"] = 8
    elif change == "device":
        fake.device = 1
    calls = len(fake.jit)
    fake.launcher[(1,)](*args, **options)
    expected = calls if change == "int_one" else calls + 1  # int 1 was bound just before
    assert len(fake.jit) == expected


def test_calls_it_cannot_replay_go_through_triton_every_time(fake):
    x = aligned()
    for _ in range(2):
        fake.launcher[lambda meta: (1,)](x, 7, 1e-6, BLOCK=64)  # a grid computed from the arguments
        fake.launcher[(1,)](x, 7, 1e-6, 64)  # a constexpr by position
    assert len(fake.jit) == 4 and not fake.launches


def test_the_switch_sends_every_call_through_triton(fake, monkeypatch):
    """LZSOLVE_TRITON_LAUNCH=jit (read at import into DIRECT)."""
    monkeypatch.setattr(launch, "DIRECT", False)
    x = aligned()
    for _ in range(3):
        fake.launcher[(1,)](x, 7, 1e-6, BLOCK=64)
    assert len(fake.jit) == 3 and not fake.launches


def test_a_triton_without_the_launcher_it_replays_goes_through_its_jit_function(fake, monkeypatch):
    """Before Triton 3.4 (no triton.knobs) the compiled kernel's launcher takes other arguments."""
    monkeypatch.setattr(launch, "JITFunction", None)
    older = launch.Launcher(_kernel)
    for _ in range(2):
        older[(1,)](aligned(), 7, 1e-6, BLOCK=64)
    assert len(fake.jit) == 2 and not fake.launches


def test_under_torch_compile_the_kernel_is_tritons_jit_function(fake, monkeypatch):
    """Dynamo puts Triton's JIT function in its graph; traced, the key and the direct launch failed
    (symbolic ints, the compiled kernel): the GPU test below compiles a real one."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = aligned()
    for _ in range(2):
        fake.launcher[(1,)](x, 7, 1e-6, BLOCK=64)
    assert len(fake.jit) == 2 and not fake.launches and not fake.launcher._bound


def test_the_keys_start_again_past_the_limit(fake, monkeypatch):
    monkeypatch.setattr(launch, "MAX_KEYS", 2)
    x = aligned()
    for n in (5, 6, 7):
        fake.launcher[(1,)](x, n, 1e-6, BLOCK=64)
    assert len(fake.launcher._bound) == 1
    fake.launcher[(1,)](x, 7, 1e-6, BLOCK=64)  # the last one kept
    assert len(fake.jit) == 3 and len(fake.launches) == 1


def test_a_function_that_is_not_tritons_jit_is_called_as_it_is():
    """Under TRITON_INTERPRET=1 the kernel is the interpreter's function: launched as Triton would."""
    calls = []
    interpreted = type("Interpreted", (), {"__getitem__": lambda self, grid: lambda *a, **k: calls.append((grid, a, k))})()
    launch.Launcher(interpreted)[(2,)](1, BLOCK=4)
    assert calls == [((2,), (1,), {"BLOCK": 4})]


@pytest.mark.gpu
def test_each_key_meets_the_kernel_tritons_binder_picks_and_its_output():
    """The RMSNorm kernel over argument variations Triton specialises on (pointer alignment, a
    residual or none, ints of 1, of multiples of 16 and neither, one past 32 bits): the compiled
    kernel the launcher keeps for the call's key is the one Triton's binder picks (compiled, not
    launched: warmup=True), and the fast launch writes what Triton's own launch writes."""
    from runtime_loader.kernels.triton_ops.norm import _rms_norm_kernel

    base = torch.randn(3 * 8192 + 64, device="cuda", dtype=torch.bfloat16)
    residuals = torch.randn_like(base)
    weight = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
    problems, checked = [], 0
    for x_offset in (0, 8, 1):
        for res_offset in (None, 0, 3):
            for n_cols in (8192, 8191, 1):
                for stride in (8192, 8200, 2**31 + 16):
                    x = base[x_offset:x_offset + 8192]
                    # the kernel adds x into the residual in place: each launch starts from the same one
                    res = None if res_offset is None else residuals[res_offset:res_offset + 8192]
                    res_before = None if res is None else res.clone()
                    # rows of n_cols read at x with that row stride: one row, so the stride only types;
                    # the total goes into the residual's storage (None: no residual, no total)
                    res_stride = stride if res is not None else 0
                    args = (x, res, weight, None, res, stride, 1, res_stride, 1, 1, stride, 1, res_stride, 1, n_cols,
                            1e-6)
                    options = dict(BLOCK=8192, ONE_TILE=n_cols <= 8192, UNIT_OFFSET=False, num_warps=16)
                    outputs = []
                    for path in ("jit", "fast", "fast"):
                        out = torch.zeros(8192, device="cuda", dtype=torch.bfloat16)
                        if res is not None:
                            res.copy_(res_before)
                        call = (*args[:3], out, *args[4:])
                        if path == "jit":
                            _rms_norm_kernel.fn[(1,)](*call, **options)
                        else:
                            _rms_norm_kernel[(1,)](*call, **options)
                        outputs.append(out)
                    key = (torch.cuda.current_device(), *launch._arg_key(call), *options.items())
                    kept = _rms_norm_kernel._bound[key][0]
                    picked = _rms_norm_kernel.fn.run(*call, grid=(1,), warmup=True, **options)
                    if kept is not picked:
                        problems.append(f"x+{x_offset} res {res_offset} n_cols {n_cols} stride {stride}: other kernel")
                    if not all(torch.equal(outputs[0], o) for o in outputs[1:]):
                        problems.append(f"x+{x_offset} res {res_offset} n_cols {n_cols} stride {stride}: other output")
                    checked += 1
    torch.cuda.synchronize()
    assert checked == 81 and not problems, "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_compiled_model_puts_the_kernel_in_its_graph(dynamic):
    """torch.compile(fullgraph=True) over our RMSNorm + add (the traced patch's path): no graph
    break, and the same output as the eager launch, over shapes that change (symbolic with
    dynamic=True)."""
    from runtime_loader.kernels.triton_ops.norm import rms_norm_add

    def layer(x, residual, weight):
        return rms_norm_add(x, residual, weight, 1e-6, keep_inputs=True, block=4096, warps=8)

    compiled = torch.compile(layer, fullgraph=True, dynamic=dynamic)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    for tokens in (5, 17, 64):
        x, residual = (torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for got, expected in zip(compiled(x, residual, weight), layer(x, residual, weight)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)

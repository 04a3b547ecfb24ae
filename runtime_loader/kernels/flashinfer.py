"""FlashInfer 0.5.3 adapters: attention (prefill, decode; logit soft caps too), RMSNorm, fused add +
RMSNorm, LayerNorm, SwiGLU and GeGLU.

flashinfer is imported inside the adapters: runtime_loader imports without it, and FlashInfer
reads its JIT cache location when it is first imported, which must come after
runtime_loader.jit has pointed the caches. Each kernel JIT-compiles on its first call.

Layouts, as the 0.5.3 sources read them:
- The single-request and ragged kernels on sm90 (FA3, csrc/single_prefill_sm90.cu,
  batch_prefill_sm90.cu) take kv_len and num_kv_heads from k.size(0) and k.size(1) whatever
  kv_layout says, so "HND" there is wrong; every kernel honours q/k/v strides, though. So a
  single request goes in as NHD-shaped strided views of our (1, heads, seq, d) tensors (no copy).
- The paged kernels (fa2 and FA3) read HND correctly and take any cache strides (paged_kv_t in
  include/flashinfer/page.cuh), so our (batch, heads, seq, d) k and v become a pool of pages of
  PAGE_SIZE tokens as overlapping strided views (see paged_kv). Not one page per sequence: the
  schedulers split a sequence's KV across CTAs in whole pages (attention/scheduler.cuh), so one page
  per sequence would switch split-KV off and leave a long sequence to batch * heads CTAs.
- The batch kernels want queries as (batch * seq, heads, d): a copy of q unless q is already a
  transposed view of a (batch, seq, heads, d) tensor (as Hugging Face's q is).
RoPE is left out: apply_rope_with_cos_sin_cache wants q and k as (tokens, heads * d) and a
position-indexed fp32 cos|sin cache, so our (batch, heads, seq, d) q and k would need a transposing
copy per call (we would measure the copy, not the kernel); the other RoPE APIs compute cos and sin
from rope_theta themselves instead of taking the ones a model hands over.
A v head dim other than q's (attention's dv, MLA: q/k 192, v 128) is not declared: these adapters
pass one head dim and refuse 192 (_check_head_dim).
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from ..dtypes import DTYPE_NAMES, HALF  # HALF: DISPATCH_DLPACK_DTYPE_TO_CTYPE_FP16 (fp16 and bf16)
from ..specs import KernelSpec

# Set by runtime_loader.jit.restore when the artifact brought FlashInfer's compiled ops.
PREBUILT_ENV = "LZSOLVE_FLASHINFER_PREBUILT"
_jit_adapted = False  # FlashInfer's JIT layer adapted (below), once per process


def _flashinfer():
    """The flashinfer module. After a restore, the restored cached_ops folder is made FlashInfer's
    AOT folder: FlashInfer runs ninja before loading any JIT op, and ninja wants the generated
    sources at the absolute paths of the machine that compiled them, which an artifact does not
    carry; an op found in the AOT folder loads without ninja (and without nvcc). Its ninja runs
    keep each module's logs apart (own_build_logs)."""
    global _jit_adapted
    import flashinfer

    if not _jit_adapted:
        _jit_adapted = True
        if os.environ.get(PREBUILT_ENV):
            from flashinfer.jit import env as jit_env
            jit_env.FLASHINFER_AOT_DIR = jit_env.FLASHINFER_JIT_DIR
        try:
            from flashinfer.jit import core as jit_core
        except ImportError:  # a FlashInfer without this JIT layer builds some other way
            jit_core = None
        if callable(getattr(jit_core, "run_ninja", None)):
            jit_core.run_ninja = own_build_logs(jit_core.run_ninja)
    return flashinfer


def ninja_escape(path: Path) -> str:
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def own_build_logs(run_ninja: Callable) -> Callable:
    """FlashInfer's ninja runner, with each module's build logs in the module's own folder.

    FlashInfer builds every module with `ninja -C <its JIT folder>`, so all modules share one
    .ninja_log and .ninja_deps there. Two processes building two modules at once (a tune's
    workers on two GPUs) interleave their writes to those logs; ninja then finds no record of
    the other module's objects and builds them again, and the next build again. On two H200s
    (benchmarks/device.sh devices) modules were rebuilt two and three times, and the grid spent 437 s in
    first calls where the one-GPU run spent 59 s. A build file that sets `builddir` to the
    module's folder and includes FlashInfer's keeps each module's logs apart; builds of one
    module are already serialised by FlashInfer's lock per module."""
    if getattr(run_ninja, "own_build_logs", False):
        return run_ninja

    def run(workdir, ninja_file, *args, **kwargs):
        ninja_file = Path(ninja_file)
        own = ninja_file.with_name(f"lzsolve-{ninja_file.name}")
        text = f"builddir = {ninja_escape(ninja_file.parent.resolve())}\ninclude {ninja_escape(ninja_file.resolve())}\n"
        if not own.is_file() or own.read_text() != text:
            scratch = own.with_name(f"{own.name}.{os.getpid()}")
            scratch.write_text(text)
            os.replace(scratch, own)
        return run_ninja(workdir, own, *args, **kwargs)

    run.own_build_logs = True
    return run


# Tokens per KV page, as vLLM pages its cache; a kv_len it does not divide gets gcd(kv_len, PAGE_SIZE).
PAGE_SIZE = 16
HEAD_DIMS = (64, 128, 256)  # FA3 (sm90) instantiates these alone (attention/hopper/prefill_sm90.cuh)
DECODE_GROUP_SIZES = (1, 2, 3, 4, 8)  # DISPATCH_GQA_GROUP_SIZE of the CUDA-core decode kernel
INDEX_PADDING = 128  # page indices past the end of a page table (see page_table)
WORKSPACE_BYTES = 256 << 20  # split-KV scratch shared by every planned wrapper on a device
# Planned layouts kept: 8 MiB of device and 8 MiB of pinned host memory each (batch prefill: 64 MiB more).
MAX_PLANS = 16


class PlanKey(NamedTuple):
    """A planned layout. kv_len is the sequence length for prefill (seq_q == kv_len)."""

    kernel_id: str
    batch: int
    kv_len: int
    hq: int
    hkv: int
    d: int
    dtype: str
    device: str
    sm_scale: float  # FlashInfer fixes the softmax scale at plan time
    causal: bool
    sequence_pages: int  # pages from one sequence's first page to the next's: set by the k/v strides
    softcap: float = 0.0  # and the logits' soft cap (its own kernel module: use_logits_cap)


PLAN_MS: dict[PlanKey, float] = {}  # host time of plan() for every layout held in _PLANS
_PLANS: OrderedDict[PlanKey, object] = OrderedDict()  # planned wrappers, least recently used first
_WORKSPACES: dict[torch.device, torch.Tensor] = {}
_LOCK = threading.Lock()


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _WORKSPACES:  # zeroed: FlashInfer asks for that before its first use
        _WORKSPACES[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[device]


def _planned(key: PlanKey, make: Callable[[], object], plan: Callable[[object], None]) -> object:
    """The wrapper planned for `key`, made and planned on the first call of its layout.

    Each layout keeps its own wrapper and is never re-planned, so the buffers a captured run()
    reads stay put; the least recently used layout beyond MAX_PLANS is dropped (a CUDA graph
    captured on it must not be replayed after that)."""
    with _LOCK:
        wrapper = _PLANS.get(key)
        if wrapper is None:
            wrapper = make()
            plan(wrapper)  # the first plan of a kernel module also JIT-compiles it: time a second one
            start = time.perf_counter()
            plan(wrapper)  # host time: its copies to the device are asynchronous
            PLAN_MS[key] = (time.perf_counter() - start) * 1e3
            _PLANS[key] = wrapper
            if len(_PLANS) > MAX_PLANS:
                evicted, _ = _PLANS.popitem(last=False)
                del PLAN_MS[evicted]
        _PLANS.move_to_end(key)
        return wrapper


def _sm_scale(q, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def _plan_key(kernel_id: str, q, k, causal: bool, scale: float | None, sequence_pages: int,
              softcap: float = 0.0) -> PlanKey:
    batch, hq, _, d = q.shape
    return PlanKey(kernel_id, batch, k.shape[2], hq, k.shape[1], d, DTYPE_NAMES[q.dtype], str(q.device),
                   _sm_scale(q, scale), causal, sequence_pages, float(softcap))


def _soft_cap(softcap: float) -> float | None:
    """FlashInfer's logits_soft_cap: None for none (0 would divide by zero)."""
    return float(softcap) if softcap else None


def _check_head_dim(d: int) -> None:
    """head_dim_multiple=64 admits 192, which FA3 has no kernel for: refuse it before a JIT compile."""
    if d not in HEAD_DIMS:
        raise ValueError(f"FlashInfer attention supports head_dim {HEAD_DIMS}, not {d}")


def paged_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """k and v (batch, heads, seq, d) as pools of pages in FlashInfer's HND shape (pages, heads,
    page_size, d): strided views in which page j of sequence b is page b * sequence_pages + j (pages of
    different heads and sequences overlap in the view; the kernel reads only the pages it is given).
    Both are copied to contiguous only when their strides differ (the kernels take one set of strides)
    or a sequence does not start on the page grid. Returns (k pages, v pages, sequence_pages)."""
    batch, heads, seq, d = k.shape
    page_size = math.gcd(seq, PAGE_SIZE)
    if v.stride() != k.stride() or k.stride(3) != 1 or k.stride(0) % (page_size * k.stride(2)):
        k, v = k.contiguous(), v.contiguous()
    page_stride = page_size * k.stride(2)
    sequence_pages = k.stride(0) // page_stride
    shape = ((batch - 1) * sequence_pages + seq // page_size, heads, page_size, d)
    strides = (page_stride, k.stride(1), k.stride(2), 1)
    return k.as_strided(shape, strides), v.as_strided(shape, strides), sequence_pages


def page_table(batch: int, seq: int, page_size: int, sequence_pages: int):
    """(indptr, indices, last_page_len) of the pools paged_kv makes. On the host, in int32: plan()
    reads them there and copies them to the device itself."""
    pages = seq // page_size
    indptr = torch.arange(0, (batch + 1) * pages, pages, dtype=torch.int32)
    indices = (torch.arange(batch, dtype=torch.int32)[:, None] * sequence_pages
               + torch.arange(pages, dtype=torch.int32)).flatten()
    # With 1-token pages FA3 gathers straight from these indices, reading up to a KV tile (96) past
    # the last one unchecked (attention/hopper/block_sparse_gather.cuh): keep that read in the buffer.
    indices = torch.cat((indices, torch.zeros(INDEX_PADDING, dtype=torch.int32)))
    return indptr, indices, torch.full((batch,), page_size, dtype=torch.int32)


def nhd_view(x: torch.Tensor) -> torch.Tensor:
    """(1, heads, seq, d) -> (seq, heads, d), FlashInfer's NHD shape, as a strided view."""
    return x[0].transpose(0, 1)


def token_rows(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, d) -> (batch * seq, heads, d): a view when x is a transposed view of a
    (batch, seq, heads, d) tensor, a copy otherwise."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])


# --- attention ---------------------------------------------------------------------

def prefill(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0):
    """softcap: FlashInfer's logits_soft_cap (Gemma 2's tanh cap on the scaled scores); window is
    never set (the spec does not declare sliding_window)."""
    flashinfer = _flashinfer()

    batch, hq, seq, d = q.shape
    _check_head_dim(d)
    if batch == 1:  # no plan: the one-request kernel, on views
        out = flashinfer.single_prefill_with_kv_cache(nhd_view(q), nhd_view(k), nhd_view(v), causal=causal,
                                                      kv_layout="NHD", sm_scale=_sm_scale(q, scale),
                                                      logits_soft_cap=_soft_cap(softcap))
        return out.transpose(0, 1).unsqueeze(0)
    # Paged rather than ragged: the ragged kernels want k and v token-major too; pages are views.
    k_pages, v_pages, sequence_pages = paged_kv(k, v)
    key = _plan_key("flashinfer.prefill", q, k, causal, scale, sequence_pages, softcap)

    def plan(wrapper):
        page_size = k_pages.shape[2]
        qo_indptr = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32)
        wrapper.plan(qo_indptr, *page_table(batch, seq, page_size, sequence_pages), hq, k.shape[1], d, page_size,
                     causal=causal, sm_scale=key.sm_scale, q_data_type=q.dtype, kv_data_type=k.dtype,
                     logits_soft_cap=_soft_cap(softcap))

    wrapper = _planned(key, lambda: flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(q.device), "HND"),
                       plan)
    return wrapper.run(token_rows(q), (k_pages, v_pages)).view(batch, seq, hq, d).transpose(1, 2)


def _decode(kernel_id: str, use_tensor_cores: bool, q, k, v, scale: float | None, softcap: float = 0.0,
            **run_options):
    flashinfer = _flashinfer()

    batch, hq, _, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    _check_head_dim(d)
    if not use_tensor_cores and hq // hkv not in DECODE_GROUP_SIZES:
        raise ValueError(f"CUDA-core decode supports GQA group sizes {DECODE_GROUP_SIZES}, not {hq // hkv}")
    k_pages, v_pages, sequence_pages = paged_kv(k, v)
    key = _plan_key(kernel_id, q, k, False, scale, sequence_pages, softcap)

    def make():
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), "HND",
                                                             use_tensor_cores=use_tensor_cores)

    def plan(wrapper):
        page_size = k_pages.shape[2]
        wrapper.plan(*page_table(batch, kv_len, page_size, sequence_pages), hq, hkv, d, page_size,
                     q_data_type=q.dtype, kv_data_type=k.dtype, sm_scale=key.sm_scale,
                     logits_soft_cap=_soft_cap(softcap))

    return _planned(key, make, plan).run(q.squeeze(2), (k_pages, v_pages), **run_options).unsqueeze(2)


def batch_decode(kernel_id: str, use_tensor_cores: bool):
    def decode(q, k, v, causal: bool = False, scale: float | None = None, window: int = 0, softcap: float = 0.0):
        if causal:  # SDPA's top-left causal mask would leave a single query only key 0
            raise ValueError("attention.decode is not causal")
        return _decode(kernel_id, use_tensor_cores, q, k, v, scale, softcap)

    decode.__name__ = kernel_id.replace(".", "_")
    return decode


def batch_decode_fp8kv(kernel_id: str, use_tensor_cores: bool):
    """The same over an FP8 cache: planned with the cache's dtype, the scales handed to run()."""
    def decode(q, k, v, k_scale: float, v_scale: float, scale: float | None = None):
        return _decode(kernel_id, use_tensor_cores, q, k, v, scale, k_scale=k_scale, v_scale=v_scale)

    decode.__name__ = kernel_id.replace(".", "_")
    return decode


# --- norms ---------------------------------------------------------------------------
# Flattened to (tokens, hidden): a 3-D input would select FlashInfer's per-head QK-norm kernel.

def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    """unit_offset: Gemma's (1 + weight), FlashInfer's gemma_rmsnorm."""
    flashinfer = _flashinfer()

    norm = flashinfer.gemma_rmsnorm if unit_offset else flashinfer.rmsnorm
    return norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False):
    """In place: FlashInfer leaves x + residual in residual and the normed rows in x."""
    flashinfer = _flashinfer()

    normed, total = x.reshape(-1, x.shape[-1]), residual.reshape(-1, residual.shape[-1])
    fused = flashinfer.gemma_fused_add_rmsnorm if unit_offset else flashinfer.fused_add_rmsnorm
    fused(normed, total, weight, eps)
    return normed.view(x.shape), total.view(residual.shape)


def layer_norm(x, weight, bias, eps: float):
    """The kernel takes bf16 rows with fp32 gamma and beta only, and reads rows `hidden` apart."""
    flashinfer = _flashinfer()

    rows = x.contiguous().view(-1, x.shape[-1])
    return flashinfer.layernorm(rows, weight.float(), bias.float(), eps).view(x.shape)


# --- gated activations ---------------------------------------------------------------

def fused_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """The contiguous (..., 2 * width) buffer [gate | up] whose two halves gate and up are, as a
    view; None when they are not (then the kernel's input has to be built by a copy)."""
    width = gate.shape[-1]
    shape = (*gate.shape[:-1], 2 * width)
    strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    if (up.shape != gate.shape or up.dtype != gate.dtype or up.device != gate.device
            or gate.stride() != strides or up.stride() != strides
            or up.untyped_storage().data_ptr() != gate.untyped_storage().data_ptr()
            or up.data_ptr() != gate.data_ptr() + width * gate.element_size()):
        return None
    return gate.as_strided(shape, strides)


def _gate_up(gate, up) -> torch.Tensor:
    """act_and_mul_kernel ignores strides (row i at i * 2 * width) and loads 16 bytes at a time from
    the start of each half: it needs [gate | up] contiguous and each half 16-byte aligned."""
    width = gate.shape[-1]
    if width * gate.element_size() % 16:
        raise ValueError(f"FlashInfer's gated activations need width * itemsize % 16 == 0, width is {width}")
    fused = fused_gate_up(gate, up)
    return fused if fused is not None else torch.cat((gate, up), dim=-1)


def swiglu(gate, up):
    flashinfer = _flashinfer()

    return flashinfer.silu_and_mul(_gate_up(gate, up))


def geglu(gate, up):
    flashinfer = _flashinfer()

    return flashinfer.gelu_tanh_and_mul(_gate_up(gate, up))


def plan_ms(kernel_id: str) -> Callable:
    """The spec's setup_ms: the PLAN_MS of the layout of a call (None where nothing was planned)."""
    def setup_ms(q, k, v, causal: bool = False, scale: float | None = None, window: int = 0,
                 softcap: float = 0.0) -> float | None:
        if kernel_id == "flashinfer.prefill" and q.shape[0] == 1:
            return None  # the one-request kernel has no plan
        return PLAN_MS.get(_plan_key(kernel_id, q, k, causal, scale, paged_kv(k, v)[2], softcap))
    return setup_ms


def fp8kv_plan_ms(kernel_id: str) -> Callable:
    def setup_ms(q, k, v, k_scale: float, v_scale: float, scale: float | None = None) -> float | None:
        return plan_ms(kernel_id)(q, k, v, False, scale)
    return setup_ms


def _spec(kernel_id: str, op: str, impl: Callable, notes: str, dtypes=HALF, **capabilities) -> KernelSpec:
    return KernelSpec(kernel_id, frozenset({op}), "flashinfer-python", impl, platforms=frozenset({"cuda"}),
                      min_sm=80, dtypes=dtypes, graph_safe=True, jit=True, jit_caches=("flashinfer",),
                      requires=("flashinfer",), notes=notes, **capabilities)


_DECODE_NOTES = ("paged HND cache whose pages (gcd(kv_len, 16) tokens) are strided views of k and v (no copy "
                 "unless k and v differ in strides); planned on the first call of each (batch, kv_len, heads, d, "
                 "dtype, scale) and never again, plan cost in PLAN_MS; run() has no host sync: captured once planned")
SPECS = [
    _spec("flashinfer.prefill", "attention.prefill", prefill, setup_ms=plan_ms("flashinfer.prefill"), notes=
          "batch 1: single_prefill (FA3 on sm90, FA2 before) on NHD-shaped views, no copy, no plan; "
          "batch > 1: BatchPrefillWithPagedKVCacheWrapper on pages that are views of k and v, q copied "
          "to (batch*seq, heads, d) unless it is a transposed view already, planned on the first call of each "
          "layout (PLAN_MS), run() captured once planned; head_dim 64/128/256 (192 raises)",
          head_dim_max=256, head_dim_multiple=64, features=frozenset({"causal", "gqa", "qk_norm", "softcap"})),
    _spec("flashinfer.decode", "attention.decode", batch_decode("flashinfer.decode", False),
          setup_ms=plan_ms("flashinfer.decode"), notes=
          f"CUDA-core decode; GQA group sizes {DECODE_GROUP_SIZES} only (others raise); head_dim 64/128/256; "
          + _DECODE_NOTES, head_dim_max=256, head_dim_multiple=64, features=frozenset({"gqa", "qk_norm", "softcap"})),
    _spec("flashinfer.decode_tc", "attention.decode", batch_decode("flashinfer.decode_tc", True),
          setup_ms=plan_ms("flashinfer.decode_tc"), notes=
          "tensor-core decode (FA2 prefill kernels), for large GQA groups; head_dim 64/128/256; " + _DECODE_NOTES,
          head_dim_max=256, head_dim_multiple=64, features=frozenset({"gqa", "qk_norm", "softcap"})),
    # FP8 caches: not yet run on a GPU here (issue 18); the parity gate decides
    _spec("flashinfer.decode_fp8kv", "attention.decode_fp8kv", batch_decode_fp8kv("flashinfer.decode_fp8kv", False),
          setup_ms=fp8kv_plan_ms("flashinfer.decode_fp8kv"), notes=
          f"CUDA-core decode over an e4m3 cache (k_scale, v_scale to run()); GQA group sizes {DECODE_GROUP_SIZES}; "
          + _DECODE_NOTES, head_dim_max=256, head_dim_multiple=64, features=frozenset({"gqa"})),
    _spec("flashinfer.decode_tc_fp8kv", "attention.decode_fp8kv",
          batch_decode_fp8kv("flashinfer.decode_tc_fp8kv", True), setup_ms=fp8kv_plan_ms("flashinfer.decode_tc_fp8kv"),
          notes="tensor-core decode over an e4m3 cache; " + _DECODE_NOTES, head_dim_max=256, head_dim_multiple=64,
          features=frozenset({"gqa"})),
    _spec("flashinfer.rms_norm", "norm.rms", rms_norm, "one CTA per row, fixed-order reduction; "
          "gemma_rmsnorm for unit_offset", deterministic=True, features=frozenset({"unit_offset"})),
    _spec("flashinfer.rms_norm_add", "norm.rms_add", rms_norm_add,
          "in place: x + residual written to residual, the normed rows to x (both returned); "
          "gemma_fused_add_rmsnorm for unit_offset", deterministic=True, features=frozenset({"unit_offset"})),
    _spec("flashinfer.layer_norm", "norm.layer", layer_norm,
          "bf16 only; weight and bias cast to fp32 (the kernel's gamma/beta dtype) on every call, and "
          "non-contiguous x copied (the kernel ignores row strides): both measured",
          dtypes=frozenset({"bf16"}), deterministic=True),
    _spec("flashinfer.swiglu", "act.swiglu", swiglu,
          "silu_and_mul on [gate | up]: a view when gate and up are the halves of one contiguous buffer, "
          "else a torch.cat copy (measured); width * itemsize must be a multiple of 16", deterministic=True),
    _spec("flashinfer.geglu", "act.geglu", geglu,
          "gelu_tanh_and_mul on [gate | up]: a view when gate and up are the halves of one contiguous buffer, "
          "else a torch.cat copy (measured); width * itemsize must be a multiple of 16", deterministic=True),
]

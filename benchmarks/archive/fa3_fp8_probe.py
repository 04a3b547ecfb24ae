"""Probe (issue 18): can FA3's FP8 forward serve attention.decode_fp8kv? It takes q in e4m3 too
(q_descale per batch and kv head), so this prints its error against the op's reference (the
dequantised cache with a bf16 q) beside FlashInfer's tensor-core FP8 decode, and eager times
(CUDA events around each call, median of 100: host launches included, so these are not the
graph-replay figures of benchmarks/fp8.py, and the FA3 column pays q's eager quantisation).

    python benchmarks/archive/fa3_fp8_probe.py     # on an H100 with fa3-fwd and FlashInfer"""
import torch
from fa3_fwd_interface import flash_attn_func

from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.ops import Signature

dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
sig = Signature.make("attention.decode_fp8kv", {"hq": 8, "hkv": 1, "d": 128}, (), "bf16")
contract = CONTRACTS[sig.op]
fi = registry.get("flashinfer.decode_tc_fp8kv").impl
sdpa = registry.get("sdpa.default").impl


def fa3(q, k, v, k_scale, v_scale, scale):
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    groups = q.view(b, hkv, hq // hkv, d)
    q_scale = groups.abs().amax(dim=(2, 3)).float().clamp(min=1e-12) / 448  # (b, hkv)
    q8 = (groups.float() / q_scale[:, :, None, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(b, hq, 1, d)
    out = flash_attn_func(q8.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                          q_descale=q_scale, k_descale=torch.full((b, hkv), k_scale, device=q.device),
                          v_descale=torch.full((b, hkv), v_scale, device=q.device))
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)


def timed(fn, n=100):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[n // 2]


for batch, kv_len in ((8, 2048), (8, 8192), (32, 2048), (32, 8192), (128, 2048), (128, 8192)):
    dims = {"batch": batch, "kv_len": kv_len}
    args = contract.make_inputs(sig, dims, dev, gen)
    q, k, v, k_scale, v_scale, scale = args
    reference = contract.reference(*to_fp32(args))
    row = []
    for name, fn in (("fa3_fp8", lambda: fa3(*args)), ("flashinfer_tc_fp8", lambda: fi(*args))):
        try:
            ok, err, msg = compare(fn(), reference, contract.tolerances["bf16"])
            row.append(f"{name} {timed(fn):6.1f} us ({'ok' if ok else 'FAILS ' + msg}; rel_l2 {err['rel_l2']:.2e})")
        except Exception as e:
            row.append(f"{name} raised {type(e).__name__}: {str(e)[:160]}")
    kb, vb = (k.to(torch.bfloat16) * k_scale), (v.to(torch.bfloat16) * v_scale)
    row.append(f"sdpa_bf16 {timed(lambda: sdpa(q, kb, vb, False, scale)):6.1f} us")
    print(f"b{batch} kv{kv_len}: " + " | ".join(row), flush=True)

#!/usr/bin/env bash
# On a GPU (device tool, carry .devsite): can FlashInfer's CUTLASS fused MoE serve moe.experts here?
# FlashInfer ships it as JIT source: the first call builds one module per GPU architecture from
# 176 CUDA files (22 in the wheel plus 154 CUTLASS instantiations generated for sm90; counted by
# running its generate_gemm_operations on CPU, 2026-11-26). This times that build under a deadline
# (BUILD_S, default 540 s) with MAX_JOBS=16 and reports how many objects were compiled; when the
# module loads, it checks cutlass_fused_moe against the op's fp32 reference on a small Mixtral-
# shaped call (gate_up passed as [up; gate], the row order its gated activation reads) and times
# it against torch.grouped_mm in the project's harness. Details under $OUT.
set -u
. benchmarks/device_setup.sh
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
start=$(date +%s)
timeout "${BUILD_S:-540}" python3 -c "
from flashinfer.fused_moe.core import get_cutlass_fused_moe_module
get_cutlass_fused_moe_module('90')" > "$OUT/build.log" 2>&1
rc=$?
echo "build rc $rc after $(( $(date +%s) - start )) s"
ops=$(find /tmp/fi-ws -path '*fused_moe_90*' \( -name '*.o' -o -name '*.cuda.o' \) | wc -l)
echo "objects compiled: $ops (of 176 sources)"
tail -3 "$OUT/build.log"
[ "$rc" = 0 ] || exit 0
python3 - <<'PY' 2>&1 | tee "$OUT/parity.log"
import sys, torch
sys.path.insert(0, "benchmarks")
from checked_timing import timed
from flashinfer.fused_moe import cutlass_fused_moe
from lzsolve.bench import make_harness
from lzsolve.ops import compare, CONTRACTS
from lzsolve.ops.moe import reference
from runtime_loader.kernels import builtin

torch.manual_seed(0)
device = torch.device("cuda")
harness = make_harness(device)
tolerance = CONTRACTS["moe.experts"].tolerances["bf16"]
experts, top_k, hidden, inter = 8, 2, 4096, 7168  # Mixtral-8x7B at TP2
gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16) / hidden ** 0.5
down = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16) / inter ** 0.5
up_gate = torch.cat([gate_up[:, inter:], gate_up[:, :inter]], dim=1).contiguous()  # FlashInfer's row order (its tests: w31 = [w3 (up); w1 (gate)])
for tokens in (1, 64, 1024, 4096):
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    weights, ids = torch.randn(tokens, experts, device=device).softmax(-1).topk(top_k, dim=-1)
    flashinfer = lambda: cutlass_fused_moe(x, ids.int(), weights, up_gate, down, torch.bfloat16, quant_scales=None)[0]
    grouped = lambda: builtin.moe_experts(x, ids, weights, gate_up, down)
    ref = reference(x.float(), ids, weights, gate_up.float(), down.float())
    ok, _, message = compare(flashinfer(), ref, tolerance)
    us = timed(harness, {"flashinfer": [flashinfer], "grouped_mm": [grouped]}) if ok else {}
    print(f"tokens {tokens:5d}: {'agrees' if ok else 'DISAGREES: ' + message}  {us}")
PY

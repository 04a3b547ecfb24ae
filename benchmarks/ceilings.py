"""Are the roofline's ceilings honest? The tune's probe against a plain copy and matmul, in one run.

The probe is what `lzsolve tune` runs (lzsolve.measure.tasks.run_ceilings through the tuner's
harness: both timing modes, the L2 flushed before each sample, the faster of a memcpy and an
elementwise copy). Beside it, timed by triton.testing.do_bench (median, L2 flushed before each
call): torch's own `dst.copy_(src)` of the same size (bytes read + written), and `torch.mm` and
`F.linear` (the probe's layout) of the probe's n x n bf16 matrices (2 n^3 FLOPs), the faster of the
two counting. Each is timed twice: over 5 ms of back-to-back calls (a burst, as the tune's samples
run, the probe's and the tuned kernels' alike) and over 200 ms (sustained). A matmul's rate falls
with the length of the run: on an H100, do_bench of this one gave 780 TFLOP/s over 5 ms, 717 over
20 to 200 ms and 679 over 1 s, as the 700 W power limit would make it (docs/benchmark-log.md
§23). The probe is checked against the burst; the sustained rate is printed beside it. The rounds
alternate, so clock and power drift fall on both alike. A ceiling further than 5% from the plain
figure (issue 58's bar) puts roofline fractions off by as much: below it, fractions past 1.0;
above it, fractions too low. Every tune on a GPU makes the burst check once beside its probe
(lzsolve.measure.tasks.plain_ceilings, stated in report.md); this script repeats it over rounds
and adds the sustained rates.

    python benchmarks/ceilings.py --json ceilings.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics

import torch

from lzsolve.measure.harness import make_harness
from lzsolve.measure.tasks import (
    PLAIN_BURST_MS,
    PLAIN_FORMS,
    CeilingTask,
    ceiling_sizes,
    free_memory,
    plain_rates,
    run_ceilings,
)
from lzsolve.store.perfdb import PLAIN_MODE
from runtime_loader.hardware import hardware_signature, slug

ROUNDS = 3
BAR = 0.05


RUNS_MS = {"burst": PLAIN_BURST_MS, "sustained": 200}  # how long do_bench runs each plain form back to back


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every round's figures here")
    args = parser.parse_args()
    device = torch.device("cuda")
    harness = make_harness(device)
    n, copy_bytes = ceiling_sizes(device.type, harness.cache_bytes, free_memory(device))
    if copy_bytes is None:
        raise SystemExit("no copy past 8x the L2 fits in a quarter of the free memory: no memory ceiling to check")
    probe_rounds, plain_rounds, probes = [], [], {}
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    src = torch.randn(copy_bytes // 2, device=device, dtype=torch.bfloat16)
    plain_tensors = (a, b, src, torch.empty_like(src))
    for _ in range(ROUNDS):
        result = run_ceilings(CeilingTask("bf16"), device, harness)
        if "ceilings" not in result:
            raise SystemExit(f"the probe failed: {result}")
        probed = [row for row in result["ceilings"] if row["mode"] != PLAIN_MODE]  # the tune's own check, redone here
        probe_rounds.append({(row["kind"], row["mode"]): row["per_s"] for row in probed})
        probes.update({f"{row['kind']} {row['mode']}": row["probe"] for row in probed})
        timed = plain_rates(*plain_tensors, tuple(RUNS_MS.values()))
        plain_rounds.append({run: timed[ms] for run, ms in RUNS_MS.items()})
    rows = []
    for kind, mode in sorted(probe_rounds[0]):
        probe = statistics.median(r[kind, mode] for r in probe_rounds)
        forms = {form: statistics.median(r["burst"][form] for r in plain_rounds) for form in PLAIN_FORMS[kind]}
        plain = max(forms.values())
        sustained = max(statistics.median(r["sustained"][form] for r in plain_rounds) for form in PLAIN_FORMS[kind])
        rows.append({"kind": kind, "mode": mode, "probe": probes[f"{kind} {mode}"], "probe_per_s": probe,
                     "plain_per_s": plain, "plain_forms": forms, "sustained_per_s": sustained,
                     "ratio": probe / plain, "within_bar": abs(probe / plain - 1) <= BAR})
    unit = {"compute": ("TFLOP/s", 1e12), "memory": ("TB/s", 1e12)}
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}; matmul n={n}, copy "
          f"{copy_bytes >> 20} MiB x 2, {ROUNDS} rounds (medians)")
    print(f"{'ceiling':16} {'probe':>10} {'plain':>10} {'probe/plain':>12} {'sustained':>10}  probe; plain forms (burst)")
    for row in rows:
        name, scale = unit[row["kind"]]
        forms = ", ".join(f"{form} {rate / scale:.1f}" for form, rate in row["plain_forms"].items())
        print(f"{row['kind'] + ' ' + row['mode']:16} {row['probe_per_s'] / scale:10.1f} {row['plain_per_s'] / scale:10.1f} "
              f"{row['ratio']:12.3f} {row['sustained_per_s'] / scale:10.1f}  {row['probe']} ({name}); {forms}"
              f"{'' if row['within_bar'] else '  OUTSIDE 5%'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": dt.datetime.now(dt.timezone.utc).isoformat(), "device": torch.cuda.get_device_name(device),
                       "hardware": slug(hardware_signature(device)), "torch": torch.__version__, "n": n,
                       "copy_bytes": copy_bytes, "rows": rows,
                       "rounds": {"probe": [{f"{k} {m}": v for (k, m), v in r.items()} for r in probe_rounds],
                                  "plain": plain_rounds}}, f, indent=1)


if __name__ == "__main__":
    main()

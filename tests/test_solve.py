"""The tree solver: regret-minimising splits, noise-aware leaves, admissibility."""
import json
import math

from lzsolve.solve import candidates_summary, solve_signature
from runtime_loader.table import Leaf, Split, choose


def records(times: dict[str, dict[int, float]], spread=0.01):
    out = []
    for kernel, per_point in times.items():
        for tokens, ms in per_point.items():
            ok = ms is not None
            out.append({"kernel_id": kernel, "dims": json.dumps({"tokens": tokens}), "status": "ok" if ok else "rejected",
                        "eager_ms": ms, "eager_spread": spread, "reason_code": None if ok else "PARITY_FAILED",
                        "reason_message": None if ok else "bad"})
    return out


def solve(times, spread=0.01):
    return solve_signature(records(times, spread), ("tokens",), "fb", "eager")


def chosen(tree, tokens):
    def to_nodes(n):
        return Leaf(n["kernel_id"]) if "kernel_id" in n else Split(n["dim"], n["threshold"], to_nodes(n["le"]), to_nodes(n["gt"]))
    return choose(to_nodes(tree), {"tokens": tokens})


def test_single_best_kernel_makes_one_leaf():
    s = solve({"fb": {1: 2.0, 16: 4.0, 256: 8.0}, "fast": {1: 1.0, 16: 2.0, 256: 4.0}})
    assert s["tree"]["kernel_id"] == "fast" and s["tree"]["gain"] == 2.0 and s["grid_regret"] == 0


def test_crossover_gets_a_split_at_the_geometric_midpoint():
    s = solve({"fb": {1: 1.0, 16: 1.0, 256: 10.0, 4096: 100.0},
               "small": {1: 0.5, 16: 0.5, 256: 20.0, 4096: 200.0},
               "large": {1: 2.0, 16: 2.0, 256: 5.0, 4096: 50.0}})
    tree = s["tree"]
    assert tree["dim"] == "tokens" and math.isclose(tree["threshold"], 64.0)
    assert [chosen(tree, t) for t in (1, 16, 63, 65, 256, 100000)] == ["small"] * 3 + ["large"] * 3


def test_win_within_noise_keeps_the_fallback():
    s = solve({"fb": {1: 1.00, 16: 1.00}, "other": {1: 0.99, 16: 0.99}}, spread=0.05)
    assert s["tree"]["kernel_id"] == "fb"
    assert solve({"fb": {1: 1.0, 16: 1.0}, "other": {1: 0.5, 16: 0.5}}, spread=0.05)["tree"]["kernel_id"] == "other"


def test_a_kernel_rejected_at_a_point_is_never_chosen_there():
    s = solve({"fb": {1: 1.0, 16: 1.0, 256: 1.0}, "fast": {1: 0.1, 16: None, 256: 0.1}})
    assert chosen(s["tree"], 16) == "fb"
    for t in (1, 256):
        assert chosen(s["tree"], t) == "fast"


def test_no_measurements_means_fallback():
    s = solve({"fb": {1: None}})
    assert s["tree"] == {"kernel_id": "fb", "points": 0}


def test_candidates_summary_counts_reasons():
    summary = candidates_summary(records({"fb": {1: 1.0, 2: 1.0}, "bad": {1: None, 2: None}}), "eager")
    assert summary["fb"] == {"admitted": 2, "rejected": []}
    assert summary["bad"]["rejected"] == [{"code": "PARITY_FAILED", "count": 2, "message": "bad"}]


def test_graph_mode_skips_kernels_without_graph_timing():
    recs = records({"fb": {1: 2.0, 16: 2.0}, "fast": {1: 1.0, 16: 1.0}})
    for r in recs:
        r["graph_ms"] = r["eager_ms"] if r["kernel_id"] == "fb" else None
        r["graph_spread"] = 0.01
        r["graph_error"] = None if r["kernel_id"] == "fb" else "operation not permitted when stream is capturing"
    assert solve_signature(recs, ("tokens",), "fb", "eager")["tree"]["kernel_id"] == "fast"
    assert solve_signature(recs, ("tokens",), "fb", "graph")["tree"]["kernel_id"] == "fb"
    summary = candidates_summary(recs, "graph")
    assert summary["fast"]["rejected"][0]["code"] == "CUDA_GRAPH_UNSAFE"
    assert "capturing" in summary["fast"]["rejected"][0]["message"]

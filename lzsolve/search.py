"""Configuration search for tunable kernels (our Triton kernels), with optuna.

Per op signature, shape bucket and tunable family, a TPE study proposes
configurations from the family's space (`search_spaces/<kernel>.yaml`). Each
trial is a configuration id (`triton.rms_norm[block=4096,warps=8]`) run through
the same runner as every other candidate: parity gate first (a config that fails
to compile or disagrees with the reference is pruned, its Reason kept on the
trial), then timing alone. Studies live in one SQLite file beside the PerfDB, so
a re-run continues each study instead of restarting it.

The winners of a signature's buckets then join that signature's candidates at
every bucket, timed interleaved with the rest: the solver sees each searched
configuration across the whole grid, next to its family's default.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from runtime_loader import registry
from runtime_loader.specs import config_id

from .errors import LzError
from .measure import ParityTask, TimingTask
from .perfdb import dims_key
from .tuner import Candidate, Plan, Runner, SignaturePlan, fresh_seeds

SPACES_DIR = Path(__file__).resolve().parents[1] / "search_spaces"
STORAGE_NAME = "search.sqlite3"


@dataclass(frozen=True)
class SearchSpace:
    kernel: str  # the family's base id
    trials: int  # trials per signature and bucket
    params: dict[str, tuple[int, ...]]  # values searched, per parameter, in the family's order


def load_space(path: Path) -> SearchSpace:
    """Parse and check one YAML space against its family: the file may narrow what the kernel
    accepts, never widen it."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise LzError(f"{path}: cannot read search space ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not {"kernel", "trials", "params"} <= set(raw):
        raise LzError(f"{path}: a search space needs 'kernel', 'trials' and 'params'")
    family = registry.TUNABLES.get(raw["kernel"])
    if family is None:
        raise LzError(f"{path}: {raw['kernel']!r} is not a tunable kernel; known: {', '.join(registry.TUNABLES)}")
    params = raw["params"]
    if not isinstance(params, dict) or list(params) != list(family.params):
        raise LzError(f"{path}: params must be {list(family.params)} in that order")
    for name, values in params.items():
        if not isinstance(values, list) or not values or any(v not in family.params[name] for v in values):
            raise LzError(f"{path}: {name} must be a list of values from {list(family.params[name])}")
    missing = {k: v for k, v in family.default.items() if v not in params[k]}
    if missing:  # every study starts from the default, the baseline its winners must beat
        raise LzError(f"{path}: the space must contain the default configuration; add {missing}")
    trials = raw["trials"]
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise LzError(f"{path}: trials must be a positive integer")
    return SearchSpace(raw["kernel"], trials, {k: tuple(v) for k, v in params.items()})


def load_spaces(folder: Path = SPACES_DIR) -> dict[str, SearchSpace]:
    return {space.kernel: space for space in map(load_space, sorted(folder.glob("*.yaml")))}


def study_name(sp: SignaturePlan, dims: dict, kernel: str, hw_slug: str, mode: str) -> str:
    return f"{sp.instance.signature}|{dims_key(dims)}|{kernel}|{hw_slug}|{mode}"


class Objective:
    """One trial: build the configuration's id, gate it, time it alone."""

    def __init__(self, sp: SignaturePlan, dims: dict, space: SearchSpace, runner: Runner, mode: str, seeds):
        self.sp, self.dims, self.space, self.runner, self.mode, self.seeds = sp, dims, space, runner, mode, seeds

    def __call__(self, trial) -> float:
        import optuna

        config = {name: trial.suggest_categorical(name, list(values)) for name, values in self.space.params.items()}
        kernel_id = config_id(self.space.kernel, config)
        sig, seed = self.sp.instance.signature, next(self.seeds)
        trial.set_user_attr("kernel_id", kernel_id)
        outcome = self.runner.run(ParityTask(sig, kernel_id, self.dims, seed))
        if not outcome.get("reason_code"):
            outcome = self.runner.run(TimingTask(sig, (kernel_id,), self.dims, seed))
            outcome = outcome.get("per_kernel", {}).get(kernel_id, outcome)
        time_ms = outcome.get(f"{self.mode}_ms")
        if outcome.get("reason_code") or time_ms is None:
            trial.set_user_attr("reason", f"{outcome.get('reason_code')}: {outcome.get('reason_message')}")
            raise optuna.TrialPruned()
        return time_ms


def search(plan: Plan, spaces: dict[str, SearchSpace], runner: Runner, storage: Path, mode: str, hw_slug: str,
           trials: int | None = None, on_trial: Callable[[str], None] = lambda label: None) -> Plan:
    """Run (or continue) every study of the plan; returns the plan with each signature's searched
    winners added as candidates. `trials` overrides the spaces' own budgets."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    state = optuna.trial.TrialState
    finished_states = (state.COMPLETE, state.PRUNED, state.FAIL)  # not an enqueued trial, nor one killed mid-run
    url = f"sqlite:///{storage}"
    seeds = fresh_seeds()
    signatures = []
    for sp in plan.signatures:
        winners: dict[str, Candidate] = {}
        for cand in sp.candidates:
            space = spaces.get(cand.spec.kernel_id)
            if space is None or not cand.admitted:
                continue
            default = registry.TUNABLES[space.kernel].default
            for dims in sp.workloads:
                study = optuna.create_study(
                    study_name=study_name(sp, dims, space.kernel, hw_slug, mode), storage=url, load_if_exists=True,
                    direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))
                if not study.trials:  # the default configuration is the baseline every search starts from
                    study.enqueue_trial(default)
                budget = trials if trials is not None else space.trials
                remaining = budget - len(study.get_trials(deepcopy=False, states=finished_states))
                if remaining > 0:
                    study.optimize(Objective(sp, dims, space, runner, mode, seeds), n_trials=remaining,
                                   callbacks=[lambda s, t: on_trial(f"{sp.instance.signature.op} "
                                                                    f"{t.user_attrs.get('kernel_id', '')}")])
                best = best_config(study)
                if best is not None and best != default:
                    spec = registry.get(config_id(space.kernel, best))
                    winners[spec.kernel_id] = Candidate(spec, ())
        added = tuple(c for k, c in sorted(winners.items()) if k not in {c.spec.kernel_id for c in sp.candidates})
        signatures.append(dataclasses.replace(sp, candidates=sp.candidates + added))
    return dataclasses.replace(plan, signatures=tuple(signatures))


def best_config(study) -> dict[str, int] | None:
    """The fastest completed trial's configuration (None when every trial was pruned)."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return dict(min(done, key=lambda t: t.value).params) if done else None


def planned_trials(plan: Plan, spaces: dict[str, SearchSpace], trials: int | None) -> int:
    """Upper bound of the trials `search` runs (a continued study runs fewer)."""
    return sum(len(sp.workloads) * (trials if trials is not None else spaces[c.spec.kernel_id].trials)
               for sp in plan.signatures for c in sp.candidates if c.admitted and c.spec.kernel_id in spaces)

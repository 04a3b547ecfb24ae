"""Configuration search for tunable kernels (our Triton kernels), with optuna.

Per op signature, shape bucket and tunable family, a TPE study proposes
configurations from the family's space (`search_spaces/<kernel>.yaml`). Each
trial is a configuration id (`triton.rms_norm[block=4096,warps=8]`) run through
the same runner as every other candidate: parity gate first (a config that fails
to compile or disagrees with the reference is pruned, its Reason kept on the
trial), then timing alone. Studies live in one journal file beside the PerfDB
(optuna's JournalStorage: one JSON line per operation), so a re-run continues each
study instead of restarting it.

The winners of a signature's buckets then join that signature's candidates at
every bucket, timed interleaved with the rest: the solver sees each searched
configuration across the whole grid, next to its family's default.

On several devices (`tune --devices`, `--ray`) each (signature, family) search, all of its
buckets, goes to the next free device, the largest first but each family's largest before any
family's second (devices.groups_apart): its buckets seed each other in order, and a study's
trials are compared on one GPU. A device with no search left to begin takes the next buckets of
one in progress (BucketSearch).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from lzsolve.errors import STORAGE_ERRNOS, LzError, WriteError
from lzsolve.measure.devices import groups_apart, run_sharded
from lzsolve.measure.tasks import ParityTask, TimingTask
from lzsolve.measure.tuner import Candidate, Plan, Runner, SignaturePlan, fresh_seeds
from lzsolve.store.perfdb import dims_key
from runtime_loader import registry, safeio
from runtime_loader.specs import config_id

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"  # the repository's, beside lzsolve/
STORAGE_NAME = "search.journal"


@dataclass(frozen=True)
class SearchSpace:
    kernel: str  # the family's base id
    trials: int  # trials per signature and bucket
    params: dict[str, tuple[int, ...]]  # values searched, per parameter, in the family's order
    starts: tuple[dict, ...] = ()  # configurations every study tries right after the default


MAX_SPACE_BYTES = 64 << 10  # a search space is a few hundred bytes (the largest here: 1.2 KB)
# [ and { nested deeper than this are refused before YAML reads them: PyYAML took 0.8-1.0 s to refuse
# 64 KiB of [ (the blind audit of issue 55); a space's lists are one level deep
MAX_FLOW_DEPTH = 16


def flow_depth(text: str) -> int:
    """How deep a YAML text's flow collections ([ and {) nest, at most: counted, not parsed."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def load_space(path: Path) -> SearchSpace:
    """Parse and check one YAML space against its family: the file may narrow what the kernel
    accepts, never widen it. Read as the artifact's files are (safeio): a regular file within
    MAX_SPACE_BYTES, opened without blocking (a FIFO named *.yaml would hang the tune, a link to
    /dev/zero fill its memory)."""
    data = safeio.read_regular(path, MAX_SPACE_BYTES, LzError, what=f"search space {path}")
    try:
        text = data.decode("utf-8")
        if flow_depth(text) > MAX_FLOW_DEPTH:
            raise LzError(f"{path}: lists or mappings nested deeper than {MAX_FLOW_DEPTH}; a search space "
                          "lists each parameter's values, one level deep")
        raw = yaml.safe_load(text)
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as e:
        raise LzError(f"{path}: cannot read search space ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
    if not isinstance(raw, dict) or not {"kernel", "trials", "params"} <= set(raw):
        raise LzError(f"{path}: a search space needs 'kernel', 'trials' and 'params'")
    family = registry.TUNABLES.get(raw["kernel"]) if isinstance(raw["kernel"], str) else None
    if family is None:
        raise LzError(f"{path}: {safeio.shown(raw['kernel'])} is not a tunable kernel; known: {', '.join(registry.TUNABLES)}")
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
    starts = raw.get("starts") or []
    if not isinstance(starts, list) or not all(
            isinstance(c, dict) and set(c) == set(params) and all(c[k] in params[k] for k in c) for c in starts):
        raise LzError(f"{path}: starts must be a list of configurations, each a value from the space for every "
                      f"parameter ({', '.join(params)})")
    return SearchSpace(raw["kernel"], trials, {k: tuple(v) for k, v in params.items()},
                       tuple({k: c[k] for k in params} for c in starts))


def load_spaces(folder: Path = SPACES_DIR) -> dict[str, SearchSpace]:
    return {space.kernel: space for space in map(load_space, sorted(folder.glob("*.yaml")))}


def study_name(sp: SignaturePlan, dims: dict, space: SearchSpace, hw_slug: str, mode: str) -> str:
    """One study per signature, bucket, space, kernel version, hardware and mode: what decides its
    trials' times, and nothing of the model or artifact that asked, so that the measurement cache's
    journal serves any later tune of the same signature and bucket. The space's values are part of
    the name: optuna cannot continue a study whose parameters took other values (a space edited
    since, a family with a new parameter), so a changed space starts a study of its own; so does a
    changed kernel (its source or Triton's version), whose earlier trials timed other code."""
    values = hashlib.sha256(json.dumps(space.params, sort_keys=True).encode()).hexdigest()[:8]
    version = registry.TUNABLES[space.kernel].spec.version()
    return f"{sp.instance.signature}|{dims_key(dims)}|{space.kernel}@{version}:{values}|{hw_slug}|{mode}"


class Objective:
    """One trial: build the configuration's id, gate it, time it alone."""

    def __init__(self, sp: SignaturePlan, dims: dict, space: SearchSpace, runner: Runner, mode: str, seeds):
        self.sp, self.dims, self.space, self.runner, self.mode, self.seeds = sp, dims, space, runner, mode, seeds
        # whether a trial's host time tells anything: on a CPU it is all of the time, by construction
        self.host_told = mode == "eager" and getattr(getattr(runner, "device", None), "type", None) == "cuda"

    def __call__(self, trial) -> float:
        import optuna

        config = {name: trial.suggest_categorical(name, list(values)) for name, values in self.space.params.items()}
        kernel_id = config_id(self.space.kernel, config)
        sig, seed = self.sp.instance.signature, next(self.seeds)
        trial.set_user_attr("kernel_id", kernel_id)
        outcome = self.runner.run(ParityTask(sig, kernel_id, self.dims, seed))
        if not outcome.get("reason_code"):
            # the study's mode alone, as every phase times the table's: a second mode doubled each trial
            outcome = self.runner.run(TimingTask(sig, (kernel_id,), self.dims, seed, (self.mode,)))
            outcome = outcome.get("per_kernel", {}).get(kernel_id, outcome)
        time_ms = outcome.get(f"{self.mode}_ms")
        if outcome.get("reason_code") or time_ms is None:
            trial.set_user_attr("reason", f"{outcome.get('reason_code')}: {outcome.get('reason_message')}")
            raise optuna.TrialPruned()
        if self.host_told and outcome.get("host_ms") is not None:
            trial.set_user_attr("host_ms", outcome["host_ms"])
        return time_ms


NOISE = 0.02  # a trial faster than the study's best by less than this is no improvement


def waited_on_host(trial, noise: float = NOISE) -> bool:
    """A finished eager trial on a GPU that took its host's time: every configuration of a family is
    launched the same way, through the same adapter, so where one waits on the host none can gain
    more than `noise` in eager mode. On an H100 host Triton's RMSNorm was so at 1 to 500 tokens, its
    RMSNorm + add, RoPE and SwiGLU at 1 and 8 (host time 0.98 of the eager time: 9 of a cold
    workload tune's 54 studies, benchmarks/runs/2026-12-06-e.txt)."""
    import optuna

    host = trial.user_attrs.get("host_ms")
    return (trial.state == optuna.trial.TrialState.COMPLETE and host is not None
            and host >= trial.value * (1 - noise))


@dataclass(frozen=True)
class SearchBudget:
    """How a study spends its trials beyond the space's budget, the upper bound. Patience is on by
    default: on the H100 the default llama3-70b TP8 tune ran 446 of its 1664 budgeted trials (156 s,
    where the whole budget took 644 s), its decisions on random shapes no worse (benchmarks/device.sh decisions). Skipping
    stays opt-in (`--skip-behind 0.3`): it skipped no bucket there, and its comparisons cost time."""
    patience: int = 4  # stop after this many finished trials without a gain beyond NOISE, or after a
    # host-bound one (waited_on_host) (0: never)
    skip_behind: float = 0.0  # skip a bucket where the family trails the best kernel by more at every neighbour (0: never)
    seed_neighbours: bool = True  # enqueue the winners of the buckets searched nearby first
    # after a study, up to this many more trials climbing from its best one parameter step at a time
    # (0: off; opt-in until a GPU tune shows it pays: issue 15's vLLM tiles were two such steps away)
    refine: int = 0


FULL_BUDGET = SearchBudget(patience=0, skip_behind=0.0, seed_neighbours=False)
SMART_BUDGET = SearchBudget(patience=4, skip_behind=0.3)  # every saving on: what the tests check against the full search
STOP_REASONS = ("budget", "patience", "host-bound", "skipped")


@dataclass
class SearchStats:
    """What the search spent (`tune --json` and report.md)."""
    budgeted: int = 0  # the spaces' budgets over every study of the plan
    run: int = 0  # trials run by this run (a continued study counts only its new ones)
    refined: int = 0  # of which hill-climbing steps (SearchBudget.refine)
    stopped: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(STOP_REASONS, 0))

    def add(self, other: SearchStats) -> None:
        self.budgeted, self.run, self.refined = (self.budgeted + other.budgeted, self.run + other.run,
                                                 self.refined + other.refined)
        for reason, n in other.stopped.items():
            self.stopped[reason] += n

    def as_dict(self) -> dict:
        return {"trials_budgeted": self.budgeted, "trials_run": self.run, "trials_refining": self.refined,
                "studies_stopped_by": dict(self.stopped)}

    def line(self) -> str:
        why = ", ".join(f"{n} by {reason}" for reason, n in self.stopped.items() if n)
        refined = f" ({self.refined} of them hill-climbing)" if self.refined else ""
        return f"{self.run} of {self.budgeted} budgeted trials run{refined}; studies stopped: {why or 'none'}"


def grid_index(points: list[dict]) -> list[tuple[int, ...]]:
    """Each point's position on the grid: per dim, the index of its value among the grid's values."""
    values = {d: sorted({p[d] for p in points}) for d in points[0]} if points else {}
    return [tuple(values[d].index(p[d]) for d in values) for p in points]


def bucket_order(points: list[dict]) -> list[int]:
    """A checkerboard: the cells whose indices sum to an even number first, then the odd ones, each
    of whose grid neighbours (one step along one dim) is then already searched."""
    index = grid_index(points)
    return sorted(range(len(points)), key=lambda i: (sum(index[i]) % 2, i))


def near(points: list[dict], i: int, steps: int) -> list[int]:
    """The points within `steps` grid steps of point i (i itself excluded)."""
    index = grid_index(points)
    return [j for j, at in enumerate(index) if 0 < sum(abs(a - b) for a, b in zip(at, index[i])) <= steps]


def one_steps(config: dict, params: dict[str, list]) -> list[dict]:
    """The configurations one step away: one parameter moved to the next value of its list, down
    or up (the space's lists are ordered: block sizes, warps, stages)."""
    steps = []
    for name, values in params.items():
        at = values.index(config[name])
        steps += [{**config, name: values[j]} for j in (at - 1, at + 1) if 0 <= j < len(values)]
    return steps


def stale_trials(trials, noise: float = NOISE) -> int:
    """Finished trials since the last one that beat the best before it by more than `noise`
    (a pruned or failed trial brings nothing)."""
    import optuna

    best, since = math.inf, 0
    for t in trials:
        done = t.state == optuna.trial.TrialState.COMPLETE
        since = 0 if done and t.value < best * (1 - noise) else since + 1
        best = min(best, t.value) if done else best
    return since


class BucketSearch:
    """The studies of one signature and tunable family, bucket by bucket in `bucket_order`. Several
    devices may work on it at once (devices.run_sharded's `joinable`): each takes the next bucket
    not yet taken, with its own runner, and adds what it spent to its own stats; a bucket seeds
    from and compares with the neighbours done by then, whichever device did them."""

    def __init__(self, n: int, sp: SignaturePlan, space: SearchSpace, trials: int, storage, mode: str, hw_slug: str,
                 budget: SearchBudget, seeds, on_trial: Callable[[str], None]):
        self.n, self.sp, self.space, self.trials, self.storage = n, sp, space, trials, storage
        self.mode, self.hw_slug, self.budget, self.seeds, self.on_trial = mode, hw_slug, budget, seeds, on_trial
        self.default = registry.TUNABLES[space.kernel].default
        self.points = list(sp.workloads)
        self.winners: dict[int, dict] = {}  # bucket -> its best configuration
        self.behind: dict[int, float] = {}  # bucket -> the family's best time / the best other kernel's
        self._left = collections.deque(bucket_order(self.points))  # buckets no device has taken
        self._lock = threading.Lock()

    def left(self) -> bool:
        return bool(self._left)

    def _take(self) -> int | None:
        with self._lock:
            return self._left.popleft() if self._left else None

    def run(self, runner: Runner, stats: SearchStats) -> None:
        """Search the buckets left, one after another, until another device or this one took all."""
        while (i := self._take()) is not None:
            stats.budgeted += self.trials
            if self.cannot_win(i):
                stats.stopped["skipped"] += 1
                continue
            best = self.study(i, runner, stats)
            if best is not None:
                self.winners[i] = best
                if self.budget.skip_behind > 0:
                    self.compare(i, best, runner)

    def found(self) -> list[dict]:
        """Every bucket's winning configuration but the family's default."""
        return [best for best in self.winners.values() if best != self.default]

    def cannot_win(self, i: int) -> bool:
        """More than skip_behind behind the best kernel at every neighbour, and it has two or more."""
        if self.budget.skip_behind <= 0:
            return False
        around = near(self.points, i, 1)
        return len(around) >= 2 and all(self.behind.get(j, 0.0) > 1 + self.budget.skip_behind for j in around)

    def study(self, i: int, runner: Runner, stats: SearchStats) -> dict | None:
        import optuna

        dims, sig = self.points[i], self.sp.instance.signature
        study = optuna.create_study(
            study_name=study_name(self.sp, dims, self.space, self.hw_slug, self.mode), storage=self.storage,
            load_if_exists=True, direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))
        if not study.trials:  # the default configuration is the baseline every search starts from
            study.enqueue_trial(self.default)
            for config in self.space.starts:  # tiles known to do well somewhere: cheaper than finding them
                study.enqueue_trial(config, skip_if_exists=True)
            for config in self.neighbour_winners(i):
                study.enqueue_trial(config, skip_if_exists=True)
        state = optuna.trial.TrialState
        finished = study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED, state.FAIL))
        patience, trials = self.budget.patience, self.trials

        def after_trial(s, t) -> None:
            stats.run += 1
            self.on_trial(f"{sig.op} {t.user_attrs.get('kernel_id', '')}")
            if patience and waited_on_host(t):
                s.stop()
            elif patience and stale_trials(s.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED,
                                                                                state.FAIL))) >= patience:
                s.stop()

        objective = Objective(self.sp, dims, self.space, runner, self.mode, self.seeds)
        if patience and any(map(waited_on_host, finished)):
            stats.stopped["host-bound"] += 1
        elif patience and stale_trials(finished) >= patience:
            stats.stopped["patience"] += 1
        elif trials - len(finished) > 0:
            before = stats.run
            study.optimize(objective, n_trials=trials - len(finished), callbacks=[after_trial])
            ran = len(finished) + stats.run - before
            why = ("host-bound" if patience and any(map(waited_on_host, study.get_trials(deepcopy=False)))
                   else "budget" if ran >= trials else "patience")
            stats.stopped[why] += 1
        else:
            stats.stopped["budget"] += 1
        if self.budget.refine:
            self.climb(study, objective, after_trial, stats)
        return best_config(study)

    def climb(self, study, objective, after_trial, stats: SearchStats) -> None:
        """From the study's best, every one-step neighbour not tried yet; again from a better best,
        until a round gains no more than NOISE or budget.refine trials are spent. TPE samples the
        space at large and can stop one step short of a better tile (a block_k, a stage count)."""
        import optuna

        spent = 0
        while spent < self.budget.refine:
            done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
            if not done:
                return
            best = min(done, key=lambda t: t.value)
            tried = {tuple(sorted(t.params.items())) for t in study.trials}
            steps = [c for c in one_steps(best.params, self.space.params) if tuple(sorted(c.items())) not in tried]
            steps = steps[:self.budget.refine - spent]
            if not steps:
                return
            for config in steps:
                study.enqueue_trial(config)
            before = stats.run
            study.optimize(objective, n_trials=len(steps), callbacks=[after_trial])
            spent += len(steps)
            stats.refined += stats.run - before
            better = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
                      and t.value < best.value * (1 - NOISE)]
            if not better:
                return

    def neighbour_winners(self, i: int) -> list[dict]:
        if not self.budget.seed_neighbours:
            return []
        found = [self.winners[j] for j in near(self.points, i, 2) if j in self.winners]
        return [c for n, c in enumerate(found) if c != self.default and c not in found[:n]]

    def compare(self, i: int, best: dict, runner: Runner) -> None:
        """Time the bucket's winner interleaved with the other admitted kernels that pass parity:
        how far behind the best of them the family is there, for `cannot_win` at its neighbours."""
        dims, sig, seed = self.points[i], self.sp.instance.signature, next(self.seeds)
        family = {self.space.kernel} | {c.spec.kernel_id for c in self.sp.candidates
                                        if c.spec.kernel_id.startswith(self.space.kernel + "[")}
        others = [c.spec.kernel_id for c in self.sp.candidates if c.admitted and c.spec.kernel_id not in family]
        others = [k for k in others if not runner.run(ParityTask(sig, k, dims, seed)).get("reason_code")]
        if not others:
            return
        ours = config_id(self.space.kernel, best)
        timing = runner.run(TimingTask(sig, (ours, *others), dims, seed, (self.mode,))).get("per_kernel", {})
        times = {k: timing.get(k, {}).get(f"{self.mode}_ms") for k in (ours, *others)}
        best_other = min((t for k, t in times.items() if k != ours and t is not None), default=None)
        if times[ours] is not None and best_other:
            self.behind[i] = times[ours] / best_other


def search(plan: Plan, spaces: dict[str, SearchSpace], runners: Sequence[Runner], storage: Path, mode: str,
           hw_slug: str, trials: int | None = None, on_trial: Callable[[str], None] = lambda label: None,
           budget: SearchBudget = SearchBudget()) -> tuple[Plan, SearchStats]:
    """Run (or continue) every study of the plan; returns the plan with each signature's searched
    winners added as candidates, and what the search spent. `trials` overrides the spaces' own
    budgets; `budget` says when a study stops before them. With several runners (one per device),
    each (signature, family) search goes to the next free one (devices.groups_apart's order), and a
    runner with none left to begin helps with one in progress."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    # one storage for every thread (each device's lane): JournalStorage holds a threading.Lock
    # around each of its methods (a line's append, the replay of new lines, the reads)
    db = open_storage(storage)
    seeds = fresh_seeds()  # itertools.count: next() is atomic under the GIL
    searches = [BucketSearch(n, plan.signatures[n], space, budgeted, db, mode, hw_slug, budget, seeds, on_trial)
                for n, space, budgeted in search_units(plan, spaces, trials)]

    def run(runner: Runner, searched: BucketSearch) -> list[SearchStats]:
        stats = SearchStats()
        searched.run(runner, stats)
        return [stats]

    try:
        done = run_sharded(searches, runners, run, group=lambda searched: searched.space.kernel,
                           joinable=BucketSearch.left)
    except Exception as e:
        failed = write_error_in(e)
        if failed is None or failed is e:
            raise
        raise failed from None
    stats, winners = SearchStats(), [dict() for _ in plan.signatures]
    for part in done:
        stats.add(part)
    for searched in searches:
        for best in searched.found():
            kernel_id = config_id(searched.space.kernel, best)
            winners[searched.n][kernel_id] = Candidate(registry.get(kernel_id), ())
    signatures = []
    for sp, found in zip(plan.signatures, winners):
        known = {c.spec.kernel_id for c in sp.candidates}
        signatures.append(dataclasses.replace(sp, candidates=sp.candidates + tuple(
            c for k, c in sorted(found.items()) if k not in known)))
    return dataclasses.replace(plan, signatures=tuple(signatures)), stats


def open_storage(path: Path):
    """The studies' journal at `path`: optuna's JournalStorage over a JournalFileBackend with its
    default lock (`<path>.lock`, a symlink) against other processes. A read or write that fails
    as storage does (a full disk, an I/O error) raises WriteError naming the journal."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    @contextlib.contextmanager
    def journal_io():
        try:
            yield
        except OSError as e:  # a full disk: ENOSPC from the write's flush (after the bytes that fit) or fsync
            if e.errno not in STORAGE_ERRNOS:
                raise
            raise WriteError(path, e) from e

    class Journal(JournalFileBackend):
        def append_logs(self, logs) -> None:
            with journal_io():
                super().append_logs(logs)

        def read_logs(self, log_number_from: int):
            with journal_io():
                yield from super().read_logs(log_number_from)

    lock = JournalFileSymlinkLock(str(path))
    with journal_io():
        backend = Journal(str(path), lock_obj=lock)
        drop_partial_line(path, lock)
        return optuna.storages.JournalStorage(backend)


def drop_partial_line(path: Path, lock) -> None:
    """Cut the journal back to its last whole line. A write cut short (a full disk writes the
    bytes that fit, then fails; a kill) leaves a last line without its newline, which optuna skips
    when it reads but appends the next operation to: the joined line then fails to parse at every
    later read, and no re-run could continue. The cut operation was never applied by anyone."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
    lock.acquire()  # no writer is half way through a line while optuna's lock is held
    try:
        with open(path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            while end > 0:
                start = max(0, end - (1 << 16))
                f.seek(start)
                at = f.read(end - start).rfind(b"\n")
                if at >= 0:
                    f.truncate(start + at + 1)
                    return
                end = start
            f.truncate(0)
    finally:
        lock.release()


def write_error_in(e: BaseException | None) -> WriteError | None:
    """The WriteError behind `e`, if any. A journal write that fails while optuna ends a trial
    surfaces as optuna's own error with ours as its context: optuna 5.0's _run_trial raises
    AssertionError("Should not reach.") from its `finally` when the trial's state went unwritten."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, WriteError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def search_units(plan: Plan, spaces: dict[str, SearchSpace], trials: int | None) -> list[tuple[int, SearchSpace, int]]:
    """Every (signature index, space, trial budget) to search, in the order devices take them: the
    largest (buckets x trials) first, but each family's largest before any family's second, since
    the searches of one family (five linears) compile the same configurations."""
    units = [(n, space, trials if trials is not None else space.trials)
             for n, sp in enumerate(plan.signatures) for cand in sp.candidates
             if cand.admitted and (space := spaces.get(cand.spec.kernel_id)) is not None]
    return groups_apart(units, lambda u: len(plan.signatures[u[0]].workloads) * u[2], lambda u: u[1].kernel)


def best_config(study) -> dict[str, int] | None:
    """The fastest completed trial's configuration (None when every trial was pruned)."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return dict(min(done, key=lambda t: t.value).params) if done else None


def planned_trials(plan: Plan, spaces: dict[str, SearchSpace], trials: int | None) -> int:
    """Upper bound of the trials `search` runs (a continued study runs fewer)."""
    return sum(len(sp.workloads) * (trials if trials is not None else spaces[c.spec.kernel_id].trials)
               for sp in plan.signatures for c in sp.candidates if c.admitted and c.spec.kernel_id in spaces)

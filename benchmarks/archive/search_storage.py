"""What optuna's study storage costs the tune's parent process per trial (benchmark log §15.11):
72 studies of 6 TPE trials each over a Triton-linear-like space, with the instant objective and
the get_trials call per trial that lzsolve.measure.search's callback makes, in SQLite (the storage
before), optuna's journal file (lzsolve.measure.search.STORAGE_NAME now) and memory (the floor).

    python benchmarks/archive/search_storage.py [sqlite|journal|memory ...]
"""
from __future__ import annotations

import logging
import random
import sys
import tempfile
import time
from pathlib import Path

import optuna

PARAMS = {"block_m": [16, 32, 64, 128], "block_n": [32, 64, 128, 256], "block_k": [32, 64, 128], "warps": [4, 8],
          "stages": [2, 3, 4], "split_k": [1, 2, 4, 8]}


def storage(kind: str, folder: Path):
    if kind == "sqlite":
        return optuna.storages.RDBStorage(f"sqlite:///{folder / 'studies.sqlite3'}")
    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend
        return optuna.storages.JournalStorage(JournalFileBackend(str(folder / "studies.journal")))
    return optuna.storages.InMemoryStorage()


def per_trial_ms(kind: str, studies: int = 72, trials: int = 6) -> float:
    state = optuna.trial.TrialState
    ran = 0

    def objective(trial) -> float:
        config = {k: trial.suggest_categorical(k, v) for k, v in PARAMS.items()}
        trial.set_user_attr("kernel_id", str(config))
        return random.random()

    def after_trial(study, trial) -> None:
        nonlocal ran
        ran += 1
        study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED, state.FAIL))

    with tempfile.TemporaryDirectory() as folder:
        db = storage(kind, Path(folder))
        started = time.perf_counter()
        for n in range(studies):
            study = optuna.create_study(study_name=f"s{n}", storage=db, load_if_exists=True, direction="minimize",
                                        sampler=optuna.samplers.TPESampler(seed=0))
            study.enqueue_trial({k: v[0] for k, v in PARAMS.items()})
            study.optimize(objective, n_trials=trials, callbacks=[after_trial])
        return 1e3 * (time.perf_counter() - started) / ran


def main() -> None:
    optuna.logging.set_verbosity(logging.WARNING)
    for kind in sys.argv[1:] or ["sqlite", "journal", "memory"]:
        print(f"{kind:<8} {per_trial_ms(kind):6.1f} ms a trial")


if __name__ == "__main__":
    main()

"""Profile an lzsolve command in this process with cProfile: the stats to DIR/profile.prof and the
heaviest functions (cumulative, then own time) to DIR/profile.txt.

    python benchmarks/profile_command.py --profile-dir DIR tune --workload W --mode eager --quick --no-isolate

`python -m cProfile -m lzsolve` writes nothing: the command ends with os._exit (lzsolve.cli.run).
With --no-isolate the measuring worker's work is in the profile too; the builders, the primer and
the Inductor warmer are processes of their own either way."""
import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

from lzsolve.cli import main


def profiled(argv: list[str], out: Path) -> None:
    sys.argv = ["lzsolve", *argv]
    profile = cProfile.Profile()
    profile.enable()
    try:
        main()
    except SystemExit:
        pass
    profile.disable()
    out.mkdir(parents=True, exist_ok=True)
    profile.dump_stats(out / "profile.prof")
    with open(out / "profile.txt", "w") as f:
        stats = pstats.Stats(profile, stream=f)
        stats.sort_stats("cumulative").print_stats(150)
        stats.sort_stats("tottime").print_stats(70)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile-dir", type=Path, required=True, help="folder for profile.prof and profile.txt")
    args, command = parser.parse_known_args()
    profiled(command, args.profile_dir)
    sys.stdout.flush()
    os._exit(0)

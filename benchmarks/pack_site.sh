#!/usr/bin/env bash
# Pack the Python packages the GPU machine lacks into .devsite/site.tar.xz (git-ignored), for
# `carry`: wheels for CPython 3.12 x86-64, unpacked, xz-compressed (about 36 MB: fa3-fwd's
# 105 MB library and duckdb's 68 MB one do not fit the 64 MiB carry limit as wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(mktemp -d) site=$(mktemp -d)
target=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${target[@]}" -d "$wheels" \
  duckdb==2.0.0 optuna==5.0.0 alembic sqlalchemy mako greenlet colorlog \
  flashinfer-python==0.5.3 apache-tvm-ffi==0.1.15.post2 liger-kernel==0.8.5 fa3-fwd==0.0.3 \
  fla-core==0.6.0 einops helion==1.4.0 filecheck
# helion 1.4.0: 1.5's import needs torch 2.12's IntelGPUError (the GPU image has torch 2.11: its import
# failed there, benchmarks/runs/2026-12-07-b.txt); 1.4.0's torch imports resolve in 2.11's sources
# the wheels are for the GPU machine's Python, not this one's: install them as that platform's
python3 -m pip install -q --no-deps --no-compile "${target[@]}" --target "$site" "$wheels"/*.whl
mkdir -p .devsite && tar -C "$site" -cf - . | xz -T2 -6 > .devsite/site.tar.xz
ls -la .devsite/site.tar.xz

#!/usr/bin/env bash
# FlashAttention-4 and QuACK for the GPU machine (issue 58), in two parts: their wheels for CPython
# 3.12 x86-64 come to about 102 MB, 92 MB of it NVIDIA's CuTe DSL CUDA 13 libraries, over the 64 MiB
# one device call carries. The wheels, as one tar, are cut into .cute/a and .cute/b (git-ignored),
# about 51 MB each; the machine keeps /tmp between two calls while it stays warm (about 30 s):
#   call 1, carry .cute/a:  bash benchmarks/device.sh cute stage   (parks the first part in /tmp)
#   call 2, carry .cute/b:  bash benchmarks/device.sh cute run     (installs, then parity and timings)
# The image has what these wheels need beside them (cuda-bindings, protobuf, einops, torch).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(mktemp -d)
python3 -m pip download -q --no-deps --pre --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$wheels" \
  flash-attn-4==4.0.0b40 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5
rm -rf .cute && mkdir -p .cute/a .cute/b
tar -C "$wheels" -cf .cute/wheels.tar .
(cd .cute && split -n 2 -d wheels.tar wheels.tar. && sha256sum wheels.tar > b/wheels.tar.sha256 && rm wheels.tar)
mv .cute/wheels.tar.00 .cute/a/ && mv .cute/wheels.tar.01 .cute/b/
rm -rf "$wheels"
du -sh .cute/a .cute/b

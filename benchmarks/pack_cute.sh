#!/usr/bin/env bash
# NVIDIA's CuTe DSL kernels for the GPU machine (issue 58): FlashAttention-4 and QuACK, and with
# --flashinfer FlashInfer 0.7.4 beside them (with its own dependencies; its norms are CuTe DSL kernels).
# Their wheels for CPython 3.12 x86-64 come to about 102 MB (92 MB of it the CuTe DSL's CUDA 13
# libraries), 219 MB with FlashInfer's, over the 64 MiB one device call carries: the wheels, as one
# tar, are cut into parts of at most 56 MiB, .cute/a, .cute/b, ... (git-ignored), the last holding the
# tar's checksum and the number of parts. The machine keeps /tmp between calls while it stays warm
# (about 30 s), so each part goes in a call of its own, one right after the other:
#   carry .cute/a:  bash benchmarks/device.sh cute stage   (parks the part in /tmp/cute-parts)
#   carry .cute/b:  ... stage, and so on; with the last:  bash benchmarks/device.sh cute run
# (installs, then parity and timings; a `setup` call with .devsite before them adds FA3, FlashInfer
# 0.5.3, Liger... to compare with). FlashInfer 0.7.4 installs into a folder of its own, /tmp/cute/fi,
# which `cute run` puts on PYTHONPATH only for the commands that ask for it (FLASHINFER_07).
# The image has what these wheels need beside them (cuda-bindings, cuda-core, protobuf, einops, torch,
# NCCL); not FlashInfer's nccl-extensions (22.6 MB), which only its expert-parallel package imports.
set -euo pipefail
cd "$(dirname "$0")/.."
part_mb=56  # MiB: a call carries 64 MiB with the working tree (about 3 MiB)
wheels=$(mktemp -d)
download() {
  python3 -m pip download -q --no-deps --pre --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "${@:2}"
}
download "$wheels" flash-attn-4==4.0.0b40 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 \
  nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
  apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
if [ "${1:-}" = --flashinfer ]; then
  mkdir -p "$wheels/fi"
  download "$wheels/fi" flashinfer-python==0.7.4 nvidia-cudnn-frontend==1.32.0 cuda-tile==1.7.0 nccl4py==0.6.0 \
    cuda-python==13.4.4
fi
rm -rf .cute && mkdir -p .cute
tar -C "$wheels" -cf .cute/wheels.tar .
(cd .cute && split -b ${part_mb}M -d -a 2 wheels.tar wheels.tar. && sha256sum wheels.tar > wheels.tar.sha256 && rm wheels.tar)
parts=(.cute/wheels.tar.[0-9][0-9])
letters=(a b c d e f g h)
for i in "${!parts[@]}"; do mkdir -p ".cute/${letters[$i]}" && mv "${parts[$i]}" ".cute/${letters[$i]}/"; done
last=".cute/${letters[$(( ${#parts[@]} - 1 ))]}"
mv .cute/wheels.tar.sha256 "$last/" && echo "${#parts[@]}" > "$last/wheels.tar.parts"
rm -rf "$wheels"
du -sh .cute/?

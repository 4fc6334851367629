#!/usr/bin/env bash
# The GPU check on a machine with an NVIDIA GPU and no internet, from the working tree and the folder
# benchmarks/gpu_check_bundle.sh made (the pinned sdist and wheels). Under ten minutes on one GPU
# with 16 cores: llama.cpp built for that GPU's architecture only (or QUANTLOAD_LLAMA_BIN reused),
# the tiny model and a random ~1B one written, served, loaded and measured; every assertion and
# figure in gpu-check-*.json (and .md) under OUT (default WORK). Exit 0 all held, 1 one failed,
# 2 no GPU here (one line).
#
#   bash benchmarks/gpu_telemetry_check.sh [gpu_check.py options]
#   BUNDLE=.gpu-check-bundle WORK=/tmp/quantload-gpu-check OUT=$OUT PY=python3 ...
#
# Where nvcc's toolkit lacks cuBLAS (a toolkit assembled from pip wheels) and Python's nvidia-cublas
# has it, a toolkit with both is put together under WORK (links only), and libcuda.so is linked
# to the driver's libcuda.so.1 there, so CMake finds all three.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${BUNDLE:-.gpu-check-bundle}"
WORK="${WORK:-/tmp/quantload-gpu-check}"
PY="${PY:-python3}"
[ -d "$BUNDLE/wheels" ] || { echo "gpu check: no bundle at $BUNDLE (make it with benchmarks/gpu_check_bundle.sh)"; exit 2; }
mkdir -p "$WORK"
"$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
  --root-user-action=ignore --target "$WORK/site" "$BUNDLE"/wheels/*.whl
export PYTHONPATH="$PWD/src:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export QUANTLOAD_TOOLCHAIN__SDIST_DIR="$PWD/$BUNDLE" PIP_NO_INDEX=1  # the sdist from the bundle; no index

nvcc_path="${CUDACXX:-$(command -v nvcc || true)}"
if [ -n "$nvcc_path" ] && [ -z "${QUANTLOAD_LLAMA_BIN:-}" ]; then
  root=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
  cublas=$("$PY" -c "import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))" 2>/dev/null || true)
  driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  if [ ! -f "$root/include/cublas_v2.h" ] && [ -n "$cublas" ] && [ -f "$cublas/include/cublas_v2.h" ]; then
    merged="$WORK/cuda"
    rm -rf "$merged" && mkdir -p "$merged/lib64/stubs"
    for entry in "$root"/*; do [ "$(basename "$entry")" = lib64 ] || ln -s "$entry" "$merged/"; done
    rm -f "$merged/include" && mkdir "$merged/include" && ln -s "$root"/include/* "$cublas"/include/* "$merged/include/" 2>/dev/null || true
    ln -s "$root"/lib64/* "$cublas"/lib/* "$merged/lib64/" 2>/dev/null || true
    for lib in "$merged"/lib64/libcublas*.so.*; do ln -sf "$lib" "${lib%%.so.*}.so"; done
    [ -n "$driver" ] && ln -sf "$driver" "$merged/lib64/stubs/libcuda.so"
    export CUDACXX="$merged/bin/nvcc"
    echo "gpu check: CUDA toolkit $root with cuBLAS from $cublas, put together in $merged"
  fi
fi
exec "$PY" benchmarks/gpu_check.py --work "$WORK" --out "${OUT:-$WORK}" "$@"

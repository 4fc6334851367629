#!/bin/sh
# The compose `prepare` job (installed in the image as quantload-prepare):
#   1. F16, Q8_0 and Q4_K_M files of $QL_MODEL in /models (the `models` volume), with manifest.json;
#   2. links named by quantization (/models/Q4_K_M.gguf, ...) that the llama-server services load;
#   3. perplexity and llama-bench speed of each file into the run folder /results/$QL_RUN.
# Running it again reuses the model files the manifest vouches for. Compose runs it again before
# every `docker compose run` of a job that depends on the servers (the load job), so step 3 is
# skipped when the run folder already holds quality and speed of these very files (the same
# manifest); QL_REMEASURE=1 measures them again.
# Steps 1 and 2 must succeed; a failed step 3 is reported and the job still succeeds.
# QL_MEASURE=0 stops after step 2 (the Kubernetes servers' init container, deploy/kubernetes/).
set -eu

models="${QL_MODELS_DIR:-/models}"
run_dir="${QL_RESULTS_DIR:-/results}/${QL_RUN:-compose}"

quantload prepare --model "${QL_MODEL:-smollm2-135m}" --out "$models"

# The file names depend on the model; the servers need fixed ones. Relative links, so they resolve
# in every container that mounts the volume.
python - "$models" <<'PY'
import json
import os
import sys

folder = sys.argv[1]
with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as handle:
    files = json.load(handle)["files"]
for quant, entry in files.items():
    link = os.path.join(folder, f"{quant}.gguf")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(entry["file"], link)
    print(f"{link} -> {entry['file']}")
PY
if [ "${QL_MEASURE:-1}" = 0 ]; then
  echo "prepared: $models (QL_MEASURE=0: quality and speed left to the prepare job)"
  exit 0
fi
mkdir -p "$run_dir/logs"
if [ "${QL_REMEASURE:-0}" != 1 ] && cmp -s "$models/manifest.json" "$run_dir/manifest.json" \
    && [ -s "$run_dir/quality.json" ] && [ -s "$run_dir/speed.json" ]; then
  echo "prepare: $run_dir already has quality and speed of these files: kept (QL_REMEASURE=1 measures again)"
  echo "prepared: $models, results in $run_dir"
  exit 0
fi
cp "$models/manifest.json" "$run_dir/manifest.json"

# Quality and speed are worth having but not worth the servers: as in native mode, a failure here
# (e.g. no network for WikiText-2) is said and the stack still starts; the report marks it missing.
for step in quality speed; do
  if ! quantload "$step" "$models/F16.gguf" "$models/Q8_0.gguf" "$models/Q4_K_M.gguf" \
      --out "$run_dir/$step.json"; then
    echo "prepare: $step failed for some or all files (see the errors above; llama.cpp's logs in $run_dir/logs); the servers start anyway" >&2
  fi
done
echo "prepared: $models, results in $run_dir"

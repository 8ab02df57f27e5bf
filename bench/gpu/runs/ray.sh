#!/usr/bin/env bash
# On the GPU machine, after setup.sh and with the Ray wheel's parts in /tmp/m (issue #6):
# `bass up` on a local Ray with the given placement, the demo request through it, Ray's view of
# where each actor runs; then the same request through the plain local launcher (`bass serve`).
# Usage: ray.sh NAME NUM_GPUS TARGET_GPUS DRAFT_GPUS     ray.sh one-gpu 1 0.5 0.5 | STREAM=6 ray.sh two-gpus 2 1 1
set -uo pipefail
name=$1 num_gpus=$2 target_gpus=$3 draft_gpus=$4
source "$(dirname "$0")/serve.sh"
R=$PWD
cd /tmp
whl=/tmp/wh/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
if [ ! -d /tmp/site/ray ]; then
  mkdir -p /tmp/wh && cat /tmp/m/ray-2.60.0-*.whl.part.* > $whl
  echo "b951b40965947a63615830916be04f26440d234de1e9a29dbf2155d03fa9ad2a  $whl" | sha256sum -c - || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $whl || exit 1
fi
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
M=/tmp/models
# A draft with a GPU of its own must not be co-located (the default puts it in the target's
# process, on the target's GPU, whatever draft_gpus says); STREAM=K turns on streamed speculation.
colocate=true; [ "$num_gpus" -ge 2 ] && colocate=false
cat > /tmp/ray-$name.toml <<EOT
colocate = $colocate
[target]
model_dir = "$M/qwen2.5-coder-1.5b-instruct"
device = "cuda"
dtype = "bfloat16"
[draft]
model_dir = "$M/qwen2.5-coder-0.5b-instruct"
device = "cuda"
dtype = "bfloat16"
[ray]
strategy = "PACK"
target_gpus = $target_gpus
draft_gpus = $draft_gpus
[coordinator.scheduler.draft_stream]
block = ${STREAM:-0}
EOT
timeout 240 python3 -m bass.cli up --config /tmp/ray-$name.toml --num-gpus $num_gpus 2>&1 | tee $OUT/ray-$name-up.log
python3 - <<EOT | tee $OUT/ray-$name-placement.json
import json, ray
from bass.deploy import launcher
launcher.connect(None, "bass")
print(json.dumps({"cluster_resources": ray.cluster_resources(), "placements": launcher.placements("bass")}, indent=2))
EOT
timeout 120 python3 $R/bench/gpu/runs/demo_request.py --address 127.0.0.1:50051 --label "bass up ($name)" \
  --out $OUT/demo-ray-$name.json > /dev/null 2> $OUT/demo-ray-$name.err
python3 -m bass.cli down --stop-ray
[ "${SKIP_SERVE:-}" ] && exit 0
start_serve $OUT/serve-$name.log || exit 1
timeout 120 python3 $R/bench/gpu/runs/demo_request.py --address 127.0.0.1:50051 --label "bass serve" \
  --out $OUT/demo-serve-$name.json > /dev/null 2> $OUT/demo-serve-$name.err
kill -INT $serve; wait $serve
grep -h median_ms -B3 $OUT/demo-*.json

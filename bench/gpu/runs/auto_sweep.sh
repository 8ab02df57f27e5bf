#!/usr/bin/env bash
# On the GPU machine, after setup.sh: where `auto` stands against fixed draft lengths over batch
# sizes, for the baseline build (.whlbase/, auto only) and the current one (regular, k = 3, k = 4,
# auto), both sampling modes, one call. With .whlalt/ (a variant's wheel, same generated code as
# the current build), its auto too (ALT_COMMIT names it). Usage: auto_sweep.sh [BATCHES] [POLICIES]
# MODES picks the sampling modes (default both); EXTRA passes more `bass bench speed` arguments
# (e.g. --trace; builds older than 3908ab5 reject it).
set -uo pipefail
R=$PWD
batches=${1:-1,2,4,8,16,32,64} policies=${2:-0,3,4,auto}
source $R/bench/gpu/setup/base_site.sh
builds="base new"
if [ -d .whlalt ]; then
  builds="base new alt"
  if [ ! -d /tmp/site-alt ]; then
    cp -r /tmp/site /tmp/site-alt
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-alt .whlalt/bass_serving-*.whl
  fi
fi
cd /tmp
export PYTHONUNBUFFERED=1
for mode in ${MODES:-greedy t0.8-p0.95}; do
  for build in $builds; do
    site=/tmp/site commit=${BASS_COMMIT:-} pols=$policies
    [ $build = base ] && site=/tmp/site-base commit=${BASE_COMMIT:-} pols=auto
    [ $build = alt ] && site=/tmp/site-alt commit=${ALT_COMMIT:-alt} pols=auto
    BASS_COMMIT=$commit PYTHONPATH=$site timeout ${LIMIT_S:-200} python3 -m bass.cli bench speed \
      --target /tmp/models/qwen2.5-coder-1.5b-instruct --draft /tmp/models/qwen2.5-coder-0.5b-instruct \
      --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 \
      --batches $batches --policies $pols --mode $mode ${EXTRA:-} --out $OUT/auto-sweep-$mode-$build.json \
      > /dev/null 2>> $OUT/auto-sweep.log  # one log: the device tool brings back only a few files
  done
done
python3 - "$OUT" <<'PY'
import json, os, sys
for mode in ("greedy", "t0.8-p0.95"):
    rows = {}
    if not any(os.path.exists(f"{sys.argv[1]}/auto-sweep-{mode}-{b}.json") for b in ("base", "new")):
        continue
    for build in ("base", "new", "alt"):
        try:
            for r in json.load(open(f"{sys.argv[1]}/auto-sweep-{mode}-{build}.json"))["results"]:
                rows.setdefault(r["batch"], {})[f"{r['policy']}-{build}" if r["policy"] == "auto" else r["policy"]] = r["ms_per_token_per_sequence"]
        except (OSError, ValueError) as exc:
            if build != "alt":
                print(mode, build, "no results:", exc)
    for batch, row in sorted(rows.items()):
        fixed = [v for k, v in row.items() if not k.startswith("auto")]
        best = min(fixed) if fixed else float("nan")
        print(mode, "batch", batch, row, "auto-new / best fixed %.3f" % (row.get("auto-new", float("nan")) / best),
              "auto-alt / best %.3f" % (row.get("auto-alt", float("nan")) / best))
PY

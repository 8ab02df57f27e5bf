#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the same `bass bench speed` runs for a baseline build and
# the current one, back to back in one call, so a change is compared with its baseline on the
# same machine. The baseline site is /tmp/site-base (prepared by this script from .whlbase/:
# the baseline commit's wheel and its generated bass/v1). Usage:
#   compare_speed.sh MODE BATCHES POLICIES [--services]   (e.g. t0.8-p0.95 1,8,64 0,4,auto)
# Extra arguments go to `bass bench speed` (a later --problems overrides 0:16); TAG names the files;
# WARM=0 skips the untimed warm-up process per build (warm_kernels.sh).
set -uo pipefail
R=$PWD
mode=$1 batches=$2 policies=$3; shift 3
source $R/bench/gpu/setup/base_site.sh
cd /tmp
export PYTHONUNBUFFERED=1
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
# WARM=1 (default): an untimed process per build first fills Triton's cache (warm_kernels.sh).
if [ "${WARM:-1}" = 1 ]; then
  for build in ${ORDER:-base new}; do
    site=/tmp/site; [ $build = base ] && site=/tmp/site-base
    bash $R/bench/gpu/runs/warm_kernels.sh $mode $site
  done
fi
for build in ${ORDER:-base new}; do  # ORDER="new base": the other way round (drift)
  site=/tmp/site commit=${BASS_COMMIT:-}; [ $build = base ] && site=/tmp/site-base commit=${BASE_COMMIT:-}
  BASS_COMMIT=$commit PYTHONPATH=$site timeout ${LIMIT_S:-170} python3 -m bass.cli bench speed --target $T --draft $D --device cuda \
    --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 \
    --batches $batches --policies $policies --mode $mode "$@" --out $OUT/speed-$mode${TAG:-}-$build.json \
    > /dev/null 2> $OUT/speed-$mode${TAG:-}-$build.log
done
python3 - "$OUT" "$mode${TAG:-}" <<'PY'
import json, sys
out, mode = sys.argv[1:]
rows = {b: {(r["batch"], r["policy"]): r for r in json.load(open(f"{out}/speed-{mode}-{b}.json"))["results"]}
        for b in ("base", "new")}
for key in rows["new"]:
    base, new = rows["base"].get(key), rows["new"][key]
    print(mode, "batch", key[0], "policy", key[1], "ms/token/seq base",
          base and base["ms_per_token_per_sequence"], "new", new["ms_per_token_per_sequence"],
          "acceptance base", base and base["acceptance_rate"], "new", new["acceptance_rate"])
PY

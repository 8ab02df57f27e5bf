#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the same `bass bench speed` runs for a baseline build and
# the current one, back to back in one call, so a change is compared with its baseline on the
# same machine. The baseline site is /tmp/site-base (prepared by this script from .whlbase/:
# the baseline commit's wheel and its generated bass/v1). Usage:
#   compare_speed.sh MODE BATCHES POLICIES [--services]   (e.g. t0.8-p0.95 1,8,64 0,4,auto)
# Extra arguments go to `bass bench speed` (a later --problems overrides 0:16); TAG names the files;
# WARM=0 skips the untimed warm-up process per build (warm_kernels.sh).
# PROCESSES=N (default 1): N processes per build, alternated (ORDER, then the other way round, and
# so on), summarized by each cell's median over them: `auto`'s path (which lengths it tries first,
# what those steps happened to yield) moves a cell by 5-15% between processes of one build
# (bench/results/journal/2026-11-28-h200-yield-tails.md), which one process per build cannot tell
# from a change. With N > 1 the JSON and logs come back as one archive, speed-MODE[TAG].tar.gz
# (a call returns at most 8 files): the JSON inside as BUILD-pI.json.
# TARGET, DRAFT, DEVICE, DTYPE and PYTHON override the defaults (a CPU smoke test, with /tmp/site
# an empty folder and /tmp/site-base made by base_site.sh from .whlbase/: tiny models, DEVICE=cpu
# DTYPE=float32 PYTHON=.venv/bin/python WARM=0).
set -uo pipefail
R=$PWD
mode=$1 batches=$2 policies=$3; shift 3
source $R/bench/gpu/setup/base_site.sh
cd /tmp
export PYTHONUNBUFFERED=1
T=${TARGET:-/tmp/models/qwen2.5-coder-1.5b-instruct}
D=${DRAFT:-/tmp/models/qwen2.5-coder-0.5b-instruct}
PY=${PYTHON:-python3}
# WARM=1 (default): an untimed process per build first fills Triton's cache (warm_kernels.sh).
if [ "${WARM:-1}" = 1 ]; then
  for build in ${ORDER:-base new}; do
    site=/tmp/site; [ $build = base ] && site=/tmp/site-base
    bash $R/bench/gpu/runs/warm_kernels.sh $mode $site
  done
fi
order=(${ORDER:-base new})  # ORDER="new base": the other way round (drift)
processes=${PROCESSES:-1}
dir=$OUT
[ "$processes" -gt 1 ] && dir=/tmp/compare-speed-$mode${TAG:-} && rm -rf $dir && mkdir -p $dir
for ((i = 1; i <= processes; i++)); do
  builds=("${order[@]}")
  (( i % 2 == 0 )) && builds=("${order[1]}" "${order[0]}")
  for build in "${builds[@]}"; do
    site=/tmp/site commit=${BASS_COMMIT:-}; [ $build = base ] && site=/tmp/site-base commit=${BASE_COMMIT:-}
    name=speed-$mode${TAG:-}-$build; [ "$processes" -gt 1 ] && name=$build-p$i
    BASS_COMMIT=$commit PYTHONPATH=$site timeout ${LIMIT_S:-170} $PY -m bass.cli bench speed --target $T --draft $D \
      --device ${DEVICE:-cuda} --dtype ${DTYPE:-bfloat16} --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 \
      --batches $batches --policies $policies --mode $mode "$@" --out $dir/$name.json \
      > /dev/null 2> $dir/$name.log
  done
done
$PY - "$dir" "$mode${TAG:-}" "$processes" <<'PY'
import json, statistics, sys
from pathlib import Path
folder, mode, processes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def files(build):
    if processes == 1:
        return [folder / f"speed-{mode}-{build}.json"]
    return [folder / f"{build}-p{i}.json" for i in range(1, processes + 1)]

def cells(build):
    out = {}
    for f in files(build):
        if not f.exists():  # a process that failed or ran out of time: its log says why
            continue
        for r in json.load(open(f))["results"]:
            out.setdefault((r["batch"], r["policy"]), []).append(r)
    return out

rows = {b: cells(b) for b in ("base", "new")}
for key, new in rows["new"].items():
    base = rows["base"].get(key, [])
    ms = {b: [r["ms_per_token_per_sequence"] for r in runs] for b, runs in (("base", base), ("new", new))}
    if processes == 1:
        print(mode, "batch", key[0], "policy", key[1], "ms/token/seq base", ms["base"][0] if base else None,
              "new", ms["new"][0], "acceptance base", base[0]["acceptance_rate"] if base else None,
              "new", new[0]["acceptance_rate"])
        continue
    med = {b: statistics.median(v) if v else None for b, v in ms.items()}
    ratio = f"{med['new'] / med['base']:.3f}" if med["base"] else "-"
    print(mode, "batch", key[0], "policy", key[1], "ms/token/seq median base", med["base"], "new", med["new"],
          "new/base", ratio, "| base", ms["base"], "new", ms["new"])
PY
if [ "$processes" -gt 1 ]; then
  tar czf $OUT/speed-$mode${TAG:-}.tar.gz -C $dir .
fi

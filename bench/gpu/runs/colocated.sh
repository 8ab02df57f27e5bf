#!/usr/bin/env bash
# On the GPU machine, after setup.sh: issue #13's comparison for one build (/tmp/site), in one
# call: the same `bass bench speed` in-process, through the services with the draft in the
# target's process (`bass serve`'s default: one Speculate call a step), and with the draft in a
# process of its own (two calls a step). Usage:
#   colocated.sh MODE BATCHES POLICIES   (e.g. greedy 1,8,64 0,3,auto)
# WAYS picks and orders the runs (default "inproc colocated separate"); LIMIT_S bounds each; TAG
# names the files (e.g. -mps).
set -uo pipefail
mode=$1 batches=$2 policies=$3; shift 3
cd /tmp
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
T=/tmp/models/qwen2.5-coder-1.5b-instruct
D=/tmp/models/qwen2.5-coder-0.5b-instruct
for way in ${WAYS:-inproc colocated separate}; do
  case $way in
    inproc) flags=() ;;
    colocated) flags=(--services) ;;
    separate) flags=(--services --separate-draft) ;;
  esac
  BASS_COMMIT=${BASS_COMMIT:-} timeout ${LIMIT_S:-200} python3 -m bass.cli bench speed --target $T --draft $D \
    --device cuda --dtype bfloat16 --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 \
    --batches $batches --policies $policies --mode $mode "${flags[@]}" "$@" \
    --out $OUT/speed-$mode${TAG:-}-$way.json > /dev/null 2> $OUT/speed-$mode${TAG:-}-$way.log
done
python3 - "$OUT" "$mode${TAG:-}" ${WAYS:-inproc colocated separate} <<'PY'
import json, os, sys
out, mode, *ways = sys.argv[1:]
rows = {}
for way in ways:
    path = f"{out}/speed-{mode}-{way}.json"
    if os.path.exists(path):
        rows[way] = {(r["batch"], r["policy"]): r for r in json.load(open(path))["results"]}
keys = sorted({k for r in rows.values() for k in r}, key=lambda k: (k[0], k[1]))
for key in keys:
    cells = []
    for way in ways:
        r = rows.get(way, {}).get(key)
        cells.append(f"{way} {r['ms_per_token_per_sequence']:.3f}" if r else f"{way} -")
    base = rows.get("inproc", {}).get(key)
    ratios = [f"{w}/inproc {rows[w][key]['ms_per_token_per_sequence'] / base['ms_per_token_per_sequence']:.3f}"
              for w in ways if w != "inproc" and base and key in rows.get(w, {})]
    print(mode, "batch", key[0], "policy", key[1], "ms/token/seq:", ", ".join(cells), "|", ", ".join(ratios))
PY

#!/usr/bin/env bash
# On the GPU machine, after setup.sh: one build, one of the coordinator's tuning constants
# changed in the benchmark's own process (where the scheduler and its policy run, in-process and
# with --services alike), against the constant as shipped: `bass bench speed` for each, in both
# orders (base first, then new first: the first process of a call tends to run slow), and the
# medians side by side. Saves building and carrying a second wheel for a candidate constant.
# Usage:
#   constant_ab.sh "MODULE.NAME=VALUE [MODULE.NAME=VALUE...]" MODE BATCHES POLICIES [bench speed args...]
#   e.g. constant_ab.sh draft_length.SEQUENCE_PRIOR_STEPS=8 greedy 2,4,8,16 0,3,auto --services
#        constant_ab.sh "draft_length.SEQUENCE_PRIOR_STEPS=8 draft_length.SHORTER_TRUSTED_MAX_BATCH=64" t0.8-p0.95 2,4,8 0,2,auto
# (MODULE is under bass.coordinator, or a whole dotted path from `bass.` for a constant elsewhere,
# e.g. bass.target_service.worker.ROW_BUCKETS=(17,): that one reaches the target worker only
# in-process, without --services, whose workers are processes of their own; VALUE a Python literal
# without spaces; several settings, space-separated, change together.) OUT: where the JSON goes;
# TAG names it.
# TARGET, DRAFT, DEVICE, DTYPE and PYTHON override the defaults (a CPU smoke test: tiny models,
# DEVICE=cpu DTYPE=float32 PYTHON=.venv/bin/python).
set -uo pipefail
setting=$1 mode=$2 batches=$3 policies=$4; shift 4
patch_new=""
for one in $setting; do
  path=${one%%=*} value=${one#*=}
  module=${path%.*} name=${path##*.}
  [ "${module#bass.}" = "$module" ] && module=bass.coordinator.$module
  patch_new+="import $module as m; assert hasattr(m, '$name'), '$one'; m.$name = $value; "
done
patch_new=${patch_new%; }
cd /tmp
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-/tmp/site}
T=${TARGET:-/tmp/models/qwen2.5-coder-1.5b-instruct}
D=${DRAFT:-/tmp/models/qwen2.5-coder-0.5b-instruct}
PY=${PYTHON:-python3}
run() {  # run BUILD ORDER [bench speed args...]: BUILD new patches the constant, base leaves it
  local build=$1 order=$2 patch="pass"
  shift 2
  [ $build = new ] && patch="$patch_new"
  timeout ${LIMIT_S:-200} $PY -c "$patch; from bass.cli import main; main()" bench speed --target $T --draft $D \
    --device ${DEVICE:-cuda} --dtype ${DTYPE:-bfloat16} --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 \
    --batches $batches --policies $policies --mode $mode "$@" \
    --out $OUT/speed-$mode${TAG:-}-$order-$build.json > /dev/null 2> $OUT/speed-$mode${TAG:-}-$order-$build.log
}
run base bn "$@"; run new bn "$@"; run new nb "$@"; run base nb "$@"
$PY - "$OUT" "$mode${TAG:-}" "$setting" <<'PY'
import json, statistics, sys
out, mode, setting = sys.argv[1:]
cells = {}
for order in ("bn", "nb"):
    for build in ("base", "new"):
        for r in json.load(open(f"{out}/speed-{mode}-{order}-{build}.json"))["results"]:
            cells.setdefault((r["batch"], r["policy"]), {}).setdefault(build, []).append(r["ms_per_token_per_sequence"])
print(f"{mode}: {setting} (new) against as shipped (base), ms/token/seq per order (bn; nb)")
for (batch, policy), v in sorted(cells.items()):
    base, new = v.get("base", []), v.get("new", [])
    print(f"  batch {batch} policy {policy}: base {' / '.join(f'{x:.3f}' for x in base)}, "
          f"new {' / '.join(f'{x:.3f}' for x in new)}, new/base {statistics.fmean(new) / statistics.fmean(base):.3f}")
PY

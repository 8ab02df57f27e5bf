#!/usr/bin/env bash
# On the GPU machine, after setup.sh: the real pair through `bass bench speed` (in-process) with the
# int8 draft's fused layers (kernels/triton_draft_layer.py) on, as shipped ("new"), and turned off
# in the benchmark's process ("base": every Transformer built with fused_draft_layers = False),
# in both orders (the first process of a call tends to run slow), medians side by side.
# Usage: draft_layers_ab.sh MODE BATCHES POLICIES [bench speed args...]
#   e.g. draft_layers_ab.sh greedy 1,8,16,64 0,3,auto
# OUT: where the JSON goes. TARGET, DRAFT override the models.
set -uo pipefail
mode=$1 batches=$2 policies=$3; shift 3
cd /tmp
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-/tmp/site}
T=${TARGET:-/tmp/models/qwen2.5-coder-1.5b-instruct}
D=${DRAFT:-/tmp/models/qwen2.5-coder-0.5b-instruct}
unfuse="import bass.engine.model as m; init = m.Transformer.__init__
def off(self, *a, **k):
    init(self, *a, **k); self.fused_draft_layers = False
m.Transformer.__init__ = off"
run() {  # run BUILD ORDER
  local patch="pass"
  [ $1 = base ] && patch="$unfuse"
  timeout ${LIMIT_S:-240} python3 -c "$patch
from bass.cli import main; main()" bench speed --target $T --draft $D --device cuda --dtype bfloat16 \
    --max-seq-len 1024 --max-new-tokens 128 --problems 0:16 --peak-tflops 989 --batches $batches \
    --policies $policies --mode $mode --repeats ${REPEATS:-3} "${@:3}" \
    --out $OUT/speed-$mode-$2-$1.json > /dev/null 2> $OUT/speed-$mode-$2-$1.log
}
run base bn "$@"; run new bn "$@"; run new nb "$@"; run base nb "$@"
python3 - "$OUT" "$mode" <<'PY'
import json, statistics, sys
out, mode = sys.argv[1:]
cells = {}
for order in ("bn", "nb"):
    for build in ("base", "new"):
        try:
            results = json.load(open(f"{out}/speed-{mode}-{order}-{build}.json"))["results"]
        except (OSError, ValueError) as exc:
            print(f"{order}-{build}: no results ({exc})")
            continue
        for r in results:
            cells.setdefault((r["batch"], str(r["policy"])), {}).setdefault(build, []).append(
                (r["ms_per_token_per_sequence"], r.get("outputs_digest_per_round")))
print(f"{mode}: fused draft layers (new) against unfused (base), ms/token/seq per order (bn; nb)")
for (batch, policy), v in sorted(cells.items()):
    base, new = [x for x, _ in v.get("base", [])], [x for x, _ in v.get("new", [])]
    same = len({str(d) for _, d in v.get("base", []) + v.get("new", [])}) == 1
    ratio = statistics.fmean(new) / statistics.fmean(base) if base and new else float("nan")
    print(f"  batch {batch} policy {policy}: base {' / '.join(f'{x:.3f}' for x in base)}, new "
          f"{' / '.join(f'{x:.3f}' for x in new)}, new/base {ratio:.3f}, same text: {same}")
PY

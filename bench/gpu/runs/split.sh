#!/usr/bin/env bash
# On a machine with two GPUs, after setup.sh (issue #36): what a second GPU gives one request of
# several sequences, and a few requests at once, through the public API.
#   one: `bass serve` (the one-GPU default: the draft in the target's process, `auto`), GPU 0;
#   two: `bass serve --replicas 2` (a replica a GPU, the router in front, splitting a request of
#        n >= 2 sequences over both: router.split_min_sequences).
# Each runs the same loads (`bass bench serve`, HumanEval prompts PROBLEMS, 128 new tokens, the
# README bench's length), each load twice (a warm-up round and the measured one):
#   c1-n1   greedy, one request at a time, one sequence (the router's hop only);
#   c1-n8   T = 0.8, top-p 0.95, seeded: one request at a time of 8 sequences (split 4 + 4);
#   c1-n16  the same with 16 sequences (8 + 8; a coordinator takes n <= 16, max_n);
#   c8-n1   greedy, 8 requests at once of one sequence (spread by load, not split);
#   c16-n1, c64-n1  greedy, 16 and 64 at once.
# Then the same seeded request of n = 8 to each server, unary and streamed: where each sequence's
# tokens first differ between the whole and the split answer (in bf16 without --batch-invariant a
# batch of 4 rounds unlike one of 8, and a near-tie may flip, as between two calls to one server).
# Usage: bash bench/gpu/runs/split.sh        (LOADS to pick loads, e.g. LOADS="c1-n8 c8-n1";
# a CPU smoke test: SITE= MODELS=~/.cache/bass/models DEVICE=cpu DTYPE=bfloat16 TOKENS=4 PROBLEMS=0:1 LOADS=c1-n8 OUT=/tmp/x)
# Writes $OUT/split-{one,two}-LOAD-{warm,run}/serve.{json,md}, logs, split-summary.txt, split.tgz.
set -uo pipefail
source "$(dirname "$0")/serve.sh"
loads=${LOADS-c1-n1 c1-n8 c1-n16 c8-n1 c16-n1 c64-n1}
problems=${PROBLEMS:-0:16}
R=$PWD
W=/tmp/split-out && mkdir -p $W
cd /tmp
export PYTHONPATH=${SITE-/tmp/site} PYTHONUNBUFFERED=1
export SERVE_WAIT_S=${SERVE_WAIT_S:-600}  # two replicas load and capture their graphs in turn
tokens=${TOKENS:-128}
nvidia-smi --query-gpu=index,name,memory.total --format=csv > $W/gpus.csv; cat $W/gpus.csv
cp $R/.whl/COMMIT $W/commit 2>/dev/null || git -C $R rev-parse HEAD > $W/commit 2>/dev/null

load() {  # SERVER LOAD
  local server=$1 name=$2 c n mode
  c=${name%%-*}; c=${c#c}; n=${name##*-n}
  if [ "$n" = 1 ]; then mode=(--temperature 0); else mode=(--temperature 0.8 --top-p 0.95); fi
  local requests=$(( c == 1 ? 16 : 4 * c ))
  for round in warm run; do
    python3 -m bass.cli bench serve --address 127.0.0.1:50051 --concurrency $c -n $n --num-requests $requests \
      --problems $problems --max-new-tokens $tokens "${mode[@]}" --no-check --no-progress \
      --out $W/split-$server-$name-$round 2> $W/split-$server-$name-$round.log
  done
  tail -3 $W/split-$server-$name-run.log
}

answers() {  # SERVER: one seeded request of n = 8 (and its stream), token ids as JSON
  python3 - "$tokens" <<'EOT' > $W/answers-$1.json
import json, sys
from bass.app.client import BassClient
from bass.app.humaneval_problems import load_problems
prompt = load_problems()[0]["prompt"]
with BassClient("127.0.0.1:50051", timeout_s=120) as c:
    tokens = int(sys.argv[1])
    r = c.generate(prompt, n=8, max_new_tokens=tokens, temperature=0.8, top_p=0.95, seed=7)
    streamed = {}
    for m in c.stream_raw(prompt, n=8, max_new_tokens=tokens, temperature=0.8, top_p=0.95, seed=7):
        for d in m.deltas:
            streamed.setdefault(d.index, []).extend(d.token_ids)
print(json.dumps({"unary": [list(s.token_ids) for s in r.sequences],
                  "stream": [streamed[i] for i in range(8)],
                  "finish_order": [s.finish_order for s in r.sequences]}))
EOT
}

for server in ${SERVERS:-one two}; do
  if [ $server = one ]; then
    CUDA_VISIBLE_DEVICES=0 start_serve $W/serve-one.log ${DTYPE:+--dtype $DTYPE}
  else
    start_serve $W/serve-two.log ${DTYPE:+--dtype $DTYPE} --replicas 2 --metrics-port 9465
  fi
  if [ $? = 0 ]; then
    answers $server
    for name in $loads; do echo "== $server $name"; load $server $name; done
    [ $server = two ] && curl -s 127.0.0.1:9465/metrics | grep '^bass_router' > $W/router-metrics.txt
  fi
  kill -INT $serve 2> /dev/null; wait $serve 2> /dev/null
done

python3 - $W <<'EOT' | tee $W/split-summary.txt
import json, sys, pathlib
w = pathlib.Path(sys.argv[1])
print("commit", (w / "commit").read_text().strip(), "| GPUs:", " ".join((w / "gpus.csv").read_text().split("\n")[1:]).strip())
for f in sorted(w.glob("split-*-run/serve.json")):
    run = json.loads(f.read_text())["runs"][0]
    p50 = {k: (run.get(k) or {}).get("p50") for k in ("tpot_ms", "ttft_ms", "e2e_ms")}
    print(f"{f.parent.name:28s} TPOT p50 {p50['tpot_ms']} ms, TTFT p50 {p50['ttft_ms']} ms, "
          f"e2e p50 {p50['e2e_ms']} ms, out tok/s {run['output_tokens_per_s']}, "
          f"completed {run['completed']}/{run['requests']}, errors {run['errors']}")
if not all((w / f"answers-{x}.json").exists() for x in ("one", "two")):
    sys.exit(0)
a, b = (json.loads((w / f"answers-{x}.json").read_text()) for x in ("one", "two"))
def first_difference(x, y):
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None if len(x) == len(y) else min(len(x), len(y)))
for what, x, y in (("whole against split, unary", a["unary"], b["unary"]), ("unary against stream, whole", a["unary"], a["stream"]),
                   ("unary against stream, split", b["unary"], b["stream"])):
    print(f"seeded n = 8, {what}: first differing token per sequence", [first_difference(p, q) for p, q in zip(x, y)])
print("finish orders, whole / split:", a["finish_order"], b["finish_order"])
EOT
tar -C /tmp -czf $OUT/split.tgz split-out

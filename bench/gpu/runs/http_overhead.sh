#!/usr/bin/env bash
# On the GPU machine, after setup.sh (its .whl/ must hold the HTTP front's wheels: prepare.sh
# downloads them): what the OpenAI-compatible HTTP front costs per streamed token (issue #38:
# at most 0.2 ms p50 over gRPC at 8 requests/s on an H100). One `bass serve` on the real pair with
# --http-port, then `bass bench serve` with the same seeded Poisson arrivals, HumanEval prompts,
# 256 new tokens and greedy sampling, once through the coordinator's gRPC API (--address) and once
# through the front (--openai: streamed /v1/completions), REPEATS pairs on the one server, the
# order flipped from pair to pair, so that drift on the machine hits both alike. Every run first
# sends each distinct request alone and checks the answers under load against it (over its own
# protocol).
# Writes DEST = ${OUT:-bench/results}/DATE-DEVICE-http-overhead/: {grpc,http}-rN/serve.{json,md}
# and logs, and summary.json (per rate: the p50 TPOT and ITL of each run, their medians over the
# repeats per protocol, and overhead_ms = http - grpc); run through the device tool, copy DEST
# from $OUT into bench/results/. Estimated (not yet run) at about 6 minutes on an H100. The overhead
# includes the client's side too: the benchmark parses SSE JSON in Python where gRPC hands it
# protobuf messages, which is what any OpenAI client pays.
# Overrides: RATES (requests/s, default 8), DURATION (seconds of arrivals per run, 30), REPEATS (3),
# PROBLEMS (HumanEval slice, 0:16), SAMPLING (bench serve flags, "--temperature 0"), HTTP_PORT
# (8000), SERVE_FLAGS (more `bass serve` flags).
set -uo pipefail
R=$PWD
source "$(dirname "$0")/serve.sh"
rates=${RATES:-8} duration=${DURATION:-30} repeats=${REPEATS:-3} problems=${PROBLEMS:-0:16}
sampling=${SAMPLING:---temperature 0} http_port=${HTTP_PORT:-8000}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H100*) device=h100 ;;
  *H200*) device=h200 ;;
  *) device=$(echo "${gpu:-unknown}" | tr 'A-Z ' 'a-z-') ;;
esac
results=${OUT:-$R/bench/results}
dest=$results/$(date -u +%F)-$device-http-overhead
mkdir -p "$dest"
nvidia-smi > "$dest/nvidia-smi.txt" 2>&1
cd /tmp
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
start_serve "$dest/serve.log" --http-port "$http_port" ${SERVE_FLAGS:-} || exit 1
# `bass serve` starts the front after the coordinator answers: wait for it too.
for _ in $(seq 60); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$http_port/health', timeout=2)" \
    2> /dev/null && break
  sleep 1
done

run() {  # run PROTOCOL REPEAT
  local protocol=$1 repeat=$2 endpoint
  if [ "$protocol" = grpc ]; then endpoint="--address 127.0.0.1:50051"
  else endpoint="--openai http://127.0.0.1:$http_port/v1"; fi
  python3 -m bass.cli bench serve $endpoint --rates $rates --duration $duration --problems $problems \
    --max-new-tokens 256 $sampling --no-progress --out "$dest/$protocol-r$repeat" \
    2> "$dest/$protocol-r$repeat.log"
  tail -2 "$dest/$protocol-r$repeat.log"
}

for repeat in $(seq "$repeats"); do  # grpc first in odd repeats, http first in even ones
  if [ $((repeat % 2)) = 1 ]; then run grpc "$repeat"; run http "$repeat"
  else run http "$repeat"; run grpc "$repeat"; fi
done
kill -INT $serve; wait $serve

python3 - "$dest" "$gpu" <<'EOF'
import json
import statistics
import sys
from pathlib import Path

dest = Path(sys.argv[1])
rates: dict[str, dict] = {}
environment = {}
for path in sorted(dest.glob("*-r*/serve.json")):
    protocol, repeat = path.parent.name.rsplit("-r", 1)
    result = json.loads(path.read_text())
    environment = environment or result.get("environment", {})
    for run in result["runs"]:
        entry = rates.setdefault(run["load"]["label"], {"grpc": [], "http": []})
        entry[protocol].append({
            "repeat": int(repeat), "tpot_p50_ms": (run["tpot_ms"] or {}).get("p50"),
            "itl_p50_ms": (run["itl_ms"] or {}).get("p50"), "completed": run["completed"],
            "requests": run["requests"], "errors": run["errors"],
            "mismatches": (run.get("correctness") or {}).get("mismatches")})


def median(runs, key):
    values = [r[key] for r in runs if r[key] is not None]
    return round(statistics.median(values), 3) if values else None


summary = {"benchmark": "http-overhead", "target_ms": 0.2, "gpu": environment.get("gpu_on_client_machine")
           or environment.get("gpu") or sys.argv[2], "commit": environment.get("commit"), "rates": {}}
for label, entry in rates.items():
    medians = {p: {k: median(entry[p], k) for k in ("tpot_p50_ms", "itl_p50_ms")} for p in ("grpc", "http")}
    overhead = {k: round(medians["http"][k] - medians["grpc"][k], 3)
                if None not in (medians["http"][k], medians["grpc"][k]) else None
                for k in ("tpot_p50_ms", "itl_p50_ms")}
    summary["rates"][label] = {"runs": entry, "median": medians, "overhead_ms": overhead}
(dest / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
for label, s in summary["rates"].items():
    print(f"rate {label}: p50 TPOT grpc {s['median']['grpc']['tpot_p50_ms']} ms, http "
          f"{s['median']['http']['tpot_p50_ms']} ms, overhead {s['overhead_ms']['tpot_p50_ms']} ms per token "
          f"(ITL p50 overhead {s['overhead_ms']['itl_p50_ms']} ms)")
EOF

#!/usr/bin/env bash
# On the GPU machine, no models needed: the per-call transport cost on this host's CPUs
# (bench/cpu/rpc_overhead.py: a stand-in worker whose Verify takes T), calls one at a time on the
# session stream and with one call kept in flight, as regular decoding runs (issue #13).
#   transport.sh [T_MS=1,3] [CALLS=300]
set -euo pipefail
R=$PWD
bash bench/gpu/setup/install.sh
cd /tmp
PYTHONPATH=/tmp/site python3 $R/bench/cpu/rpc_overhead.py --t-ms ${1:-1,3} --work busy,sleep --sockets tcp \
  --clients session,session-ahead --calls ${2:-300} --out $OUT/rpc-overhead.json

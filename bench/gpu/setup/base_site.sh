# Sourced by the GPU scripts that compare with a baseline build: makes /tmp/site-base, a copy of
# /tmp/site (setup.sh) with the baseline commit's wheel and generated bass/v1 from .whlbase/.
if [ ! -d /tmp/site-base ]; then
  cp -r /tmp/site /tmp/site-base
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-base \
    .whlbase/bass_serving-*.whl 2>/dev/null
  rm -rf /tmp/site-base/bass/v1 && cp -r .whlbase/v1 /tmp/site-base/bass/v1
  rm -f /tmp/site-base/bass/BUILD_COMMIT
  [ -f .whlbase/COMMIT ] && cp .whlbase/COMMIT /tmp/site-base/bass/BUILD_COMMIT
fi

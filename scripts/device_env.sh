# Sourced by the GPU scripts, from the repository root, before they run anything: the set-up a bare
# lent GPU machine needs (see the device notes in README's "On a GPU machine").
#   - .device/debs: libdw1/libelf1 unpacked onto LD_LIBRARY_PATH (nsys' importer needs them);
#   - .device/git_sha: the commit being measured (the copy of the tree there has no .git);
#   - .whl/*.whl: Python packages the GPU image lacks (cupti-python for CUPTI kernel timing, dask and
#     distributed for --cluster), installed into /tmp/site, their commands (`dask`) on PATH;
#   - this source tree first on PYTHONPATH, and one extension build cache for every script.
# A script that runs another one (scripts/gpu/gpu_final.sh) does the unpacking and installing once.
export PYTHONUNBUFFERED=1
if ls .device/debs/*.deb >/dev/null 2>&1 && [ -z "${FAPROF_DEVICE_DEBS:-}" ]; then
  mkdir -p /tmp/dw && for f in .device/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export FAPROF_DEVICE_DEBS=1
fi
[ -f .device/git_sha ] && export FAPROF_GIT_SHA=$(cat .device/git_sha)
# .whl/libs/<library>/*.whl (scripts/device_wheels.sh): the library baselines' wheels, when carried
if ls .whl/*.whl .whl/libs/*/*.whl >/dev/null 2>&1 && [ -z "${FAPROF_DEVICE_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $(ls .whl/*.whl .whl/libs/*/*.whl 2>/dev/null) \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} && export PATH=/tmp/site/bin:$PATH \
    && export FAPROF_DEVICE_WHEELS=1
  # FA4's `cutlass` module lives in nvidia_cutlass_dsl/dsl_packages (its .pth is read in site-packages only)
  [ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FAPROF_CACHE=${FAPROF_CACHE:-/tmp/faprof_cache}

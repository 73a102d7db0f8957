#!/usr/bin/env bash
# The wheels a bare lent GPU machine needs for the library baselines (flashinfer_decode,
# flashinfer_prefill, fa4: docs/guide/libraries.md), downloaded here into the ignored .whl/libs/,
# with their sizes against the 64 MiB a device call carries (the source tree included).
#
#   bash scripts/device_wheels.sh [flashinfer] [fa4]      # default: both; prints sizes and the budget
#   SIZES_ONLY=1 bash scripts/device_wheels.sh fa4         # sizes from the package index, nothing downloaded
#   SPLIT_MB=30 bash scripts/device_wheels.sh fa4          # also cut wheels into parts for several calls
#
# Layout: .whl/libs/common (shared by both), .whl/libs/flashinfer, .whl/libs/fa4; carry
# `.whl/libs/common` and the library's folder. scripts/device_env.sh installs every carried wheel
# (.whl/*.whl and .whl/libs/*/*.whl) into /tmp/site, and for FA4 puts /tmp/site/nvidia_cutlass_dsl/dsl_packages
# on PYTHONPATH: the `cutlass` module lives there, and the .pth file nvidia-cutlass-dsl installs to add it
# is read in site-packages only, not in a --target folder on PYTHONPATH.
#
# What the GPU image already has (its package list, /work/.library/device/KINDS.md): torch (cu130),
# cuda-bindings, numpy, einops, tqdm, requests, ninja, nvidia-ml-py, protobuf, typing-extensions, nvcc.
# So FlashInfer needs flashinfer-python and apache-tvm-ffi (import checked on a CPU machine with only
# those two and the image's pure-Python packages); FA4 needs flash-attn-4, quack-kernels,
# nvidia-cutlass-dsl and its libs (the cu13 build for torch +cu130), apache-tvm-ffi and
# torch-c-dlpack-ext. Versions are faprof's pins (pyproject.toml) and the versions pip resolves for them.
#
# nvidia-cutlass-dsl-libs-cu13 alone is about 88 MiB: more than one call carries. With SPLIT_MB the
# script cuts every wheel bigger than SPLIT_MB into parts under .whl/parts/N/ (one folder per call):
# carry .whl/parts/1 in the first call, whose command copies it to /tmp/faprof_parts/, and so on, on
# one warm machine (it is given back after about 30 s idle); the last call runs
# `cat /tmp/faprof_parts/NAME.part* > /tmp/faprof_parts/NAME` for each wheel and installs. The
# folders and the join line are printed. Parts are plain byte ranges (split -b); sha256 sums are
# printed to check the joined wheel (sha256sum -c) before installing it.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
CARRY_MIB=64
WANT=("$@")
[ ${#WANT[@]} -eq 0 ] && WANT=(flashinfer fa4)

# name==version, folder; the cp312 platform wheels are picked by pip download below
COMMON=("apache-tvm-ffi==0.1.15.post2")
FLASHINFER=("flashinfer-python==0.6.18.post1")
FA4=("flash-attn-4==4.0.0b40" "quack-kernels==0.6.5" "nvidia-cutlass-dsl==4.8.1" "nvidia-cutlass-dsl-libs-base==4.8.1"
     "nvidia-cutlass-dsl-libs-core==4.8.1" "nvidia-cutlass-dsl-libs-cu13==4.8.1" "torch-c-dlpack-ext==0.1.5")
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)

if ! git check-ignore -q .whl/libs/x.whl; then
  echo "/.whl/" >> .git/info/exclude
  echo "added /.whl/ to .git/info/exclude (the wheels must not be committed)"
fi

reqs_of() {
  case "$1" in
    common) printf '%s\n' "${COMMON[@]}" ;;
    flashinfer) printf '%s\n' "${FLASHINFER[@]}" ;;
    fa4) printf '%s\n' "${FA4[@]}" ;;
    *) echo "unknown library '$1' (flashinfer, fa4)" >&2; exit 2 ;;
  esac
}

# The size of a release file on the package index (PEP 691 JSON), without downloading it.
index_size() {
  "$PY" - "$1" <<'EOF'
import json, re, sys, urllib.request
name, version = sys.argv[1].split("==")
req = urllib.request.Request(f"https://pypi.org/simple/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
norm = re.sub(r"[-_.]+", "_", name).lower()
for f in files:
    n = f["filename"]
    if n.lower().startswith(f"{norm}-{version}-") and n.endswith(".whl") and (
            "py3-none-any" in n or ("cp312" in n and "x86_64" in n and "manylinux" in n)):
        print(f"{f['size']} {n}")
        break
else:
    print(f"0 {name}=={version}:not-found")
EOF
}

tree_bytes() {  # what travels besides carried paths: tracked and untracked-not-ignored files
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}'
}

mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

total=0
folders=(common "${WANT[@]}")
for lib in "${folders[@]}"; do
  dir=.whl/libs/$lib
  while read -r req; do
    [ -z "$req" ] && continue
    if [ -n "${SIZES_ONLY:-}" ]; then
      read -r size file < <(index_size "$req")
    else
      mkdir -p "$dir"
      "$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$dir" "$req"
      file=$(ls -t "$dir" | grep -i "^$(echo "${req%%==*}" | tr '-' '_')-${req##*==}-" | head -1)
      size=$(stat -c %s "$dir/$file")
    fi
    total=$((total + size))
    printf '%-10s %-92s %8s MiB\n' "$lib" "$file" "$(mib "$size")"
  done < <(reqs_of "$lib")
done

tree=$(tree_bytes)
room=$((CARRY_MIB * 1048576 - tree))
echo
echo "wheels: $(mib "$total") MiB; source tree: $(mib "$tree") MiB; a call carries $CARRY_MIB MiB in all: room for $(mib "$room") MiB"
for lib in "${WANT[@]}"; do
  [ -n "${SIZES_ONLY:-}" ] && break
  need=$(du -cb .whl/libs/common .whl/libs/"$lib" | tail -1 | cut -f1)
  if [ "$need" -le "$room" ]; then
    echo "$lib: $(mib "$need") MiB with common: fits one call (carry .whl/libs/common and .whl/libs/$lib)"
  else
    echo "$lib: $(mib "$need") MiB with common: more than one call carries; SPLIT_MB=N cuts it into parts"
  fi
done

if [ -n "${SPLIT_MB:-}" ] && [ -z "${SIZES_ONLY:-}" ]; then
  rm -rf .whl/parts && mkdir -p .whl/parts
  n=1; used=0
  for f in $(ls -S $(printf '.whl/libs/%s/*.whl ' "${folders[@]}")); do  # largest first, parts of at most SPLIT_MB, folders of at most SPLIT_MB
    size=$(stat -c %s "$f"); base=$(basename "$f")
    (cd "$(dirname "$f")" && sha256sum "$base") >> .whl/parts/SHA256SUMS
    if [ "$size" -gt $((SPLIT_MB * 1048576)) ]; then
      tmp=$(mktemp -d); split -b "${SPLIT_MB}M" -d "$f" "$tmp/$base.part"
      for p in "$tmp"/*; do
        [ "$used" -gt 0 ] && n=$((n + 1)) && used=0
        mkdir -p .whl/parts/$n && mv "$p" .whl/parts/$n/ && used=$(stat -c %s .whl/parts/$n/"$(basename "$p")")
      done
      rmdir "$tmp"
    else
      if [ $((used + size)) -gt $((SPLIT_MB * 1048576)) ]; then n=$((n + 1)); used=0; fi
      mkdir -p .whl/parts/$n && cp "$f" .whl/parts/$n/ && used=$((used + size))
    fi
  done
  cp .whl/parts/SHA256SUMS .whl/parts/$n/
  echo
  echo "parts: $n folders under .whl/parts (carry one a call, on one warm machine):"
  for d in .whl/parts/*/; do echo "  $d $(mib "$(du -cb "$d" | tail -1 | cut -f1)") MiB"; done
  echo "each call: mkdir -p /tmp/faprof_parts && cp .whl/parts/N/* /tmp/faprof_parts/"
  echo "last call, then: cd /tmp/faprof_parts && for w in \$(ls *.part00 | sed 's/.part00\$//'); do cat \$w.part* > \$w && rm \$w.part*; done" \
       "&& sha256sum -c SHA256SUMS && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site *.whl"
fi

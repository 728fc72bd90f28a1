#!/usr/bin/env bash
# Puts NVRTC (CUDA's runtime compiler, from its PyPI wheel: no GPU or CUDA install needed)
# under target/nvrtc/lib and prints that directory, so that the unit tests compile every
# generated CUDA kernel for sm_90 on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/nvrtc
if [ ! -e "$dir/lib/libnvrtc.so" ]; then
  rm -rf "$dir" && mkdir -p "$dir/wheel" "$dir/lib"
  python3 -m pip download --quiet --no-deps -d "$dir/wheel" "nvidia-cuda-nvrtc==13.0.88" >&2
  python3 - "$dir" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(d, "wheel", "*.whl"))[0]) as z:
    for m in z.namelist():
        if "/lib/libnvrtc" in m:
            with open(os.path.join(d, "lib", os.path.basename(m)), "wb") as f:
                f.write(z.read(m))
PY
  ln -sf libnvrtc.so.13 "$dir/lib/libnvrtc.so"
  rm -rf "$dir/wheel"
fi
echo "$PWD/$dir/lib"

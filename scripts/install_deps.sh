#!/usr/bin/env bash
# Installs what building ferrum needs on a Debian/Ubuntu machine, skipping
# what is already there. The CUDA toolkit (nvcc, cuBLAS, NCCL) is not
# installed here: where it is (/usr/local/cuda) the build uses it, and
# without it the build is the CpuBackend-only library (FERRUM_CUDA=OFF).
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ libgtest-dev libfmt-dev nlohmann-json3-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "install_deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "install_deps: nvcc is at /usr/local/cuda/bin (add it to PATH)"
  else
    echo "install_deps: no CUDA toolkit (nvcc) found: the build will be the CpuBackend-only library (FERRUM_CUDA=OFF)"
  fi
fi

#!/usr/bin/env bash
# Installs what building ferrum needs on a Debian/Ubuntu machine, skipping
# what is already there. The CUDA toolkit (nvcc, cuBLAS, NCCL) must
# already be installed (/usr/local/cuda).
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
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_deps: nvcc is at /usr/local/cuda/bin (add it to PATH)"
fi

#!/usr/bin/env bash
# The main command: installs missing packages, builds, and runs the demo on
# the GPU when there is one, else on the CPU. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ferrum_demo
"$BUILD_DIR/apps/demo/ferrum_demo" "$@"

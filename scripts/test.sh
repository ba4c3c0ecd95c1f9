#!/usr/bin/env bash
# The test command: installs missing packages, configures, builds everything
# (library, tests, benchmark, demo) and runs the whole ctest suite. GPU tests
# skip themselves on a machine without a GPU and ctest reports them skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"

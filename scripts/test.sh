#!/usr/bin/env bash
# The test command: installs missing packages, configures, builds everything
# (library, tests, benchmark, demo) and runs the whole ctest suite. GPU tests
# skip themselves on a machine without a GPU and ctest reports them skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/configure.sh  # installs what is missing, configures $BUILD_DIR
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"

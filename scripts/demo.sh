#!/usr/bin/env bash
# The main command: installs missing packages, builds, and runs the demo on
# the GPU when there is one, else on the CPU. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/configure.sh  # installs what is missing, configures $BUILD_DIR
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ferrum_demo
"$BUILD_DIR/apps/demo/ferrum_demo" "$@"

#!/usr/bin/env bash
# The main command: installs missing packages, builds the engine and runs it
# (CUDA backend when a GPU is present, else CpuBackend). Without arguments it
# decodes 8 tokens of the small random Qwen3 preset; any arguments go to
# ferrum_engine instead (e.g. --model DIR, --random llama3-8b --graph).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/configure.sh  # installs what is missing, configures $BUILD_DIR
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ferrum_engine
if [ $# -eq 0 ]; then
  set -- --random tiny-qwen3 --prompt-tokens 1,2,3 --steps 8
fi
"$BUILD_DIR/apps/engine/ferrum_engine" "$@"

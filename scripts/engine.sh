#!/usr/bin/env bash
# The main command: installs missing packages, builds the engine and runs it
# (CUDA backend when a GPU is present, else CpuBackend). Without arguments it
# decodes a random-weight Qwen3: the qwen3-0.6b shape in graph mode when
# nvidia-smi lists a GPU, else 8 tokens of the tiny preset on the CPU (whose
# head_dim the CUDA attention kernels do not take). Any arguments go to
# ferrum_engine instead (e.g. --model DIR, --random llama3-8b --graph).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/configure.sh  # installs what is missing, configures $BUILD_DIR
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ferrum_engine
if [ $# -eq 0 ]; then
  if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
    set -- --random qwen3-0.6b --dtype f16 --graph --prompt-tokens 1,2,3 --steps 32
  else
    set -- --random tiny-qwen3 --prompt-tokens 1,2,3 --steps 8
  fi
fi
"$BUILD_DIR/apps/engine/ferrum_engine" "$@"

#!/usr/bin/env bash
# Builds the host C++ code with AddressSanitizer and UndefinedBehaviorSanitizer
# (FERRUM_SANITIZE, in build-sanitize/ or $SANITIZE_BUILD_DIR) and runs the
# CPU tests under them: CpuBackend against the fp64 reference, every op's
# argument checks, the random-call and safetensors fuzz tests, the engine on
# CpuBackend and as a program. A heap overflow, a leak or undefined
# behaviour fails the test it ran in: the sanitizers exit 66, which no test
# expects (the engine's command-line tests expect 1 from a refused run, so
# a report on an error path does not pass as that refusal).
# Arguments go to ctest (e.g. -R Safetensors); without any, label cpu runs.
# The install tests are left out (unless the arguments give an -E of
# their own, which replaces this one): install_and_consume's
# consumer builds without the sanitizer runtimes, so it cannot link an
# instrumented static library, and install_and_consume_shared and
# install_and_consume_cpu_only build and test plain libraries of their own
# (nothing sanitized, and slow).
# The kernels and nvcc's host code (the launchers) are not instrumented: on
# a GPU machine, scripts/gpu_suite.sh tests runs compute-sanitizer's
# memcheck over the GPU suite (its largest shapes aside) and racecheck over
# the kernels that share memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
# Not BUILD_DIR: that one names the normal build (configure.sh), whose
# cache must not pick up FERRUM_SANITIZE.
build="${SANITIZE_BUILD_DIR:-build-sanitize}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRUM_SANITIZE=address,undefined \
  -DFERRUM_BUILD_BENCHMARKS=OFF
cmake --build "$build" -j "$(nproc)"
# The caller's options first, ours after (later settings win). The CUDA
# runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:protect_shadow_gap=0:exitcode=66"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1:exitcode=66"
if [ $# -eq 0 ]; then set -- -L cpu; fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -E '^install_and_consume' "$@"

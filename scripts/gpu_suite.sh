#!/usr/bin/env bash
# One call on the GPU machine: build (-j16), the whole test suite, the
# sanitizers, the benchmark and torch's reference figures, side by side.
# Writes under $OUT (default ./out): suite.log, bench.log, bench.json,
# torch.json, compare.md. Usage: scripts/gpu_suite.sh [--no-sanitizer] [--no-bench] [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
SANITIZER=1 BENCH=1 QUICK=""
for a in "$@"; do
  case "$a" in
    --no-sanitizer) SANITIZER=0 ;;
    --no-bench) BENCH=0 ;;
    --quick) QUICK="--quick" ;;
  esac
done
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
LOG="$OUT/suite.log"
B=build-gpu
{
  echo "== $(date -u) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  echo "== configure + build"
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build $B -j16 2>&1 | grep -E "error|warning|FAILED" || true
  echo "== ctest (all labels)"
  ctest --test-dir $B --output-on-failure -j8 2>&1 | tail -n 60
} 2>&1 | tee "$LOG"
if [ "$SANITIZER" = 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool on the GPU suite" | tee -a "$LOG"
    compute-sanitizer --tool $tool --error-exitcode 1 $B/tests/ferrum_tests_gpu --gtest_brief=1 2>&1 | tail -n 25 | tee -a "$LOG"
    echo "sanitizer $tool exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
  done
fi
if [ "$BENCH" = 1 ]; then
  echo "== benchmark" | tee -a "$LOG"
  $B/bench/ferrum_bench $QUICK --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  echo "ferrum_bench exit: $?" | tee -a "$LOG"
  python3 bench/torch_reference.py $QUICK --compile large --json "$OUT/torch.json" >> "$OUT/bench.log" 2>&1
  echo "torch_reference exit: $?" | tee -a "$LOG"
  python3 bench/compare.py "$OUT/bench.json" "$OUT/torch.json" --markdown-out "$OUT/compare.md" 2>&1 | tee -a "$LOG"
fi

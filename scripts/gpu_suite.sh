#!/usr/bin/env bash
# The GPU machine's work, in two parts that each fit one 10-minute call:
#   scripts/gpu_suite.sh tests   build (-j16), the whole ctest suite, then
#                                compute-sanitizer memcheck over the GPU test
#                                binary and racecheck over the kernels that
#                                use shared memory
#   scripts/gpu_suite.sh bench   build, ferrum_bench, torch's reference
#                                figures in the same call, one comparison table,
#                                and how long each side ran at the power cap
#   scripts/gpu_suite.sh all     both (needs about 12 minutes)
#   scripts/gpu_suite.sh nccl    on a machine with 2+ GPUs: the NCCL tests and
#                                ferrum_bench_nccl (bus bandwidth vs raw NCCL)
#   scripts/gpu_suite.sh gptq    the GPTQ GPU tests under memcheck and racecheck,
#                                then gptqbench: ferrum_bench_gptq and
#                                bench/gptq_torch.py
#   scripts/gpu_suite.sh quicktests  the GPU test binary directly (faster than
#                                ctest); race: racecheck over attention and GPTQ
#                                in 8 shards (the decode knob cases are
#                                raceknobs'; session 60, H100: 96 tests, ~4 min)
#   scripts/gpu_suite.sh engine  ferrum_engine on llama3-8b-shaped random
#                                weights, graph and eager (needs .deps)
#   scripts/gpu_suite.sh tuning  ferrum_attention_tuning: the prefill and decode launch
#                                knobs (DecodeTuning) A/B in one run
#   scripts/gpu_suite.sh profile ncu on GPTQ m=1, the wgmma GPTQ kernel at m=64 (source
#                                view) and decode B=1, racecheck detail
#   scripts/gpu_suite.sh trace   the llama3-8b decode step (GPTQ and f16, eager)
#                                under bench/kernel_trace.cpp's CUPTI tracer: every
#                                kernel's in-step time and overlap (needs .deps);
#                                TRACE_RUNS='qwen3-0.6b:f16 llama3-8b:gptq' picks
#                                other model:quant pairs (quant gptq or f16),
#                                each with engine switches as a third field
#                                (llama3-8b:gptq:attention-early-kv)
#   scripts/gpu_suite.sh normprobe  why fused_add_rms_norm at [32768 x 4096]
#                                runs ~7 % slower in bf16 than in f16 (their
#                                kernels' PTX is the same but for the
#                                conversions; torch compiled is level across
#                                the dtypes): the two benches alternated three
#                                times, then ncu on one launch of each (speed
#                                of light, DRAM bytes read and written, the
#                                SM and DRAM clocks)
#   scripts/gpu_suite.sh gptqtimeline  bench/gptq_timeline.cpp (a second build
#                                with -DFERRUM_GPTQ_TIMELINE=ON): the GPTQ
#                                streaming kernel's per-CTA phases in the
#                                llama3-8b GPTQ decode step, then in three
#                                standalone m = 1 launches, with the CTAs
#                                grouped by their SM's load (needs .deps)
#   scripts/gpu_suite.sh decodetimeline  ferrum_attention_tuning timeline (a
#                                second build with -DFERRUM_DECODE_TIMELINE=ON):
#                                the decode kernel's per-block phases and its
#                                launch's schedule (%globaltimer: waves, slots
#                                kept busy, merge tail) at B = 1 L = 1k / 4k,
#                                B = 16 L = 8k, B = 64 L = 1k
#                                (DECODE_TIMELINE_POINTS, space-separated
#                                B:L, e.g. '1:32768 1:131072', replaces
#                                those points)
#   scripts/gpu_suite.sh wgmmaablate  ferrum_wgmma_rate (wgmma alone), then the
#                                wgmma GPTQ kernel with parts of its loop left
#                                out (docs/design/patches/gptq_wgmma_ablation.patch,
#                                one build per mask of WGMMA_ABLATE_MASKS,
#                                default '2 4 8 32 46'; timing only)
#                                against main, m = WGMMA_ABLATE_MS (16,32,64),
#                                shapes WGMMA_ABLATE_SHAPES, two passes
#   scripts/gpu_suite.sh wgmmafold  ferrum_wgmma_rate's lop3 rows, then the tree with
#                                docs/design/patches/gptq_wgmma_lop3_fold.patch
#                                applied: its *Gptq* GPU tests, memcheck and
#                                racecheck over CudaGptqWgmma.*, and its wgmma
#                                kernel against main at m = 9..32 on 7 shapes,
#                                two passes (gptq_small_m.md §13.13; session
#                                47: 6-35 % slower, §13.14)
#   scripts/gpu_suite.sh wgmmaworkspace  the wgmma GPTQ kernel's workspace
#                                reduction against its cluster reduction, on
#                                main (and on gptqpatch's patched build, with
#                                that mode and GPTQ_PATCH, which also tests
#                                it), with Auto and the fused kernel (m = 33,
#                                64) as controls, two passes; then ncu on one
#                                launch of main's each way at 4096^2 m = 64,
#                                the workspace launch's stalls per SASS line,
#                                and the patched workspace launch
#                                (gptq_small_m.md §13.15; ran in session 50
#                                with gptq_finish_chunked.patch, which applies
#                                up to 524ca82, not after 43d4ed9, which took
#                                its fused-kernel half)
#   scripts/gpu_suite.sh gptqpatch  the tree with GPTQ_PATCH (a patch's path in
#                                the tree; required) applied: its *Gptq*
#                                GPU tests (6 shards) and memcheck over
#                                CudaGptq* (8 shards), then its GPTQ kernels
#                                against main's, two alternated passes: bulk
#                                m = 1 / 8, stream m = 1, fused m = 17 / 33 /
#                                64, auto m = 1 / 8 / 16 / 64 (a kernel change
#                                to test and time before it lands; session
#                                51 landed splitk_finish_merge.patch this way)
#   scripts/gpu_suite.sh decodepatch  the tree with DECODE_PATCH (a patch's
#                                path in the tree; no default: session 65
#                                landed decode_slice_fold.patch) applied: its
#                                decode GPU tests (6 shards) and memcheck over
#                                them (8 shards), then ferrum_bench's decode
#                                points (DECODE_PATCH_POINTS, --filter items)
#                                main against patched, two alternated passes
#                                (bench/ab_table.py), and decode-exp at
#                                DECODE_PATCH_EXP (B:L list; empty: none) in both builds
#   scripts/gpu_suite.sh engineswitches  ferrum_engine's launch switches A/B
#                                on one model (SWITCH_MODEL, default
#                                qwen3-0.6b; SWITCH_QUANT=gptq for its GPTQ
#                                form), graph, each switch set in turn,
#                                SWITCH_ROUNDS (3) rounds, with eager in each
#                                round (the graph / eager ratio of issue 6);
#                                tokens compared with the default's
#   scripts/gpu_suite.sh wgmmasplits  the wgmma GPTQ kernel at each split count
#                                of WGMMA_SPLITS ('0 4 5 6 7 8'; 0 = the plan), m = 16, 32,
#                                64, on shapes of 16, 24, 56 and 112 column
#                                tiles (WGMMA_SPLIT_SHAPES): the data for a
#                                split rule (gptq_small_m.md §13.12), after
#                                ferrum_cluster_placement (where clusters of
#                                each split count land)
#   scripts/gpu_suite.sh decodesweep  ferrum_attention_tuning decode-exp
#                                (the default, the rules before session 32,
#                                every explicit slices per block) at each B:L
#                                of DECODE_SWEEP (default: session 32's 33
#                                long-cache points; its short-cache points are
#                                in decode_attention.md §4.9), two passes,
#                                the second in reverse order; then
#                                bench/decode_sweep_summary.py's table
#                                (DECODE_SWEEP_VERSUS=drain adds the default
#                                against that decode-exp variant)
#   scripts/gpu_suite.sh slicegeom  the decode's smallest slice (that of caches
#                                up to 16x it; FERRUM_DECODE_MIN_SLICE_KEYS):
#                                ferrum_attention_tuning and ferrum_bench
#                                built once per size of SLICE_GEOM (128 256
#                                512; 128 is the main build), then decode-exp
#                                at each B:L of SLICE_GEOM_POINTS, two passes
#                                alternating the builds, with
#                                decode_sweep_summary.py's table per size, and
#                                the B = 1 decode benchmark (graph replay) per
#                                size
#   scripts/gpu_suite.sh ab      this tree against base/ (scripts/gpu_tree.sh
#                                REV --base BASE, or gpu_tree.sh --working
#                                --base BASE) and each alt/N (--alt REV):
#                                their engine and GPTQ bench built beside
#                                the main build, then
#                                ferrum_engine AB_RUNS (2) times each,
#                                alternated, with the greedy tokens' md5, and
#                                ferrum_bench_gptq --kernel bulk m = 1 (or
#                                AB_BENCH_MS, e.g. 1,16) on the decode shapes,
#                                every build (needs .deps); AB_OPS_FILTER
#                                adds ferrum_bench on those ops (its --filter),
#                                AB_RUNS passes alternated, one table
#                                (bench/ab_table.py, also $OUT/ab_ops.md);
#                                AB_SKIP_GPTQ_BENCH=1 leaves out the GPTQ bench,
#                                AB_SKIP_ENGINE=1 the engine runs
#   scripts/gpu_suite.sh rowsq   the llama3-8b GPTQ graph decode with and
#                                without --gptq-row-sq-norms, alternated
#                                AB_RUNS (2) times, tok/s and the tokens' md5;
#                                then 32 steps' logits with the residual add
#                                fused and composed (--no-gptq-fuse-residual-add)
#                                compared bitwise (needs .deps)
#   scripts/gpu_suite.sh sdpa    scripts/sdpa_check.py: flash_attention (both
#                                prefill kernels) and torch SDPA against a
#                                float64 reference at large shapes
#   scripts/gpu_suite.sh verify  a kernel change's verification in about 2.5
#                                minutes: quicktests (the GPU binary in 8
#                                shards, the CPU binary's CUDA instances), the
#                                engine tests, memcheck over the GPTQ and the
#                                device-check tests in 10 shards and over the
#                                CPU binary's randomized op calls on CUDA
#                                (VERIFY_MEMCHECK='filter' replaces the first
#                                that filter: add the changed kernels' tests,
#                                e.g. '*Gptq*:*Decode*:Sweep/CudaRowOps.*Norm*:
#                                DTypes/CudaSmallNorms.*'); VERIFY_RACECHECK='filter' adds
#                                racecheck over those tests (16 shards, each
#                                VERIFY_RACECHECK_S seconds at most, 300;
#                                leave out the racelong tests: in session 28
#                                each alone filled a shard of 230 or 140 s;
#                                and CudaArgmax.ManyRowsPerCluster, never
#                                under racecheck)
#   scripts/gpu_suite.sh racelong  racecheck over those two tests (the GPTQ
#                                cluster reduce's bits, argmax on every row
#                                count), one shard each, 470 s (with the
#                                build, one call)
#   scripts/gpu_suite.sh raceknobs  racecheck over every CudaDecodeKnobs case
#                                (or those RACEKNOBS_FILTER matches, e.g.
#                                'Cases/CudaDecodeKnobs.*/f16_*': half, for a
#                                call's limit),
#                                one test per shard, RACEKNOBS_S (420) seconds
#                                each (session 34: all 32 cases in 348 s at
#                                most, run at once on 16 cores)
#   scripts/gpu_suite.sh l2probe  ferrum_bench_l2_residency --window 6 (a decode
#                                GEMM with its weight in L2 or cold, staged
#                                there on a graph branch or in series:
#                                docs/design/engine_decode.md, session 56),
#                                then one shape (L2PROBE_ONLY, default
#                                qwen3-0.6b's o) under the CUPTI tracer with
#                                the modes of L2PROBE_MODES, and
#                                bench/l2_residency_trace.py's table: when
#                                each stage ran against its GEMM
#   scripts/gpu_suite.sh persistentprobe  ferrum_persistent_layer_probe: the
#                                llama3-8b GPTQ step's weight bytes streamed
#                                one kernel per projection (graph, PDL, L2
#                                prefetch before the wait) against one
#                                cooperative kernel with grid barriers, and
#                                each boundary alone (what a persistent
#                                decode-layer kernel could win on its
#                                schedule; docs/design/engine_decode.md)
#   scripts/gpu_suite.sh decodeorder  the B = 64 L = 8k decode
#                                (DECODEORDER_CASE, a --filter) after B = 16
#                                L = 128k (DECODEORDER_BEFORE, filters with
#                                ';' between them, each a run of its own)
#                                in one ferrum_bench process, with
#                                each --pause-ms of DECODEORDER_PAUSES (ms,
#                                default '0 3000', --settle-gbps 0) before
#                                each case, and the bench's default idle, then
#                                alone, with nvidia-smi logging the SM
#                                and memory clocks, power and temperatures
#                                every 100 ms ($OUT/decodeorder_smi.csv)
#                                (session 59: 16 % slow after 0-5 ms, as
#                                alone after 20 ms or more; clocks steady)
#   scripts/gpu_suite.sh decodeablate  the tree with docs/design/patches/
#                                decode_warp_slices.patch (one warp per slice,
#                                decode_attention.md §4.20): its decode knob
#                                and batch tests, then decode-exp's warp-slice
#                                and block-merge rows (back to back and per
#                                call) at DECODE_ABLATE_POINTS (B:L, default
#                                '64:1024 16:1024 16:8192'), plain and with
#                                the partial stores (mask 1), the row merge
#                                (2) or both (3) left out (DECODE_ABLATE_MASKS;
#                                timing only), two passes
#   scripts/gpu_suite.sh decodegap  one decode point (DECODEGAP_POINT, B:L,
#                                default 64:1024) in ferrum_bench alone and
#                                in decode-exp (its default and its packed
#                                K / V layout, the bench's), then ncu's
#                                duration of one launch of each: where the
#                                bench's per-call figure parts from the
#                                tool's (session 62: 111 against 98 us)
#   scripts/gpu_suite.sh decodesource  ncu's source counters (per SASS
#                                instruction) over one launch of the
#                                block-merge decode kernel and one of the
#                                warp-slice kernel with shared partials
#                                (patches/decode_warp_slices.patch) at
#                                DECODESOURCE_POINT (B:L, default 64:1024),
#                                summarized by bench/ncu_source_summary.py
#   scripts/gpu_suite.sh enginebrief  the engine tests, then the llama3-8b
#                                engine once each: f16 graph and eager, GPTQ
#                                graph and eager, and qwen3-0.6b f16 graph and
#                                eager (the bars of issue 6 only, for a call
#                                short of device time: engine's whole sweep
#                                runs about 25 engines)
# Modes combine with commas (gptq,bench). BENCH_FILTER=attention_,gemm passes
# --filter to ferrum_bench and torch_reference.py. SKIP_GEMM_INTERLEAVED=1 and
# SKIP_TORCH_GPTQ=1 leave out those two reference runs (to fit a call).
# Every section header carries the time, so a log shows where a call went.
# Output goes under $OUT (default ./out): suite.log, ctest.log, bench.log,
# bench.json, torch.json, compare.md, gemm.json. To run exactly a commit
# while the working tree has other edits: scripts/gpu_tree.sh (below). Add --quick to shorten the benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
MODE="${1:-all}"
# What `all` leaves out (each runs only when named): one list, so that a new
# mode is added in one place.
OPT_IN_MODES=(nccl trace gptq engine quicktests gptqbench race racelong raceknobs hf sdpa profile tuning verify gptqtimeline decodetimeline decodesweep ab rowsq slicegeom normprobe wgmmaablate wgmmasplits wgmmafold wgmmaworkspace gptqpatch engineswitches l2probe decodeorder enginebrief decodeablate decodegap decodesource decodepatch persistentprobe)
# verify runs the GPU test binary (quicktests, 8 shards) first.
if [[ ",$MODE," == *",verify,"* ]]; then
  MODE="$MODE,quicktests"
  GPU_TEST_SHARDS="${GPU_TEST_SHARDS:-8}"
fi
has_mode() {
  if [ "$MODE" = all ]; then
    [[ " ${OPT_IN_MODES[*]} " != *" $1 "* ]]
    return
  fi
  [[ ",$MODE," == *",$1,"* ]]
}
# The builds of an ablation pass, one per line: as given, the second pass in
# reverse (so that neither end of a pass always runs first).
pass_order() {  # PASS BUILD...
  local pass=$1
  shift
  if [ "$pass" = 2 ]; then printf '%s\n' "$@" | tac; else printf '%s\n' "$@"; fi
}
# modes_within LIST: every mode of MODE is one of LIST (space-separated).
modes_within() {
  local m
  for m in ${MODE//,/ }; do [[ " $1 " == *" $m "* ]] || return 1; done
}
BF=()
[ -n "${BENCH_FILTER:-}" ] && BF=(--filter "$BENCH_FILTER")
QUICK=""
[ "${2:-}" = "--quick" ] && QUICK="--quick"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
B="${BUILD_DIR:-build-gpu}"
# ab: the build directory of base/ or alt/N (beside the main build).
ab_build_dir() { echo "${B}-${1//\//}"; }
# slicegeom: its slice sizes, and the build directory of each (128: the main build).
SLICE_GEOM_SIZES="${SLICE_GEOM:-128 256 512}"
geom_dir() { if [ "$1" = 128 ]; then echo "$B"; else echo "${B}-slices$1"; fi; }
# racelong's tests, each too long for a shard of the other racecheck runs
# (session 28: each filled a 230 or 140 s shard alone; session 29: clean
# in 19 and 156 s): run only by racelong.
RACELONG_TESTS='CudaGptqStreamBulk.ClusterReduceGivesTheWorkspaceReductionsBits:CudaArgmax.MatchesCpuOnEveryRowCount'
# Never under racecheck: six launches of 65536 clusters did not finish in
# 470 s (session 29). Its row loop is race-checked through
# CudaArgmax.RowLoopWithFewGroupsEitherGrouping (the launcher capped at 1-8 row groups),
# which the CudaArgmax.* filters take.
RACECHECK_NEVER='CudaArgmax.ManyRowsPerCluster'
LOG="$OUT/suite.log"
# The bulky logs (each GPU test shard, each sanitizer run, the test binaries'
# whole output) go to $DETAIL_DIR; a step that fails copies its log into
# $OUT. A device call brings back only a few files (8 on this workplace's
# machines), so $OUT holds the summary (suite.log), the JSON and what failed.
DETAIL="${DETAIL_DIR:-/tmp/ferrum_suite_detail}"
mkdir -p "$DETAIL"
keep_log() { cp "$1" "$OUT/" && echo "(kept $(basename "$1") in \$OUT)"; }
# ab_binary BUILD PATCHED_DIR REL: the binary REL of main's build ($B) or,
# for BUILD "patched", of the build in PATCHED_DIR (the A/B modes' loops).
ab_binary() { if [ "$1" = patched ]; then echo "$2/$3"; else echo "$B/$3"; fi; }
# ops_ab FILTER TABLE NAME=FERRUM_BENCH...: ferrum_bench --filter FILTER
# from each build, AB_RUNS (2) passes alternating the builds, as one table
# (bench/ab_table.py: the first build over the second) printed and kept at
# TABLE (ab's AB_OPS_FILTER, decodepatch).
ops_ab() {
  local filter=$1 table=$2 pass spec name bin json
  shift 2
  local args=()
  for pass in $(seq 1 "${AB_RUNS:-2}"); do
    for spec in "$@"; do
      name=${spec%%=*}
      bin=${spec#*=}
      [ -x "$bin" ] || continue
      json="$DETAIL/ops_ab.$name.$pass.json"
      rm -f "$json"  # ferrum_bench writes it at its end: a run cut short leaves none
      timeout 150 "$bin" --filter "$filter" --json "$json" > /dev/null 2>&1
      echo "-- ferrum_bench '$filter', $name pass $pass: exit $?"
      [ -s "$json" ] && args+=("$name=$json")
    done
  done
  if [ ${#args[@]} -gt 0 ]; then
    python3 bench/ab_table.py "${args[@]}" | tee "$table"
  else
    echo "no ferrum_bench run finished"
  fi
}
# patched_tests DIR LABEL FILTER MEMCHECK_FILTER: a patched build's GPU
# tests over FILTER (6 shards, 240 s) and memcheck over MEMCHECK_FILTER (8
# shards) (gptqpatch, decodepatch).
patched_tests() {
  local dir=$1 label=$2
  if [ -x "$dir/tests/ferrum_tests_gpu" ]; then
    echo "== $label: GPU tests '$3' ($(date +%T))"
    gtest_shards "$dir/tests/ferrum_tests_gpu" "$(basename "$dir")_tests" 6 240 --gtest_filter="$3"
    echo "== $label: memcheck over '$4' ($(date +%T))"
    SANITIZE_SHARDS=8 SANITIZE_BIN="$dir/tests/ferrum_tests_gpu" sanitize memcheck 240 "$4" 3
  else
    echo "$label: no patched build"
  fi
}
# gptq_rows LABEL BINARY ARGS...: a ferrum_bench_gptq run (90 s at most),
# each of its rows as one line "LABEL k x n m M: us plan" (wgmmaablate,
# wgmmasplits).
gptq_rows() {
  local label=$1
  shift
  timeout 90 "$@" 2>&1 | awk -v label="$label" -F'|' '/^ *[0-9]+ /{split($1,a," "); split($2,b," "); printf "%s %5s x %5s m %2s: %7s us %s\n", label, a[1], a[2], a[3], b[1], b[4]}'
}

# tokens_md5 LOG: the md5 (8 hex digits) of an engine run's generated tokens,
# one line per sequence ("generated:" alone, "generated[b]:" in a batch);
# "none" where the log has no such line.
tokens_md5() {
  local lines
  lines=$(grep -E '^ *generated(\[[0-9]+\])?:' "$1")
  if [ -z "$lines" ]; then echo none; else echo "$lines" | md5sum | cut -c1-8; fi
}

# gtest_shards BINARY NAME SHARDS SECONDS [GTEST ARGS...]: a test binary in
# SHARDS gtest shards side by side, each its own process (own stream, graph
# slot and cuBLAS handle), line-buffered logs $DETAIL/NAME.N.log (so a
# timeout still leaves them readable), all of them in $DETAIL/NAME.log and
# kept in $OUT where a shard failed. Prints the failed shards, the passed
# and skipped counts and the FAILED lines.
gtest_shards() {
  local bin=$1 name=$2 shards=$3 seconds=$4 i pid failed=0
  shift 4
  local pids=()
  for i in $(seq 0 $((shards - 1))); do
    NCCL_NVLS_ENABLE=0 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$seconds" \
      stdbuf -oL -eL "$bin" --gtest_brief=1 "$@" > "$DETAIL/$name.$i.log" 2>&1 &
    pids+=($!)
  done
  # wait PID returns a child's status even when it exited before the wait.
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  cat "$DETAIL/$name".[0-9]*.log > "$DETAIL/$name.log"
  echo "$(basename "$bin") shards failed: $failed of $shards"
  echo "passed: $(grep -hE '^\[  PASSED  \]' "$DETAIL/$name".[0-9]*.log | awk '{s += $4} END {print s + 0}')," \
    "skipped: $(grep -hE '^\[  SKIPPED \] [0-9]+ test' "$DETAIL/$name".[0-9]*.log | awk '{s += $4} END {print s + 0}')"
  grep -hE "^\[  FAILED  \]|Timeout|terminate" "$DETAIL/$name".[0-9]*.log | head -30
  [ "$failed" -eq 0 ] || keep_log "$DETAIL/$name.log"
}

# sanitize TOOL SECONDS FILTER [TAIL]: compute-sanitizer TOOL over the GPU
# test binary (SANITIZE_BIN, default this build's) with a gtest filter, in
# SANITIZE_SHARDS (default 4) gtest shards side by side (the sanitizers
# are CPU-heavy; the GPU is mostly idle). Prints each shard's last TAIL lines, the error summaries, and one
# exit line: the worst shard's exit code (9: errors found, 124: timeout).
# The full output goes to $DETAIL/TOOL.N.log (N counts the calls of this
# run), and into $OUT when a shard failed.
# racecheck runs only tests that never reach cuBLAS: it reports hazards
# inside cuBLAS's own kernels (nvjet_*, TMA / wgmma shared-memory traffic)
# that no call of ours can change, and they take most of its time.
# (--kernel-name-exclude kns=nvjet is no way out: the run of session 5 with
# it failed every shard.)
# Every engine test (the CLI ones run the engine on the GPU here); the whole
# output is kept in $DETAIL/engine_tests.log (in $OUT too when one failed: a
# failed one prints the engine's log).
run_engine_tests() {
  timeout 180 $B/tests/engine/ferrum_tests_engine --gtest_brief=1 > "$DETAIL/engine_tests.log" 2>&1
  local rc=$?
  echo "engine tests exit $rc"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$DETAIL/engine_tests.log" | head -12
  [ "$rc" -eq 0 ] || keep_log "$DETAIL/engine_tests.log"
}

SANITIZE_RUN=0
sanitize() {
  SANITIZE_RUN=$((SANITIZE_RUN + 1))
  local shards="${SANITIZE_SHARDS:-4}" worst=0 i rc tests
  local dir
  # No more shards than matching tests (an empty shard exits before its
  # first CUDA call, which compute-sanitizer reports as an error).
  local bin="${SANITIZE_BIN:-$B/tests/ferrum_tests_gpu}"
  tests=$("$bin" --gtest_list_tests --gtest_filter="$3" | grep -c '^  ')
  [ "$tests" -lt "$shards" ] && shards=$tests
  if [ "$shards" -lt 1 ]; then
    echo "$1: no test matches '$3'"
    echo "$1 exit 0"
    return
  fi
  dir=$(mktemp -d)
  for i in $(seq 0 $((shards - 1))); do
    ( GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$2" compute-sanitizer --tool "$1" --error-exitcode 9 \
        "$bin" --gtest_filter="$3" > "$dir/$i.log" 2>&1
      echo $? > "$dir/$i.rc" ) &
  done
  wait
  for i in $(seq 0 $((shards - 1))); do
    rc=$(cat "$dir/$i.rc")
    [ "$rc" -gt "$worst" ] && worst=$rc
    echo "-- $1 shard $i of $shards: exit $rc"
    # A shard past its limit: the test it was in (gtest's RUN lines).
    [ "$rc" -eq 124 ] && echo "   at the limit in: $(grep -E '^\[ RUN      \]' "$dir/$i.log" | tail -1)"
    tail -"${4:-3}" "$dir/$i.log"
  done
  cat "$dir"/*.log > "$DETAIL/$1.$SANITIZE_RUN.log"
  grep -hE "ERROR SUMMARY" "$dir"/*.log | sort | uniq -c
  rm -rf "$dir"
  echo "$1 exit $worst"
  [ "$worst" -eq 0 ] || keep_log "$DETAIL/$1.$SANITIZE_RUN.log"
}

{
  echo "== $(date -u) commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown) mode $MODE"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  echo "== configure + build ($(date +%T))"
  # .deps (ignored, carried) holds headers the GPU machine lacks, e.g.
  # nlohmann-json for the engine; without it the engine is left out.
  DEPS=""
  [ -d .deps ] && DEPS="-DCMAKE_PREFIX_PATH=$PWD/.deps"
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release $DEPS >/dev/null
  # A build beside the main one, in the background (JOBS of the 16 jobs,
  # shared): SRC configured into DIR with CMAKE_ARGS, then TARGETS built;
  # prints LABEL's result (a failed configure is reported as such).
  side_build() {  # DIR SRC LABEL JOBS "CMAKE_ARGS" TARGET...
    local dir=$1 src=$2 label=$3 jobs=$4 args=$5
    shift 5
    (
      # shellcheck disable=SC2086  # DEPS and args are lists of arguments
      if ! cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $DEPS $args >/dev/null; then
        echo "$label: configure failed"
      else
        cmake --build "$dir" -j"$jobs" --target "$@" 2>&1 | grep -E "error|FAILED" || echo "$label build ok"
      fi
    ) &
  }
  # ab: base's (and each alt's) two targets.
  if has_mode ab; then
    if [ ! -d base ]; then
      echo "ab: no base/ in this tree (scripts/gpu_tree.sh ... --base REV)"
    else
      for tree in base alt/*; do
        [ -d "$tree" ] || continue
        side_build "$(ab_build_dir "$tree")" "$tree" "$tree ($(cat "$tree/COMMIT" 2>/dev/null))" 6 "" \
          ferrum_engine ferrum_bench_gptq ${AB_OPS_FILTER:+ferrum_bench}
      done
    fi
  fi
  # slicegeom: the tuning tool and the benchmark at each other slice size.
  if has_mode slicegeom; then
    for size in $SLICE_GEOM_SIZES; do
      [ "$size" = 128 ] && continue
      side_build "$(geom_dir "$size")" . "slices of $size" 4 \
        "-DFERRUM_BUILD_TESTS=OFF -DFERRUM_DECODE_MIN_SLICE_KEYS=$size" ferrum_attention_tuning ferrum_bench
    done
  fi
  # patched_tree DIR PATCH: a copy of this tree in DIR with PATCH applied
  # (fails if it does not apply).
  patched_tree() {
    rm -rf "$1" && mkdir -p "$1"
    tar -cf - --exclude='./build*' --exclude='./base' --exclude='./alt' --exclude='./out' . | tar -xf - -C "$1"
    # (The ceiling keeps git from finding a repository around the copy, whose
    # root would change what the patch's paths mean.)
    (cd "$1" && GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$2")
  }
  # wgmmaablate: the tree with docs/design/patches/gptq_wgmma_ablation.patch
  # applied, built once per mask of WGMMA_ABLATE_MASKS (timing only).
  if has_mode wgmmaablate; then
    ABLATE_SRC="${B}-ablate-src"
    patched_tree "$ABLATE_SRC" docs/design/patches/gptq_wgmma_ablation.patch
    if grep -q FERRUM_WGMMA_ABLATE "$ABLATE_SRC/kernels/gptq_gemm_wgmma.cu"; then
      for mask in ${WGMMA_ABLATE_MASKS:-2 4 8 32 46}; do
        side_build "${B}-ablate$mask" "$ABLATE_SRC" "ablation mask $mask" 3 \
          "-DFERRUM_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS=-DFERRUM_WGMMA_ABLATE=$mask" ferrum_bench_gptq
      done
    else
      echo "wgmmaablate: the patch does not apply to this tree"
    fi
  fi
  # decodeablate and decodesource: the tree with docs/design/patches/
  # decode_warp_slices.patch applied, built once as it is (${B}-warp0: the
  # tuning tool, and the tests for decodeablate), and for decodeablate once
  # per ablation mask. The build folders go first, so that a patch that no
  # longer applies leaves no older binary to run.
  if has_mode decodeablate || has_mode decodesource; then
    DA_SRC="${B}-decodeablate-src"
    rm -rf "${B}"-warp[0-9]*
    if patched_tree "$DA_SRC" docs/design/patches/decode_warp_slices.patch; then
      if has_mode decodeablate; then
        side_build "${B}-warp0" "$DA_SRC" "warp slices" 6 "" ferrum_attention_tuning ferrum_tests_gpu
        for mask in ${DECODE_ABLATE_MASKS:-1 2 3}; do
          side_build "${B}-warp$mask" "$DA_SRC" "warp slices, ablation mask $mask" 3 \
            "-DFERRUM_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS=-DFERRUM_DECODE_ABLATE=$mask" ferrum_attention_tuning
        done
      else
        side_build "${B}-warp0" "$DA_SRC" "warp slices (tuning tool)" 8 "-DFERRUM_BUILD_TESTS=OFF" ferrum_attention_tuning
      fi
    else
      echo "decodeablate / decodesource: the patch does not apply to this tree"
    fi
  fi
  # gptqpatch: the tree with GPTQ_PATCH applied, its GPU tests and GPTQ
  # bench (wgmmaworkspace times it too). No earlier call's binaries stand in
  # for a build that is not made or fails.
  rm -rf "${B}-patched"
  if has_mode gptqpatch; then
    if [ -z "${GPTQ_PATCH:-}" ]; then
      echo "gptqpatch: set GPTQ_PATCH to the patch's path in the tree"
    elif patched_tree "${B}-patched-src" "$GPTQ_PATCH"; then
      side_build "${B}-patched" "${B}-patched-src" "patched" 8 "" ferrum_tests_gpu ferrum_bench_gptq
    else
      echo "gptqpatch: $GPTQ_PATCH does not apply to this tree"
    fi
  fi
  # decodepatch: the tree with DECODE_PATCH applied, its tests, bench and
  # tuning tool; no earlier call's binaries stand in for a failed build.
  rm -rf "${B}-dpatched"
  if has_mode decodepatch; then
    if [ -z "${DECODE_PATCH:-}" ]; then
      echo "decodepatch: set DECODE_PATCH to the patch's path in the tree"
    elif patched_tree "${B}-dpatched-src" "$DECODE_PATCH"; then
      side_build "${B}-dpatched" "${B}-dpatched-src" "decode patched" 8 "" ferrum_tests_gpu ferrum_bench \
        ferrum_attention_tuning
    else
      echo "decodepatch: $DECODE_PATCH does not apply to this tree"
    fi
  fi
  # wgmmafold: the tree with docs/design/patches/gptq_wgmma_lop3_fold.patch
  # applied, its GPU tests and GPTQ bench (a kernel to test, not timing only).
  if has_mode wgmmafold; then
    FOLD_SRC="${B}-fold-src"
    if patched_tree "$FOLD_SRC" docs/design/patches/gptq_wgmma_lop3_fold.patch; then
      side_build "${B}-fold" "$FOLD_SRC" "fold" 8 "" ferrum_tests_gpu ferrum_bench_gptq
    else
      echo "wgmmafold: the patch does not apply to this tree"
    fi
  fi
  # ab alone, or wgmmaablate, wgmmasplits, wgmmafold and wgmmaworkspace alone or together, need only
  # their targets (the whole tree, tests included, costs about a minute
  # more of the call).
  MAIN_TARGETS=()
  [ "$MODE" = ab ] && MAIN_TARGETS=(--target ferrum_engine ferrum_bench_gptq ${AB_OPS_FILTER:+ferrum_bench})
  [ "$MODE" = trace ] && MAIN_TARGETS=(--target ferrum_engine ferrum_kernel_trace)
  [ "$MODE" = l2probe ] && MAIN_TARGETS=(--target ferrum_bench_l2_residency ferrum_kernel_trace)
  [ "$MODE" = decodeorder ] && MAIN_TARGETS=(--target ferrum_bench)
  [ "$MODE" = persistentprobe ] && MAIN_TARGETS=(--target ferrum_persistent_layer_probe)
  modes_within "decodeorder decodegap" && [ "$MODE" != decodeorder ] && MAIN_TARGETS=(--target ferrum_bench ferrum_attention_tuning)
  modes_within "trace engineswitches" && [ "$MODE" != trace ] && MAIN_TARGETS=(--target ferrum_engine ferrum_kernel_trace)
  # Tests and the engine only (no benchmark): the test binaries, the NCCL
  # worker the 2-GPU tests spawn, and the engine (session 58: the test
  # targets alone built in 43 s; every device second counts when starts fail).
  # (The engine's targets exist only where the configure found nlohmann-json.)
  if modes_within "verify quicktests engine enginebrief hf"; then
    MAIN_TARGETS=(--target ferrum_tests_gpu ferrum_tests_cpu ferrum_nccl_worker)
    for t in ferrum_tests_engine ferrum_engine; do
      ninja -C "$B" -t query "$t" > /dev/null 2>&1 && MAIN_TARGETS+=("$t")
    done
  fi
  # The decode patch's modes run only their side builds' binaries.
  modes_within "decodeablate decodesource" && MAIN_TARGETS=(--target ferrum_attention_tuning)
  [ "$MODE" = decodepatch ] && MAIN_TARGETS=(--target ferrum_bench ferrum_attention_tuning)
  modes_within "wgmmaablate wgmmasplits wgmmafold wgmmaworkspace gptqpatch" && MAIN_TARGETS=(--target ferrum_bench_gptq ferrum_wgmma_rate ferrum_cluster_placement)
  cmake --build $B -j$([ -d base ] && has_mode ab && echo 10 || echo 16) "${MAIN_TARGETS[@]}" 2>&1 \
    | grep -E "error|warning|FAILED" || echo "build ok"
  wait
} 2>&1 | tee -a "$LOG"

if has_mode tests; then
  {
    echo "== ctest (all labels) ($(date +%T))"
    timeout 300 ctest --test-dir $B --output-on-failure -j14 > "$OUT/ctest.log" 2>&1
    grep -E "tests passed|tests failed|\(Failed\)|\*\*\*Failed|Timeout|Error" "$OUT/ctest.log" | head -40
    # memcheck over the whole GPU binary (the largest shapes are left out:
    # they only lengthen the run, the same kernels run at every other size).
    # The NCCL tests run under memcheck in the nccl mode, on 2 GPUs, with their
    # own log: they fork workers and kill peers on purpose.
    # 14 shards: session 7 ran the whole binary this way in about 30 s.
    echo "== compute-sanitizer memcheck ($(date +%T))"
    SANITIZE_SHARDS=14 sanitize memcheck 240 '-*t4096*:*4096Steps*:*Nccl*' 4
    # racecheck only sees shared memory: norm block reductions, attention
    # tiles, GEMM and argmax reductions (296 tests, about 170 s in session 7;
    # since session 12 every prefill case runs on both prefill kernels, and
    # 2 of 8 shards of the prefill cases alone passed 150 s, hence 300 s).
    echo "== compute-sanitizer racecheck ($(date +%T))"
    SANITIZE_SHARDS=14 sanitize racecheck 300 'Sweep/CudaRowOps.*Norm*:DTypes/CudaUnaligned.*:Specs/CudaFlashAttention.*:DTypes/CudaDeviceState.Flash*:Specs/CudaFlashDecodeRagged.*_case?:DTypes/CudaDecodeBatch.*:Cases/CudaDecodeKnobs.*:Sweep/CudaPrefillAttention.*_case?:Shapes/CudaGemmSkinny.*:CudaArgmax.*:*GemmSiluMul*:CudaGptqStream.*-*t4096*:'"$RACECHECK_NEVER:$RACELONG_TESTS"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode quicktests; then
  # The GPU test binary in gtest shards run side by side (GPU_TEST_SHARDS,
  # default 6): most of its time is the CPU references of the large cases,
  # and the machine has 16 cores.
  {
    SHARDS="${GPU_TEST_SHARDS:-6}"
    echo "== GPU test binary, $SHARDS shards ($(date +%T))"
    gtest_shards $B/tests/ferrum_tests_gpu gputests "$SHARDS" 300
    # The CPU binary's suites that run on every backend (AllBackends/...):
    # their CudaBackend instances (bad input, API, qkv_rope_append, ...).
    echo "== CPU test binary, CUDA instances ($(date +%T))"
    timeout 200 stdbuf -oL -eL $B/tests/ferrum_tests_cpu --gtest_brief=1 --gtest_filter='*/Cuda' \
      > "$DETAIL/cputests_cuda.log" 2>&1
    rc=$?
    echo "ferrum_tests_cpu (CUDA instances) exit $rc"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$DETAIL/cputests_cuda.log" | head -20
    [ "$rc" -eq 0 ] || keep_log "$DETAIL/cputests_cuda.log"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode verify; then
  {
    echo "== verify: engine tests ($(date +%T))"
    run_engine_tests
    echo "== verify: memcheck over '${VERIFY_MEMCHECK:-*Gptq*:*DeviceCheck*}' ($(date +%T))"
    SANITIZE_SHARDS=10 sanitize memcheck 200 "${VERIFY_MEMCHECK:-*Gptq*:*DeviceCheck*}" 1
    # The randomized op calls live in the CPU test binary (their CUDA instance).
    echo "== verify: memcheck over RandomCalls on CUDA ($(date +%T))"
    SANITIZE_BIN=$B/tests/ferrum_tests_cpu SANITIZE_SHARDS=1 sanitize memcheck 240 '*RandomCalls*/Cuda' 3
    if [ -n "${VERIFY_RACECHECK:-}" ]; then
      echo "== verify: racecheck over '$VERIFY_RACECHECK' ($(date +%T))"
      SANITIZE_SHARDS=16 sanitize racecheck "${VERIFY_RACECHECK_S:-300}" "$VERIFY_RACECHECK" 1
    fi
    echo "== verify done ($(date +%T))"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode race; then
  {
    echo "== racecheck: attention decode/prefill, GPTQ ($(date +%T))"
    # The decode knob cases are raceknobs' (one per shard): under racecheck
    # each takes 30-90 s on an H100, and here they held all four shards at
    # their limit (session 60).
    SANITIZE_SHARDS=${SANITIZE_SHARDS:-8} sanitize racecheck 300 'Specs/CudaFlashDecodeRagged.*_case?:Specs/CudaFlashAttention.*_case?:DTypes/CudaDecodeBatch.*:Sweep/CudaPrefillAttention.*_case?:*CudaPrefillLargeGrid*:CudaPrefillWgmma.*:CudaGptqStream.*'
  } 2>&1 | tee -a "$LOG"
fi

if has_mode racelong; then
  {
    echo "== racecheck: the long tests, one shard each ($(date +%T))"
    SANITIZE_SHARDS=2 sanitize racecheck 470 "$RACELONG_TESTS" 3
  } 2>&1 | tee -a "$LOG"
fi

if has_mode raceknobs; then
  {
    echo "== racecheck: every decode knob case, one shard each ($(date +%T))"
    SANITIZE_SHARDS=1000 sanitize racecheck "${RACEKNOBS_S:-420}" "${RACEKNOBS_FILTER:-Cases/CudaDecodeKnobs.*}" 1
  } 2>&1 | tee -a "$LOG"
fi

if has_mode gptq; then
  {
    echo "== GPTQ tests (memcheck, then racecheck) ($(date +%T))"
    sanitize memcheck 200 '*Gptq*:*BadInput*' 25
    # 300 s: one of 8 shards of these tests passed 120 s under racecheck (session 18).
    sanitize racecheck 300 'CudaGptqStream.*:CudaGptqWgmma.*'
  } 2>&1 | tee -a "$LOG"
fi

if has_mode gptq || has_mode gptqbench; then
  {
    echo "== GPTQ benchmarks ($(date +%T))"
    timeout 150 $B/bench/ferrum_bench_gptq $QUICK --json "$OUT/gptq.json" > "$OUT/gptq.log" 2>&1
    echo "ferrum_bench_gptq exit $?"
    # The opt-in streaming kernel (m <= 16) beside the default, same shapes.
    timeout 150 $B/bench/ferrum_bench_gptq $QUICK --kernel stream --json "$OUT/gptq_stream.json" >> "$OUT/gptq.log" 2>&1
    echo "ferrum_bench_gptq --kernel stream exit $?"
    if [ "${SKIP_TORCH_GPTQ:-0}" != 1 ]; then
      timeout 120 python3 bench/gptq_torch.py $QUICK --json "$OUT/gptq_torch.json" >> "$OUT/gptq.log" 2>&1
      echo "gptq_torch exit $?"
    fi
  } 2>&1 | tee -a "$LOG"
fi

# Microseconds the driver has held the GPU at its power cap since it started
# (nvidia-smi's "SW Power Capping" counter; 0 where it cannot say).
power_capped_us() {
  local us
  us=$(nvidia-smi -q -d PERFORMANCE 2>/dev/null | awk -F: '/SW Power Capping/ {gsub(/[^0-9]/, "", $2); print $2; exit}')
  echo "${us:-0}"
}

if has_mode bench; then
  {
    echo "== benchmark ($(date +%T))"
    # A sustained prefill holds an H100 at its 700 W cap (session 72,
    # docs/design/prefill_attention.md §5): say how long each side spent
    # capped, with the SM clock and power sampled every 100 ms beside them.
    nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 100 > "$OUT/bench_smi.csv" 2>/dev/null &
    smi_pid=$!
    cap0=$(power_capped_us)
    timeout 200 $B/bench/ferrum_bench $QUICK "${BF[@]}" --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    echo "ferrum_bench exit $?"
    cap1=$(power_capped_us)
    timeout 240 python3 bench/torch_reference.py $QUICK "${BF[@]}" --compile large --json "$OUT/torch.json" >> "$OUT/bench.log" 2>&1
    echo "torch_reference exit $?"
    cap2=$(power_capped_us)
    kill "$smi_pid" 2>/dev/null
    echo "power capped: $(( (cap1 - cap0) / 1000 )) ms during ferrum_bench, $(( (cap2 - cap1) / 1000 )) ms during torch_reference (clocks: bench_smi.csv)"
    python3 bench/compare.py "$OUT/bench.json" "$OUT/torch.json" --markdown-out "$OUT/compare.md" | tail -n 3
    # GEMM against torch.matmul interleaved in one process (the 3 % verdict).
    if [ "${SKIP_GEMM_INTERLEAVED:-0}" != 1 ]; then
      timeout 150 python3 bench/gemm_interleaved.py --capi $B/bench/libferrum_bench_capi.so --suite decode --skinny-max-m 8 --json "$OUT/gemm.json"
      echo "gemm_interleaved exit $?"
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode engine; then
  {
    echo "== engine (llama3-8b shape, random f16 and bf16 weights) ($(date +%T))"
    # ENGINE_DTYPES="f16 bf16" adds the bf16 runs (each run loads 16 GB of
    # random weights first).
    # Timed runs without --dump-logits (reading the logits back every step
    # would time the host, not the switches); each run's greedy tokens must
    # equal the first (graph) run's. Then one pair with the logits dumped
    # (32 steps): the default against both switches, compared bitwise.
    for dtype in ${ENGINE_DTYPES:-f16}; do
      run=0
      for mode in --graph --eager "--graph --pipeline" "--graph --no-pdl" "--graph --no-pdl-trigger" \
                  "--graph --gemm-prefetch" "--graph --no-gemm-early-weights"; do
        echo "-- $dtype $mode"
        timeout 240 $B/apps/engine/ferrum_engine --random llama3-8b --dtype $dtype --steps 128 $mode \
          > /tmp/ferrum_engine_$run.log 2>&1
        grep -E "backend|model|loaded|decode:|prefill:|error" /tmp/ferrum_engine_$run.log
        if [ $run -gt 0 ]; then
          first=$(tokens_md5 /tmp/ferrum_engine_0.log)
          if [ "$first" != none ] && [ "$first" = "$(tokens_md5 /tmp/ferrum_engine_$run.log)" ]; then
            echo "   tokens equal to --graph"
          else
            echo "   TOKENS DIFFER from --graph (or a run produced none)"
          fi
        fi
        run=$((run + 1))
      done
      rm -f /tmp/ferrum_logits_${dtype}_*.bin
      for mode in --graph "--graph --no-pdl-trigger --gemm-prefetch"; do
        timeout 240 $B/apps/engine/ferrum_engine --random llama3-8b --dtype $dtype --steps 32 $mode \
          --dump-logits "/tmp/ferrum_logits_${dtype}_${mode//[ -]/}.bin" > /dev/null 2>&1
        echo "   dump run $mode exit $?"
      done
      cmp -s /tmp/ferrum_logits_${dtype}_graph.bin /tmp/ferrum_logits_${dtype}_graphnopdltriggergemmprefetch.bin \
        && echo "-- $dtype logits (32 steps): switches on bitwise equal to --graph" \
        || echo "-- $dtype logits (32 steps): SWITCHES CHANGE THE LOGITS"
    done
    # A small model's step is launch-bound: where graph against eager shows
    # (docs/design/engine_decode.md §3).
    echo "== engine, qwen3-0.6b shape, f16: graph against eager ($(date +%T))"
    for mode in --graph --eager; do
      echo "-- qwen3-0.6b $mode"
      timeout 120 $B/apps/engine/ferrum_engine --random qwen3-0.6b --dtype f16 --steps 256 $mode 2>&1 | grep -E "loaded|decode:|error"
    done
    # Batch decoding: sequences of different lengths as the rows of one step
    # (each sequence's tokens are checked against a lone run by the engine
    # tests; here the rate against the bound of B sequences).
    echo "== engine, batch decoding (llama3-8b shape, f16; prompts of 4..1 tokens) ($(date +%T))"
    for batch in 4 16 64; do
      for mode in --graph --eager; do
        echo "-- batch $batch $mode"
        timeout 240 $B/apps/engine/ferrum_engine --random llama3-8b --dtype f16 --steps 64 --prompt-tokens 1,2,3,4 \
          --batch $batch $mode 2>&1 | grep -E "decode:|bound:|error"
      done
    done
    echo "== engine, GPTQ INT4 (llama3-8b shape, random int4 weights, f16) ($(date +%T))"
    # Auto (the streaming kernel, bulk source, with PDL), the steps enqueued
    # back to back (--pipeline), the register source, the weights without
    # the L2 evict-first policy, the GEMM -> norm -> GEMM chains not
    # released ahead (the engine's default for one sequence since session
    # 24), that with the splits planned for every slot (the library's
    # defaults, the engine's before), eager.
    # The same-bits switches (--pipeline, --no-gptq-evict-first,
    # --no-gptq-fuse-silu-mul, --no-gemm-early-weights, --no-pdl-chain-release)
    # must give --graph's tokens; the register source, other splits and
    # eager may round otherwise.
    for mode in --graph "--graph --pipeline" "--graph --no-gptq-fuse-silu-mul" "--graph --no-gemm-early-weights" \
                "--graph --gptq-kernel stream" "--graph --no-gptq-evict-first" "--graph --no-pdl-chain-release" \
                "--graph --no-pdl-chain-release --gptq-ctas-per-sm 0" --eager; do
      echo "-- gptq $mode"
      log="/tmp/ferrum_gptq_${mode//[ -]/}.log"
      timeout 240 $B/apps/engine/ferrum_engine --random llama3-8b --quant gptq --dtype f16 --steps 128 $mode > "$log" 2>&1
      grep -E "backend|model|loaded|decode:|bound:|prefill:|error" "$log"
      case "$mode" in
        *--gptq-ctas-per-sm*) ;;
        *--pipeline* | *--no-gptq-evict-first* | *--no-gptq-fuse-silu-mul* | *--no-gemm-early-weights* | *--no-pdl-chain-release*)
          first=$(tokens_md5 /tmp/ferrum_gptq_graph.log)
          if [ "$first" != none ] && [ "$first" = "$(tokens_md5 "$log")" ]; then
            echo "   tokens equal to --graph"
          else
            echo "   TOKENS DIFFER from --graph (or a run produced none)"
          fi
          ;;
      esac
    done
    if has_mode verify; then
      echo "engine tests: run by verify above"
    else
      run_engine_tests
    fi
    # Where a graph-replayed decode step spends its time, per kernel (Nsight
    # Systems when the machine has it).
    if command -v nsys >/dev/null; then
      timeout 240 nsys profile --force-overwrite true -o /tmp/ferrum_engine_prof --cuda-graph-trace node \
        $B/apps/engine/ferrum_engine --random llama3-8b --dtype f16 --steps 64 --graph > /dev/null 2>&1
      nsys stats --report cuda_gpu_kern_sum --format csv /tmp/ferrum_engine_prof.nsys-rep > "$OUT/engine_kernels.csv" 2>/dev/null
      echo "nsys engine profile exit $? ($(wc -l < "$OUT/engine_kernels.csv") lines)"
    else
      echo "nsys not found: no per-kernel engine profile"
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode enginebrief; then
  {
    echo "== engine, brief: one run per bar of issue 6 ($(date +%T))"
    if has_mode verify || has_mode engine; then
      echo "engine tests: run above"
    else
      run_engine_tests
    fi
    for run in "llama3-8b --dtype f16 --graph" "llama3-8b --dtype f16 --eager" \
               "llama3-8b --quant gptq --dtype f16 --graph" "llama3-8b --quant gptq --dtype f16 --eager" \
               "qwen3-0.6b --dtype f16 --graph" "qwen3-0.6b --dtype f16 --eager"; do
      echo "-- $run"
      # shellcheck disable=SC2086 # the run's words are the engine's arguments
      timeout 150 $B/apps/engine/ferrum_engine --random $run --steps 128 2>&1 | grep -E "backend|loaded|decode:|bound:|error"
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode hf; then
  {
    echo "== engine vs transformers (scripts/hf_check.py) ($(date +%T))"
    # HF_CHECK_S: its limit in seconds (360: five models, graph and eager each).
    timeout "${HF_CHECK_S:-360}" python3 scripts/hf_check.py --engine $B/apps/engine/ferrum_engine --workdir /tmp/ferrum_hf_check \
      --json "$OUT/hf_check.json" > "$OUT/hf_check.log" 2>&1
    echo "hf_check exit $?"
    grep -E "PASS|FAIL|SKIPPED|OVERALL|PROBLEM" "$OUT/hf_check.log" | head -30
  } 2>&1 | tee -a "$LOG"
fi

if has_mode sdpa; then
  {
    echo "== flash_attention vs torch SDPA, float64 reference (scripts/sdpa_check.py) ($(date +%T))"
    cmake --build "$B" -j16 --target ferrum_bench_capi > "$OUT/build_capi.log" 2>&1 || tail -20 "$OUT/build_capi.log"
    timeout 240 python3 scripts/sdpa_check.py --capi $B/bench/libferrum_bench_capi.so --json "$OUT/sdpa_check.json" \
      > "$OUT/sdpa_check.log" 2>&1
    echo "sdpa_check exit $?"
    grep -E "PASS|FAIL|sdpa_check:" "$OUT/sdpa_check.log" | head -30
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodesweep; then
  # DecodeTuning::tail_free_slices (the default) against the rules before it
  # and each explicit slices-per-block choice (decode_attention.md §4.9).
  DECODE_SWEEP="${DECODE_SWEEP:-3:8192 6:8192 10:8192 12:8192 14:8192 18:8192 24:8192 28:8192 6:12288 12:12288 16:12288 20:12288 24:12288 32:12288 6:16384 10:16384 18:16384 20:16384 24:16384 30:16384 6:32768 10:32768 12:32768 16:32768 18:32768 24:32768 30:32768 4:131072 6:131072 10:131072 16:131072 20:131072 30:131072}"
  {
    echo "== decode slices-per-block sweep ($(date +%T))"
    read -r -a sweep_points <<< "$DECODE_SWEEP"
    : > "$OUT/decode_sweep.log"
    for pass in 1 2; do
      points=("${sweep_points[@]}")
      if [ "$pass" = 2 ]; then
        points=()
        for ((i = ${#sweep_points[@]} - 1; i >= 0; i--)); do points+=("${sweep_points[i]}"); done
      fi
      for point in "${points[@]}"; do
        echo "# pass $pass point $point" >> "$OUT/decode_sweep.log"
        timeout 60 $B/bench/ferrum_attention_tuning decode-exp "${point%%:*}" "${point##*:}" >> "$OUT/decode_sweep.log" 2>&1 ||
          echo "# point $point exit $?" >> "$OUT/decode_sweep.log"
      done
      echo "pass $pass done ($(date +%T))"
    done
    python3 bench/decode_sweep_summary.py "$OUT/decode_sweep.log" ${DECODE_SWEEP_VERSUS:+--versus "$DECODE_SWEEP_VERSUS"} |
      tee "$OUT/decode_sweep.md"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode tuning; then
  # Launch-knob sweeps through the launchers (A/B runs in one binary).
  {
    echo "== attention launch knobs (ferrum_attention_tuning) ($(date +%T))"
    timeout 240 $B/bench/ferrum_attention_tuning > "$OUT/attention_tuning.log" 2>&1
    echo "ferrum_attention_tuning exit $?"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode profile; then
  # Nsight Compute on the kernels still below their bars (one launch each,
  # clocks left alone), and racecheck's hazard report with source lines.
  {
    echo "== ncu profiles ($(date +%T))"
    NCU=(ncu --clock-control none --set detailed --launch-skip 12 --launch-count 1)
    timeout 120 "${NCU[@]}" -k regex:gptq_fused $B/bench/ferrum_bench_gptq --quick --iters 20 > "$OUT/ncu_gptq_m1.txt" 2>&1
    echo "ncu gptq exit $?"
    # The wgmma GPTQ kernel at m = 64 (docs/design/gptq_small_m.md §10): the
    # stall reasons per SASS instruction of its k16 step, as CSV.
    timeout 120 ncu --clock-control none -k regex:gptq_wgmma --launch-skip 3 --launch-count 1 --section SourceCounters \
      --page source --print-source sass --csv $B/bench/ferrum_bench_gptq --kernel wgmma --shapes 8192x28672 --ms 64 \
      --iters 5 > "$OUT/ncu_gptq_wgmma_m64_source.csv" 2>&1
    echo "ncu gptq wgmma exit $?"
    # Decode where it misses: B = 1 latency and bandwidth (L = 1k, 32k) and
    # B = 64 behind cuDNN (L = 1k, 8k; one slice per block at 8k).
    for point in 1:1024 1:32768 64:1024 64:8192; do
      b=${point%%:*} L=${point##*:}
      timeout 120 "${NCU[@]}" -k regex:attention_decode $B/bench/ferrum_bench --reps 20 \
        --filter "attention_decode f16 B=$b L=$L " > "$OUT/ncu_decode_B${b}_L$L.txt" 2>&1
      echo "ncu decode B=$b L=$L exit $?"
    done
    timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 6 $B/tests/ferrum_tests_gpu \
      --gtest_brief=1 --gtest_filter='Specs/CudaFlashDecodeRagged.*_case1:CudaGptq*' > "$OUT/racecheck_detail.txt" 2>&1
    echo "racecheck detail exit $?"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode engineswitches; then
  # The engine's launch switches on a model whose step is short (where the
  # launches and their overlap are a large share of it), graph, alternated
  # within each round so that drift hits every set alike; eager beside them.
  {
    model="${SWITCH_MODEL:-qwen3-0.6b}"
    quant=$([ "${SWITCH_QUANT:-}" = gptq ] && echo "--quant gptq" || true)
    echo "== engine switches: $model ${quant:-f16}, graph, ${SWITCH_ROUNDS:-3} rounds ($(date +%T))"
    sets=("--graph" "--graph --gemm-prefetch" "--graph --pdl-chain-release" "--graph --no-pdl-chain-release"
      "--graph --no-pdl-trigger" "--graph --no-gemm-early-weights" "--graph --attention-early-kv"
      "--graph --no-attention-early-kv" "--graph --no-pdl"
      "--eager")
    for round in $(seq 1 "${SWITCH_ROUNDS:-3}"); do
      for set in "${sets[@]}"; do
        log="$DETAIL/switches_${round}_${set//[ -]/}.log"
        # shellcheck disable=SC2086  # quant and set are lists of arguments
        timeout 60 $B/apps/engine/ferrum_engine --random "$model" $quant --dtype f16 --steps 256 $set > "$log" 2>&1
        rate=$(grep -oE '\([0-9.]+ tokens/s\)' "$log" | tr -d '()')
        [ "$set" = --graph ] && first="$(tokens_md5 "$log")"
        same=$([ "$(tokens_md5 "$log")" = "${first:-x}" ] && echo "tokens equal" || echo "TOKENS DIFFER")
        printf 'round %s %-32s %s  %s\n' "$round" "$set" "${rate:-no rate (see $log)}" "$same"
      done
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode gptqpatch; then
  # A GPTQ kernel patch before it lands: the patched build's tests (the same
  # bits as main's, which its tests compare against the CPU), memcheck over
  # them, then both builds' kernels alternated, two passes.
  {
    PB="${B}-patched"
    patched_tests "$PB" "gptqpatch ($(basename "$GPTQ_PATCH"))" '*Gptq*' 'CudaGptq*'
    echo "== GPTQ kernels, main against patched ($(date +%T))"
    for pass in 1 2; do
      for build in main patched; do
        bin=$(ab_binary "$build" "$PB" bench/ferrum_bench_gptq)
        [ -x "$bin" ] || continue
        gptq_rows "pass $pass $build bulk" "$bin" --kernel bulk --ms 1,8 \
          --shapes 4096x4096,14336x1024,8192x3840,14336x4096,8192x8192,8192x28672
        gptq_rows "pass $pass $build stream" "$bin" --kernel stream --ms 1 --shapes 4096x4096,14336x4096,8192x28672
        gptq_rows "pass $pass $build fused" "$bin" --kernel fused --ms 17,33,64 --shapes 4096x4096,8192x8192,14336x4096
        gptq_rows "pass $pass $build auto" "$bin" --kernel auto --ms 1,8,16,64 --shapes 4096x4096,14336x4096,8192x28672
      done
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodepatch; then
  # A decode kernel patch before it lands: the patched build's decode tests
  # (knob variants bitwise against each other, batch against single, the
  # flash specs against the CPU), memcheck over them, then main against
  # patched on ferrum_bench's decode points and in decode-exp.
  {
    DB="${B}-dpatched"
    DECODE_TESTS='*Decode*:*FlashAttention*:*FlashDecodeRagged*:*DeviceState.Flash*'
    patched_tests "$DB" "decodepatch ($(basename "${DECODE_PATCH:-none}"))" "$DECODE_TESTS" "$DECODE_TESTS-*4096Steps*"
    points="${DECODE_PATCH_POINTS:-B=64 L=1024,B=16 L=1024,B=1 L=1024,B=1 L=4096,B=1 L=32768,B=16 L=8192,B=64 L=8192}"
    echo "== decode, patched against main: ferrum_bench ($(date +%T))"
    ops_ab "$points" "$OUT/decodepatch.md" "patched=$DB/bench/ferrum_bench" "main=$B/bench/ferrum_bench"
    for point in ${DECODE_PATCH_EXP-64:1024 16:8192 64:8192}; do  # set and empty: none
      for build in main patched; do
        bin=$(ab_binary "$build" "$DB" bench/ferrum_attention_tuning)
        [ -x "$bin" ] || continue
        echo "-- decode-exp ${point%%:*} ${point##*:}, $build"
        timeout 60 "$bin" decode-exp "${point%%:*}" "${point##*:}" 2>&1 | grep -E "^[0-9]+ "
      done
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode wgmmaworkspace; then
  # Why the wgmma GPTQ kernel's workspace reduction costs so much more than
  # its cluster reduction (docs/design/gptq_small_m.md §13.15: 4096^2 m = 64
  # 55 against 16 us at 6 splits), and whether a patch (session 50: the
  # chunked finish, 4 quads at a time with 4 splits' loads in flight) mends
  # it: both reductions of main and of gptqpatch's patched build (tested by
  # that mode) timed in two alternated passes, then ncu on one launch of
  # main's each way and the workspace launch's stalls per SASS line as CSV.
  {
    CB="${B}-patched"
    [ -x "$CB/bench/ferrum_bench_gptq" ] || echo "wgmmaworkspace: no patched build (gptqpatch with GPTQ_PATCH makes one)"
    echo "== wgmma workspace against cluster reduction, main and patched ($(date +%T))"
    for pass in 1 2; do
      for build in main patched; do
        bin=$(ab_binary "$build" "$CB" bench/ferrum_bench_gptq)
        [ -x "$bin" ] || continue
        for reduce in cluster workspace; do
          flag=""
          [ "$reduce" = workspace ] && flag=--no-cluster-reduce
          gptq_rows "pass $pass $build $reduce" "$bin" --kernel wgmma $flag --ms 9,16,32,64 \
            --shapes 4096x4096,8192x8192,14336x4096,8192x28672
        done
        gptq_rows "pass $pass $build auto" "$bin" --kernel auto --ms 1,8,16,64 --shapes 4096x4096,14336x4096,8192x28672
        # The fused kernel's m <= 64 configuration shares the split-K finish.
        gptq_rows "pass $pass $build fused" "$bin" --kernel fused --ms 33,64 --shapes 4096x4096,8192x8192
      done
    done
    NCU=(ncu --clock-control none --set detailed -k regex:gptq_wgmma --launch-skip 5 --launch-count 1)
    ONE=(--kernel wgmma --shapes 4096x4096 --ms 64 --iters 5)
    timeout 120 "${NCU[@]}" $B/bench/ferrum_bench_gptq "${ONE[@]}" > "$OUT/ncu_wgmma_cluster.txt" 2>&1
    echo "ncu cluster exit $?"
    timeout 120 "${NCU[@]}" $B/bench/ferrum_bench_gptq "${ONE[@]}" --no-cluster-reduce > "$OUT/ncu_wgmma_workspace.txt" 2>&1
    echo "ncu workspace exit $?"
    timeout 120 ncu --clock-control none -k regex:gptq_wgmma --launch-skip 5 --launch-count 1 --section SourceCounters \
      --page source --print-source sass --csv $B/bench/ferrum_bench_gptq "${ONE[@]}" --no-cluster-reduce \
      > "$OUT/ncu_wgmma_workspace_source.csv" 2>&1
    echo "ncu workspace source exit $?"
    if [ -x "$CB/bench/ferrum_bench_gptq" ]; then
      timeout 120 "${NCU[@]}" "$CB/bench/ferrum_bench_gptq" "${ONE[@]}" --no-cluster-reduce \
        > "$OUT/ncu_wgmma_workspace_patched.txt" 2>&1
      echo "ncu workspace (patched) exit $?"
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode normprobe; then
  {
    echo "== fused_add_rms_norm [32768 x 4096], f16 against bf16 ($(date +%T))"
    for pass in 1 2 3; do
      for dt in f16 bf16; do
        timeout 60 $B/bench/ferrum_bench --filter "fused_add_rms_norm $dt [32768 x 4096]" 2>&1 |
          grep -E "^fused_add_rms_norm" | sed "s/^/pass $pass: /"
      done
    done
    for dt in f16 bf16; do
      timeout 120 ncu --clock-control none -k regex:norm_rows --launch-skip 6 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_elapsed.avg.per_second,dram__cycles_elapsed.avg.per_second \
        $B/bench/ferrum_bench --reps 10 --filter "fused_add_rms_norm $dt [32768 x 4096]" > "$OUT/ncu_fused_add_$dt.txt" 2>&1
      echo "ncu fused_add_rms_norm $dt exit $?"
      grep -E "Duration|DRAM Throughput|dram__bytes|cycles_elapsed.avg.per_second|Memory Throughput" "$OUT/ncu_fused_add_$dt.txt"
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode trace; then
  # Where a decode step's time goes as it runs (PDL overlap included), from
  # CUPTI's kernel records: eager steps, since CUPTI slows a graph replay by
  # ~25 % (bench/kernel_trace.cpp). The summary is per kernel and grid:
  # its time on the GPU and how far it pushed the step's end.
  {
    # TRACE_RUNS: space-separated model:quant[:flags] (quant gptq or f16;
    # flags: engine switches without their dashes, comma-separated, e.g.
    # llama3-8b:gptq:attention-early-kv).
    for run in ${TRACE_RUNS:-llama3-8b:gptq llama3-8b:f16}; do
      model=${run%%:*}
      rest=${run#*:}
      name=${rest%%:*}
      flags=""
      [ "$rest" != "$name" ] && flags=$(echo "${rest#*:}" | sed 's/^/--/; s/,/ --/g')
      case "$name" in
        gptq | f16) ;;
        *) echo "trace: '$run' is not model:gptq[:flags] or model:f16[:flags]"; continue ;;
      esac
      quant=$([ "$name" = gptq ] && echo "--quant gptq" || true)
      csv="$OUT/trace_${model}_$name${flags:+_${rest#*:}}.csv"
      echo "== kernel trace: $model $name $flags, eager ($(date +%T))"
      rm -f "$csv"  # a run that dies writes none: never summarise an old one
      # shellcheck disable=SC2086  # quant and flags are lists of arguments
      timeout 240 env LD_PRELOAD=$B/bench/libferrum_kernel_trace.so FERRUM_KERNEL_TRACE="$csv" \
        $B/apps/engine/ferrum_engine --random "$model" $quant $flags --dtype f16 --eager --steps 16 2>&1 | grep -E "decode:|trace"
      python3 bench/kernel_trace_summary.py "$csv" --steps 8
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodeorder; then
  {
    # DECODEORDER_CASE: the case timed; DECODEORDER_BEFORE: the cases run
    # before it in one process (';' between them); DECODEORDER_PAUSES: the
    # idle times tried before each case (ms).
    case_filter="${DECODEORDER_CASE:-B=64 L=8192}"
    echo "== the decode $case_filter after other cases ($(date +%T))"
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory \
      --format=csv -lms 100 > "$OUT/decodeorder_smi.csv" 2>&1 &
    smi_pid=$!
    IFS=';' read -r -a befores <<< "${DECODEORDER_BEFORE:-B=16 L=131072}"
    for before in "${befores[@]}"; do
      [ -n "$before" ] || continue
      for pause in ${DECODEORDER_PAUSES:-0 3000}; do
        echo "-- $before, then $case_filter; --pause-ms $pause --settle-gbps 0 ($(date +%T))"
        timeout 150 $B/bench/ferrum_bench --pause-ms $pause --settle-gbps 0 --filter "$before,$case_filter" 2>&1 \
          | grep -E "^attention_decode|ERROR"
      done
      echo "-- $before, then $case_filter; the bench's default idle ($(date +%T))"
      timeout 150 $B/bench/ferrum_bench --filter "$before,$case_filter" 2>&1 | grep -E "^attention_decode|ERROR"
    done
    echo "-- $case_filter alone ($(date +%T))"
    timeout 90 $B/bench/ferrum_bench --filter "$case_filter" 2>&1 | grep -E "^attention_decode|ERROR"
    kill "$smi_pid" 2>/dev/null
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodegap; then
  {
    point="${DECODEGAP_POINT:-64:1024}"
    gb="${point%%:*}" gl="${point##*:}"
    echo "== decode B = $gb L = $gl: ferrum_bench against decode-exp ($(date +%T))"
    for pass in 1 2; do
      echo "-- ferrum_bench alone, pass $pass"
      timeout 60 $B/bench/ferrum_bench --filter "attention_decode f16 B=$gb L=$gl " 2>&1 | grep -E "^attention_decode|ERROR"
      echo "-- decode-exp, pass $pass"
      timeout 60 $B/bench/ferrum_attention_tuning decode-exp "$gb" "$gl" 2>&1 | grep -E "^ *B |default|packed|v\+36k|failed"
    done
    # One launch of each under ncu (serialized: no launch overlaps another),
    # the lines of its report kept:
    ncu_keep="Duration|Grid Size|Block Size|Registers|Shared Memory Config|Dynamic Shared|DRAM Throughput"
    ncu_keep+="|Memory Throughput|Elapsed Cycles|SM Frequency|DRAM Frequency|Achieved Occupancy|==PROF==|ERROR"
    NCU=(ncu --clock-control none -k regex:attention_decode --launch-skip 8 --launch-count 1
         --section LaunchStats --section SpeedOfLight --section Occupancy)
    echo "-- ncu: ferrum_bench's launch"
    timeout 90 "${NCU[@]}" $B/bench/ferrum_bench --reps 20 --filter "attention_decode f16 B=$gb L=$gl " 2>&1 |
      grep -E "$ncu_keep"
    echo "-- ncu: decode-exp's default launch"
    timeout 90 "${NCU[@]}" $B/bench/ferrum_attention_tuning decode-exp "$gb" "$gl" 2>&1 |
      grep -E "$ncu_keep"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode l2probe; then
  {
    echo "== L2 residency probe ($(date +%T))"
    timeout 240 $B/bench/ferrum_bench_l2_residency --reps 11 --window 6 2>&1 | tee "$OUT/l2_residency.txt"
    echo "== the same, one shape under the CUPTI tracer ($(date +%T))"
    csv="$OUT/l2_residency_trace.csv"
    modes="${L2PROBE_MODES:-cold,hint,lines,load,self,loadS}"
    rm -f "$csv" "$csv.gz"  # a run that dies writes none: never summarise an old one
    timeout 120 env LD_PRELOAD=$B/bench/libferrum_kernel_trace.so FERRUM_KERNEL_TRACE="$csv" \
      $B/bench/ferrum_bench_l2_residency --reps 3 --window 6 --only "${L2PROBE_ONLY:-qwen3-0.6b o}" \
      --modes "$modes" 2>&1 | tail -n 8
    if [ -s "$csv" ]; then
      python3 bench/l2_residency_trace.py "$csv" --modes "$modes" --window 6 | tee "$OUT/l2_residency_trace.txt"
      gzip -f "$csv"
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode persistentprobe; then
  {
    echo "== persistent layer probe ($(date +%T))"
    timeout 240 $B/bench/ferrum_persistent_layer_probe --prefetch-kb "${PERSISTENT_PREFETCH_KB:-16,64,128}" 2>&1 \
      | tee "$OUT/persistent_layer_probe.md"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode gptqtimeline; then
  # The GPTQ streaming kernel's per-CTA phases inside the llama3-8b GPTQ
  # decode step (a second build with -DFERRUM_GPTQ_TIMELINE=ON, only the
  # library and bench/gptq_timeline.cpp): the engine's plan, then without
  # the chain release and the CTA cap (the library's defaults), then with
  # the norms in the GPTQ launches (--row-sq-norms), graph; the last layer's
  # four launches printed, the last 16 in each CSV.
  {
    TB="${B}-timeline"
    echo "== GPTQ timeline build ($(date +%T))"
    DEPS=""
    [ -d .deps ] && DEPS="-DCMAKE_PREFIX_PATH=$PWD/.deps"
    cmake -S . -B "$TB" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRUM_GPTQ_TIMELINE=ON $DEPS >/dev/null
    cmake --build "$TB" -j16 --target ferrum_gptq_timeline 2>&1 | grep -E "error|FAILED" || echo "build ok"
    for plan in "" "--no-chain --ctas-per-sm 0" "--row-sq-norms"; do
      echo "== ferrum_gptq_timeline $plan ($(date +%T))"
      timeout 120 "$TB/apps/engine/ferrum_gptq_timeline" $plan --print-last 4 --csv "$OUT/gptq_timeline${plan//[ -]/}.csv"
    done
    # The large one-split shapes standalone (m = 1, library defaults): does
    # the launch end on the SMs that hold more of its CTAs?
    for shape in 8192x28672 4096x28672 8192x8192; do
      echo "== ferrum_gptq_timeline --gemm $shape ($(date +%T))"
      timeout 60 "$TB/apps/engine/ferrum_gptq_timeline" --gemm "$shape"
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodetimeline; then
  # The decode kernel's per-block phases and its launch's schedule (a second
  # build with -DFERRUM_DECODE_TIMELINE=ON, only the library and
  # ferrum_attention_tuning): B = 1 at 1k and 4k (latency), B = 16 at 8k and
  # B = 64 at 1k (the points behind cuDNN: are the SMs' block slots kept
  # full, and what do the waves and the merge tail cost?), or the B:L points
  # of DECODE_TIMELINE_POINTS.
  {
    TB="${B}-dtimeline"
    echo "== decode timeline build ($(date +%T))"
    cmake -S . -B "$TB" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRUM_DECODE_TIMELINE=ON >/dev/null
    cmake --build "$TB" -j16 --target ferrum_attention_tuning 2>&1 | grep -E "error|FAILED" || echo "build ok"
    read -r -a timeline_points <<< "${DECODE_TIMELINE_POINTS:-1:1024 1:4096 16:8192 64:1024}"
    for point in "${timeline_points[@]}"; do
      echo "== ferrum_attention_tuning timeline ${point%%:*} ${point##*:} ($(date +%T))"
      timeout 60 "$TB/bench/ferrum_attention_tuning" timeline "${point%%:*}" "${point##*:}"
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode wgmmaablate; then
  # Which of the wgmma GPTQ kernel's loop work holds it at ~50 cycles per
  # wgmma where wgmma alone takes 16-32 (docs/design/gptq_small_m.md
  # §13.12): wgmma alone (ferrum_wgmma_rate), then the kernel with each
  # ablation mask against main (mask 0), two passes, the second in reverse
  # order. Timing only: the ablated builds' results are wrong.
  {
    echo "== wgmma alone ($(date +%T))"
    timeout 60 $B/bench/ferrum_wgmma_rate --steps 32768
    read -ra masks <<< "0 ${WGMMA_ABLATE_MASKS:-2 4 8 32 46}"
    for pass in 1 2; do
      mapfile -t order < <(pass_order "$pass" "${masks[@]}")
      for mask in "${order[@]}"; do
        dir="${B}-ablate$mask"
        [ "$mask" = 0 ] && dir="$B"
        [ -x "$dir/bench/ferrum_bench_gptq" ] || { echo "mask $mask: no build"; continue; }
        gptq_rows "pass $pass mask $mask" "$dir/bench/ferrum_bench_gptq" --kernel wgmma --ms "${WGMMA_ABLATE_MS:-16,32,64}" \
          --shapes "${WGMMA_ABLATE_SHAPES:-8192x28672,8192x8192,4096x28672}"
      done
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodeablate; then
  # One warp per slice (decode_attention.md §4.20): its bits against the
  # block-merge kernel (the knob tests compare them), then where the slice
  # boundaries' cost lies: decode-exp's rows of both kernels in the plain
  # patched build and with the partial stores (mask 1), the row merge (2) or
  # both (3) left out, two passes, the second in reverse order.
  {
    echo "== warp slices: the decode knob and batch tests ($(date +%T))"
    if [ -x "${B}-warp0/tests/ferrum_tests_gpu" ]; then
      timeout 150 "${B}-warp0/tests/ferrum_tests_gpu" --gtest_filter='*DecodeKnobs*:*DecodeBatch*' 2>&1 \
        | grep -E "FAILED|PASSED|changed" | head -20
    else
      echo "no patched test build"
    fi
    read -ra masks <<< "0 ${DECODE_ABLATE_MASKS:-1 2 3}"
    for pass in 1 2; do
      mapfile -t order < <(pass_order "$pass" "${masks[@]}")
      for mask in "${order[@]}"; do
        bin="${B}-warp$mask/bench/ferrum_attention_tuning"
        [ -x "$bin" ] || { echo "mask $mask: no build"; continue; }
        for point in ${DECODE_ABLATE_POINTS:-64:1024 16:1024 16:8192}; do
          echo "-- pass $pass mask $mask B:L $point"
          timeout 60 "$bin" decode-exp "${point%%:*}" "${point##*:}" 2>&1 \
            | grep -E "^[0-9]+ +[0-9]+ +(default|warpauto|warpglob|warp|warpspb4|warpspb8) "
        done
      done
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode decodesource; then
  # Where the decode's warps stall, per SASS instruction (ncu's source
  # counters over one launch): the block-merge kernel (decode-exp's
  # default) and the warp-slice kernel with its shared partials (warpauto)
  # at DECODESOURCE_POINT (B:L, default 64:1024), each CSV summarized by
  # bench/ncu_source_summary.py and kept in $OUT. (Session 62: the
  # warp-slice kernel without its row merge ran 4 us faster at B = 64
  # L = 1k; this says where in the code the time goes.)
  {
    point="${DECODESOURCE_POINT:-64:1024}"
    bin="${B}-warp0/bench/ferrum_attention_tuning"
    echo "== decode source counters at B:L $point ($(date +%T))"
    if [ -x "$bin" ]; then
      for kernel in attention_decode_kernel attention_decode_warp_slices_kernel; do
        csv="$OUT/ncu_source_${kernel}.csv"
        timeout 120 ncu --clock-control none -k "regex:${kernel}" --launch-skip 2 --launch-count 1 \
          --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
          "$bin" decode-exp "${point%%:*}" "${point##*:}" > "$csv" 2>&1
        echo "-- $kernel: ncu exit $?"
        python3 bench/ncu_source_summary.py "$csv" --top 30
      done
    else
      echo "no patched tuning-tool build"
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode wgmmafold; then
  # The lop3 A with the per-block fold (gptq_small_m.md §13.13): the rate
  # tool's core first, then the patched kernel's GPTQ GPU tests (6 shards),
  # memcheck and racecheck over its wgmma tests, then the wgmma kernel
  # forced, patched against main, two passes alternated.
  {
    echo "== wgmma rate, the lop3 rows ($(date +%T))"
    timeout 90 $B/bench/ferrum_wgmma_rate --steps 32768 | grep -E "variant|n16|n32|n64 \+dq |n64 \+lop3"
    FB="${B}-fold"
    if [ -x "$FB/tests/ferrum_tests_gpu" ]; then
      echo "== fold: *Gptq* GPU tests ($(date +%T))"
      gtest_shards "$FB/tests/ferrum_tests_gpu" fold_tests 6 240 --gtest_filter='*Gptq*'
      echo "== fold: memcheck and racecheck over CudaGptqWgmma.* ($(date +%T))"
      SANITIZE_BIN="$FB/tests/ferrum_tests_gpu" SANITIZE_SHARDS=8 sanitize memcheck 150 'CudaGptqWgmma.*' 1
      SANITIZE_BIN="$FB/tests/ferrum_tests_gpu" SANITIZE_SHARDS=8 sanitize racecheck 150 'CudaGptqWgmma.*' 1
      echo "== fold against main, --kernel wgmma ($(date +%T))"
      for pass in 1 2; do
        for build in main fold; do
          bin="$B/bench/ferrum_bench_gptq"
          [ "$build" = fold ] && bin="$FB/bench/ferrum_bench_gptq"
          gptq_rows "pass $pass $build" "$bin" --kernel wgmma --ms 9,12,16,24,32 \
            --shapes "${WGMMA_SPLIT_SHAPES:-4096x4096,14336x4096,4096x6144,4096x14336,8192x8192,4096x28672,8192x28672}"
        done
      done
    else
      echo "wgmmafold: no patched build"
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode wgmmasplits; then
  # The wgmma kernel's split count: at 16 column tiles six splits beat
  # eight by 6-14 %, the plan's since session 47 (gptq_small_m.md §13.14).
  # One line per shape, m and split count (0 = the plan), two passes.
  {
    # Where clusters of each split count land (SMs with 0, 1, 2 CTAs), at
    # the column-tile counts of the sweep's shapes.
    echo "== cluster placement ($(date +%T))"
    timeout 60 $B/bench/ferrum_cluster_placement --n-ctas 14,16,24,56,112 --splits 2,4,5,6,7,8
    echo "== wgmma split sweep ($(date +%T))"
    for pass in 1 2; do
      for s in ${WGMMA_SPLITS:-0 4 5 6 7 8}; do
        gptq_rows "pass $pass splits $s" $B/bench/ferrum_bench_gptq --kernel wgmma --ms 16,32,64 --splits $s \
          --shapes "${WGMMA_SPLIT_SHAPES:-4096x4096,14336x4096,4096x6144,4096x14336,8192x8192,4096x28672,8192x28672}"
      done
    done
  } 2>&1 | tee -a "$LOG"
fi

if has_mode slicegeom; then
  {
    echo "== decode slice size for short caches ($(date +%T))"
    read -r -a geom_sizes <<< "$SLICE_GEOM_SIZES"
    GEOM_POINTS="${SLICE_GEOM_POINTS:-1:1024 1:2048 1:4096 4:1024 4:4096 8:1024 8:4096 16:1024 16:2048 16:4096 24:2048 32:1024 32:4096 48:1024 64:1024 64:2048 64:4096}"
    read -r -a geom_points <<< "$GEOM_POINTS"
    for size in "${geom_sizes[@]}"; do : > "$DETAIL/slicegeom_$size.log"; done
    for pass in 1 2; do
      for point in "${geom_points[@]}"; do
        for size in "${geom_sizes[@]}"; do
          echo "# pass $pass point $point" >> "$DETAIL/slicegeom_$size.log"
          timeout 60 "$(geom_dir "$size")/bench/ferrum_attention_tuning" decode-exp "${point%%:*}" "${point##*:}" \
            >> "$DETAIL/slicegeom_$size.log" 2>&1 || echo "# point $point exit $?" >> "$DETAIL/slicegeom_$size.log"
        done
      done
      echo "pass $pass done ($(date +%T))"
    done
    for size in "${geom_sizes[@]}"; do
      echo "== smallest slices of $size keys: decode-exp (µs, mean of two passes)"
      python3 bench/decode_sweep_summary.py "$DETAIL/slicegeom_$size.log"
      echo "== slices of $size keys: ferrum_bench, B = 1"
      timeout 120 "$(geom_dir "$size")/bench/ferrum_bench" --filter "attention_decode f16 B=1 " 2>&1 | grep -E "attention_decode|copy"
    done
    echo "== the default launch at each slice size (µs, slices per block)"
    geom_logs=()
    for size in "${geom_sizes[@]}"; do geom_logs+=("$size=$DETAIL/slicegeom_$size.log"); done
    python3 bench/decode_sweep_summary.py --builds "${geom_logs[@]}"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode rowsq; then
  {
    echo "== engine: --gptq-row-sq-norms against the default ($(date +%T))"
    ROWSQ_FLAGS="--random llama3-8b --dtype f16 --quant gptq --steps 128 --graph"
    for i in $(seq 1 "${AB_RUNS:-2}"); do
      for extra in "" "--gptq-row-sq-norms"; do
        timeout 120 $B/apps/engine/ferrum_engine $ROWSQ_FLAGS $extra > /tmp/ferrum_rowsq.log 2>&1
        rc=$?
        echo "-- [${extra:-default}] run $i: exit $rc$(grep -E 'decode:' /tmp/ferrum_rowsq.log | tr -s ' ') tokens $(tokens_md5 /tmp/ferrum_rowsq.log)"
        grep -E "error|Error" /tmp/ferrum_rowsq.log | head -3
      done
    done
    rm -f /tmp/ferrum_rowsq_*.bin
    for extra in "" "--no-gptq-fuse-residual-add"; do
      timeout 120 $B/apps/engine/ferrum_engine --random llama3-8b --dtype f16 --quant gptq --steps 32 --graph \
        --gptq-row-sq-norms $extra --dump-logits "/tmp/ferrum_rowsq_${extra//[ -]/}.bin" > /dev/null 2>&1
      echo "   dump run [--gptq-row-sq-norms $extra] exit $?"
    done
    cmp -s /tmp/ferrum_rowsq_.bin /tmp/ferrum_rowsq_nogptqfuseresidualadd.bin \
      && echo "-- row_sq logits (32 steps): fused bitwise equal to composed" \
      || echo "-- row_sq logits (32 steps): FUSED AND COMPOSED DIFFER"
  } 2>&1 | tee -a "$LOG"
fi

if has_mode ab && [ -d base ]; then
  {
    # The builds compared: this tree, base, and each alt/N (gpu_tree.sh --alt),
    # named by their commits.
    AB_BUILDS=("$B" "$(ab_build_dir base)")
    AB_NAMES=("this $(cat COMMIT 2>/dev/null)" "base $(cat base/COMMIT 2>/dev/null)")
    for tree in alt/*; do
      [ -d "$tree" ] || continue
      AB_BUILDS+=("$(ab_build_dir "$tree")")
      AB_NAMES+=("$tree $(cat "$tree/COMMIT" 2>/dev/null)")
    done
    echo "== ab: ${AB_NAMES[*]} ($(date +%T))"
    # One engine line per run: its decode rate and the md5 of its generated
    # tokens (equal tokens: equal md5).
    AB_ENGINE_FLAGS="${AB_ENGINE_FLAGS:---random llama3-8b --dtype f16 --quant gptq --steps 128 --graph}"
    for i in $(seq 1 "${AB_RUNS:-2}"); do
      [ -n "${AB_SKIP_ENGINE:-}" ] && break
      for b in "${!AB_BUILDS[@]}"; do
        timeout 120 "${AB_BUILDS[$b]}/apps/engine/ferrum_engine" $AB_ENGINE_FLAGS > /tmp/ferrum_ab_engine.log 2>&1
        rc=$?
        echo "-- ${AB_NAMES[$b]} run $i: exit $rc$(grep -E 'decode:' /tmp/ferrum_ab_engine.log | tr -s ' ') tokens $(tokens_md5 /tmp/ferrum_ab_engine.log)"
      done
    done
    # AB_OPS_FILTER: ferrum_bench on those ops, AB_RUNS passes alternating
    # the builds, as one table (bench/ab_table.py).
    if [ -n "${AB_OPS_FILTER:-}" ]; then
      specs=()
      for b in "${!AB_BUILDS[@]}"; do specs+=("${AB_NAMES[$b]// /_}=${AB_BUILDS[$b]}/bench/ferrum_bench"); done
      ops_ab "$AB_OPS_FILTER" "$OUT/ab_ops.md" "${specs[@]}"
    fi
    if [ -z "${AB_SKIP_GPTQ_BENCH:-}" ]; then
      for b in "${!AB_BUILDS[@]}"; do
        echo "-- ferrum_bench_gptq --kernel bulk, m = ${AB_BENCH_MS:-1}: ${AB_NAMES[$b]}"
        timeout 90 "${AB_BUILDS[$b]}/bench/ferrum_bench_gptq" --kernel bulk --ms "${AB_BENCH_MS:-1}" \
          --shapes 4096x6144,4096x4096,4096x28672,14336x4096,8192x8192,8192x28672 2>&1 | grep -vE "^#|^$"
      done
    fi
  } 2>&1 | tee -a "$LOG"
fi

if has_mode nccl; then
  # NVLink multicast stays off on shared machines (see README).
  export NCCL_NVLS_ENABLE=0
  {
    echo "== NCCL tests and the other two-GPU tests ($(date +%T))"
    timeout 300 $B/tests/ferrum_tests_gpu --gtest_brief=1 --gtest_filter='*Nccl*:*SecondDevice*:*PerDeviceTables*' 2>&1 | tail -20
    echo "nccl tests exit ${PIPESTATUS[0]}"
    timeout 240 compute-sanitizer --tool memcheck --print-limit 2000 --target-processes all $B/tests/ferrum_tests_gpu \
      --gtest_brief=1 --gtest_filter='*Nccl*' > "$OUT/nccl_memcheck.log" 2>&1
    echo "nccl memcheck exit $?"
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/nccl_memcheck.log" | sort | uniq -c | head
    # API errors (e.g. NCCL probing driver symbols with cuGetProcAddress)
    # against memory errors in kernels: only the second kind is a finding.
    echo "API errors reported: $(grep -c 'Program hit' "$OUT/nccl_memcheck.log")," \
      "memory errors: $(grep -cE 'Invalid (__global__|__shared__|__local__)|Misaligned|out of bounds' "$OUT/nccl_memcheck.log")"
    grep -E "Program hit" "$OUT/nccl_memcheck.log" | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -5
    timeout 200 $B/bench/ferrum_bench_nccl --json "$OUT/nccl.json" 2>&1 | tail -40
    echo "ferrum_bench_nccl exit ${PIPESTATUS[0]}"
  } 2>&1 | tee -a "$LOG"
fi

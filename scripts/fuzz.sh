#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, clang++) of the host code that reads
# untrusted input, under AddressSanitizer and UndefinedBehaviorSanitizer:
#   fuzz_engine_parsers  the engine's config.json, quantization_config and
#                        .safetensors readers (tests/fuzz/fuzz_engine_parsers.cpp)
#   fuzz_gptq_load       CpuBackend::load_gptq, then gemm_gptq, on arbitrary
#                        GPTQ tensors and sizes (tests/fuzz/fuzz_gptq_load.cpp)
# Every input must be accepted or refused with a ferrum::Error.
#   scripts/fuzz.sh [SECONDS]   each harness for SECONDS (default 300), in
#                               $FUZZ_DIR (default build-fuzz/), one after the
#                               other, starting from small valid seeds and
#                               the corpus an earlier run left there
#   CXX_FUZZ=clang++-15 ...     the Clang to build with (default clang++)
# A crash or a sanitizer report stops that harness, leaves the input as
# $FUZZ_DIR/<harness>/crash-* (rerun: $FUZZ_DIR/build/tests/fuzz/<harness>
# <file>) and
# makes the script exit non-zero. Not part of scripts/test.sh: it needs
# clang++ and runs for minutes. The harnesses are CMake targets of a
# CPU-only build in $FUZZ_DIR/build (-DFERRUM_BUILD_FUZZERS=ON, FERRUM_CUDA
# OFF, ASan + UBSan, libFuzzer's coverage over every C++ file): they link the
# library and the engine's core as those are built, with no list of their own.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"
dir="${FUZZ_DIR:-build-fuzz}"
mkdir -p "$dir"
cxx="${CXX_FUZZ:-clang++}"
harnesses=(fuzz_engine_parsers fuzz_gptq_load)
echo "== build ($dir/build)"
cmake -S . -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DFERRUM_CUDA=OFF -DFERRUM_SANITIZE=address,undefined -DFERRUM_BUILD_FUZZERS=ON \
  -DFERRUM_BUILD_TESTS=OFF -DFERRUM_BUILD_BENCHMARKS=OFF -DFERRUM_INSTALL=OFF > "$dir/configure.log"
cmake --build "$dir/build" --target "${harnesses[@]}"

# Small valid inputs to start from (each harness's header says its format).
python3 - "$dir" <<'PY'
import json, os, struct, sys
root = sys.argv[1]
def put(harness, name, data):
    os.makedirs(f"{root}/{harness}/corpus", exist_ok=True)
    with open(f"{root}/{harness}/corpus/{name}", "wb") as f:
        f.write(data)
llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 100, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 256,
         "torch_dtype": "float16", "tie_word_embeddings": False,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}}
qwen3 = dict(llama, architectures=["Qwen3ForCausalLM"], model_type="qwen3", torch_dtype="bfloat16",
             tie_word_embeddings=True,
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
             quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": False,
                                  "sym": True})
put("fuzz_engine_parsers", "llama", b"\0" + json.dumps(llama).encode())
put("fuzz_engine_parsers", "qwen3", b"\0" + json.dumps(qwen3).encode())
put("fuzz_engine_parsers", "gptq", b"\1" + json.dumps({"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                        "desc_act": True, "sym": False,
                                                        "checkpoint_format": "gptq_v2"}).encode())
tensors = {"f16": ("F16", [2, 3], b"\x00\x3c" * 6), "i32": ("I32", [4], struct.pack("<4i", 1, 2, 3, 4)),
           "bf16": ("BF16", [1], b"\x80\x3f"), "f32": ("F32", [2], struct.pack("<2f", 1.0, 2.0))}
header, data = {"__metadata__": {"format": "pt"}}, b""
for name, (dtype, shape, raw) in tensors.items():
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
text = json.dumps(header).encode()
put("fuzz_engine_parsers", "safetensors", b"\2" + struct.pack("<Q", len(text)) + text + data)
# GPTQ: k 64, n 16, groups of 32 (choice 3) with g_idx, symmetric; exact lengths (bit 7 of byte 6).
words = b"".join(struct.pack("<I", (0x89abcdef * (i + 1)) & 0xffffffff) for i in range(8 * 16))
zeros = struct.pack("<I", 0x77777777) * 4
g_idx = b"".join(struct.pack("<i", i // 32) for i in range(64))
put("fuzz_gptq_load", "g32", bytes([64, 16, 3, 0, 1, 2, 0x80, 0, 0, 0, 0, 0]) + words + zeros + g_idx + bytes(range(32)))
put("fuzz_gptq_load", "per_channel_v2", bytes([64, 16, 0, 0, 1, 1, 0x80, 0, 0, 0, 1, 1]) + words + zeros[:8] + bytes(16))
PY

status=0
for harness in "${harnesses[@]}"; do
  work="$dir/$harness"
  bin="$(cd "$dir/build/tests/fuzz" && pwd)/$harness"
  echo "== $harness: $seconds s"
  # -artifact_prefix: where a finding's input goes; the corpus grows in place.
  if ! (cd "$work" && "$bin" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
          -artifact_prefix=./ corpus > fuzz.log 2>&1); then
    status=1
    echo "$harness: FINDING (see $work/fuzz.log and $work/crash-*)"
  fi
  grep -E "^Done|stat::number_of_executed_units|ERROR|SUMMARY" "$work/fuzz.log" || true
done
exit "$status"

#!/usr/bin/env python3
"""ferrum_engine against Hugging Face transformers on the same weights (issue 6).

For a Llama-style and a Qwen3-style tiny model, a Llama with Llama 3.1's
RoPE scaling, and a Qwen3 and a Llama with YaRN, this script

  1. builds the model with transformers' own class (LlamaForCausalLM /
     Qwen3ForCausalLM) from a seeded random init, casts it to float16 and
     saves it with save_pretrained (config.json + model.safetensors);
  2. checks, without running the engine, that the saved checkpoint is what
     the engine expects: the tensor names / shapes / dtype of
     apps/engine/checkpoint_layout.cpp and the config.json fields as
     apps/engine/model_config.cpp reads them (rope_theta included);
  3. runs ferrum_engine --model DIR --prompt-tokens P --steps N --dump-logits F
     in each requested mode (graph, eager; on the GPU);
  4. runs the HF model in float16 on the GPU: a greedy loop (prefill, then one
     token at a time with use_cache=True, exactly the engine's schedule) and,
     where the engine's tokens differ, the same loop fed the engine's tokens,
     so logits are always compared on identical prefixes; a float32 copy of
     the same (fp16-rounded) weights gives the fp16 noise floor;
  5. compares: per generated position, max |engine - hf16| <= TOL * max(1,
     max |hf16|) (TOL = 0.02 by default, the tolerance of the engine's CPU
     test against its fp64 model), and greedy tokens identical over all
     steps (at a divergence it reports the top-2 logit gaps).

Prints PASS / FAIL per model and mode and overall; --json writes the figures.
A YaRN model whose fields the installed transformers does not read is
SKIPPED and says why (the rest still decide the verdict; all skipped fails).
Exit status: 0 all pass, 1 a check failed, 2 the script could not run.

  python3 scripts/hf_check.py --engine build-gpu/apps/engine/ferrum_engine \\
      --workdir /tmp/hf_check --json out/hf_check.json

Weights (--init scaled, the default): embeddings N(0, 1) (N(0, 1.5/sqrt(hidden))
when tied, so tied logits stay O(1)), every projection N(0, 1/fan_in) so each
layer's output is O(1) against the residual, every RMSNorm weight (q_norm and
k_norm included) uniform in [0.75, 1.25] so a misplaced or ignored norm weight
shows. --init hf keeps transformers' own init (std 0.02, norms exactly 1),
which leaves the layers' contributions small and the norm weights untested.
"""

import argparse
import array
import glob
import inspect
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

DEFAULT_PROMPT = "1,17,42,255,3,99,200,511,7,64,128,900,33,1000,5,600"

# The two model shapes. head_dim must be one the CUDA attention takes (64, 128, 256).
_SHARED_SHAPE = dict(
    vocab_size=1024,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
MODELS = {
    "llama": dict(_SHARED_SHAPE, arch="LlamaForCausalLM", head_dim=64, rope_theta=10000.0,
                  tie_word_embeddings=False),
    # q_dim = 8 * 128 = 1024 != hidden (as in real Qwen3), tied embeddings (as
    # Qwen3-0.6B), Qwen3's rope_theta 1e6.
    "qwen3": dict(_SHARED_SHAPE, arch="Qwen3ForCausalLM", head_dim=128, rope_theta=1000000.0,
                  tie_word_embeddings=True),
    # Llama 3.1 / 3.2's RoPE scaling (rope_type llama3) with its pretraining
    # context cut to 32 positions, so that the 48 positions of a run cross all
    # three bands (head_dim 64, theta 1e4: pair 0 kept, pairs 1..5 blended, the
    # rest divided by the factor).
    "llama31": dict(_SHARED_SHAPE, arch="LlamaForCausalLM", head_dim=64, rope_theta=10000.0,
                    tie_word_embeddings=False,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=32)),
    # YaRN as Qwen3's long-context configs write it (factor and the original
    # context only; beta 32 / 1, attention factor 0.1 ln 4 + 1 resolved),
    # with the original context cut to 64 positions (head_dim 128, theta 1e6:
    # pair 0 kept, 1..10 ramped, the rest divided by the factor).
    "qwen3yarn": dict(_SHARED_SHAPE, arch="Qwen3ForCausalLM", head_dim=128, rope_theta=1000000.0,
                      tie_word_embeddings=True,
                      rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)),
    # YaRN with every field the engine reads given: DeepSeek's mscale pair,
    # betas 4 / 0.5 and the correction range left unrounded ([0.84, 8.06]:
    # both betas bite).
    "llamayarn": dict(_SHARED_SHAPE, arch="LlamaForCausalLM", head_dim=64, rope_theta=10000.0,
                      tie_word_embeddings=False,
                      rope_scaling=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=32,
                                        beta_fast=4.0, beta_slow=0.5, mscale=1.0, mscale_all_dim=0.5,
                                        truncate=False)),
}

# The RoPE scaling fields the engine reads, per rope_type (model_config.cpp).
ROPE_SCALING_FIELDS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def yarn_view(rope):
    """yarn's fields resolved as the engine (and transformers) resolve them:
    (factor, original context, beta_fast, beta_slow, attention_factor, truncate)."""
    factor = float(rope["factor"])

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention = rope.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
                     else get_mscale(factor))
    truncate = rope.get("truncate", True)  # transformers: an explicit null is falsy
    if truncate is not None and not isinstance(truncate, bool):
        raise ValueError(f"rope settings {rope!r}: truncate must be true or false")
    return (factor, float(rope["original_max_position_embeddings"]), float(rope.get("beta_fast") or 32),
            float(rope.get("beta_slow") or 1), round(float(attention), 12), bool(truncate))


def rope_scaling_view(rope):
    """A rope_scaling / rope_parameters dict as the engine reads it: (rope_type,
    its fields as floats), or raises with the reason it refuses."""
    if not isinstance(rope, dict):
        raise ValueError(f"rope settings {rope!r}: the engine takes an object")
    rtype = rope.get("rope_type", rope.get("type"))
    if "rope_type" in rope and "type" in rope and rope["rope_type"] != rope["type"]:
        raise ValueError(f"rope settings {rope!r}: rope_type and type disagree")
    if rtype == "yarn":
        return (rtype,) + yarn_view(rope)
    if rtype not in ROPE_SCALING_FIELDS:
        raise ValueError(f"rope settings {rope!r}: the engine computes rope_type default, linear, llama3 or yarn")
    return (rtype,) + tuple(float(rope[k]) for k in ROPE_SCALING_FIELDS[rtype])

SAFETENSORS_DTYPE = {"float16": "F16", "bfloat16": "BF16"}


# ── What the engine expects (mirrors apps/engine, no torch needed) ─────────


def layer_name(i, suffix):
    return f"model.layers.{i}.{suffix}"


def expected_tensors(c):
    """Name -> shape, as apps/engine/checkpoint_layout.cpp expected_tensors()."""
    hidden, hd = c["hidden_size"], c["head_dim"]
    q_dim, kv_dim = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    im = c["intermediate_size"]
    t = {"model.embed_tokens.weight": [c["vocab_size"], hidden]}
    for i in range(c["num_hidden_layers"]):
        t[layer_name(i, "input_layernorm.weight")] = [hidden]
        t[layer_name(i, "self_attn.q_proj.weight")] = [q_dim, hidden]
        t[layer_name(i, "self_attn.k_proj.weight")] = [kv_dim, hidden]
        t[layer_name(i, "self_attn.v_proj.weight")] = [kv_dim, hidden]
        if c["arch"] == "Qwen3ForCausalLM":
            t[layer_name(i, "self_attn.q_norm.weight")] = [hd]
            t[layer_name(i, "self_attn.k_norm.weight")] = [hd]
        t[layer_name(i, "self_attn.o_proj.weight")] = [hidden, q_dim]
        t[layer_name(i, "post_attention_layernorm.weight")] = [hidden]
        t[layer_name(i, "mlp.gate_proj.weight")] = [im, hidden]
        t[layer_name(i, "mlp.up_proj.weight")] = [im, hidden]
        t[layer_name(i, "mlp.down_proj.weight")] = [hidden, im]
    t["model.norm.weight"] = [hidden]
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = [c["vocab_size"], hidden]
    return t


def read_safetensors_headers(model_dir):
    """Tensor name -> (dtype, shape) over every *.safetensors file of model_dir."""
    tensors = {}
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise RuntimeError(f"{model_dir}: no *.safetensors file")
    for path in files:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, info in header.items():
            tensors[name] = (info["dtype"], list(info["shape"]))
    return tensors


def engine_view_of_config(config):
    """config.json as apps/engine/model_config.cpp parse_model_config() reads it
    (the fields the forward pass uses), or raises with the reason it refuses."""
    archs = config.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ("LlamaForCausalLM", "Qwen3ForCausalLM")):
        raise ValueError(f"architectures {archs!r}: the engine takes [LlamaForCausalLM] or [Qwen3ForCausalLM]")
    rope_view = None
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope is None:
            continue
        view_of_key = rope_scaling_view(rope)
        if rope_view is not None and rope_view != view_of_key:
            raise ValueError(f"rope_scaling {rope_view} and rope_parameters {view_of_key} disagree")
        rope_view = view_of_key
    # model_config.cpp: a top-level original_max_position_embeddings (which
    # transformers 5 copies over the rope object's) must agree with it.
    top = config.get("original_max_position_embeddings")
    if rope_view is not None and rope_view[0] in ("llama3", "yarn") and top is not None:
        inside = rope_view[4] if rope_view[0] == "llama3" else rope_view[2]
        if float(top) != inside:
            raise ValueError(f"original_max_position_embeddings {top} and the rope object's {inside} disagree")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"{key} = true: the engine refuses it")
    if "hidden_act" in config and config["hidden_act"] != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']!r}: the engine takes silu")
    dtype_key = "torch_dtype" if "torch_dtype" in config else "dtype"
    dtype = config.get(dtype_key)
    if dtype not in SAFETENSORS_DTYPE:
        raise ValueError(f"{dtype_key} {dtype!r}: the engine takes float16 or bfloat16")
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads")
    view = dict(
        arch=archs[0],
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=heads if kv is None else kv,
        head_dim=config["head_dim"] if config.get("head_dim") is not None else config["hidden_size"] // heads,
        max_position_embeddings=config["max_position_embeddings"],
        rms_norm_eps=float(config["rms_norm_eps"]),
        # model_config.cpp: top-level "rope_theta", else rope_parameters.rope_theta, else 10000.
        rope_theta=(float(config["rope_theta"]) if config.get("rope_theta") is not None else
                    float(config["rope_parameters"]["rope_theta"])
                    if isinstance(config.get("rope_parameters"), dict) and "rope_theta" in config["rope_parameters"]
                    else 10000.0),
        tie_word_embeddings=bool(config.get("tie_word_embeddings") or False),
        dtype=dtype,
        rope_scaling=rope_view or ("default",),
    )
    return view


def check_checkpoint(model_dir, hf_facts):
    """Problems (strings) between the saved checkpoint as the engine reads it
    and the model transformers runs (hf_facts: the same keys as engine_view_of_config)."""
    problems = []
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    try:
        view = engine_view_of_config(config)
    except (ValueError, KeyError) as e:
        return [f"config.json: {e}"], None
    for key, hf_value in hf_facts.items():
        if key in view and view[key] != hf_value:
            where = ""
            if key == "rope_theta" and "rope_theta" not in config:
                where = (f" (config.json has no top-level rope_theta; transformers wrote rope_parameters = "
                         f"{config.get('rope_parameters')!r})")
            problems.append(f"config.json: the engine reads {key} = {view[key]!r}, transformers runs {hf_value!r}{where}")
    expected = expected_tensors(view)
    saved = read_safetensors_headers(model_dir)
    want_dtype = SAFETENSORS_DTYPE[view["dtype"]]
    for name, shape in expected.items():
        if name not in saved:
            problems.append(f"safetensors: missing tensor {name} {shape}")
        elif saved[name][1] != shape:
            problems.append(f"safetensors: {name} has shape {saved[name][1]}, the engine expects {shape}")
        elif saved[name][0] != want_dtype:
            problems.append(f"safetensors: {name} is {saved[name][0]}, config says {want_dtype}")
    extra = sorted(set(saved) - set(expected))
    return problems, dict(engine_view=view, tensors=len(saved), unused_tensors=extra)


# ── Running the engine and reading its dump ───────────────────────────────


def read_dump(path, rows, vocab):
    if sys.byteorder != "little":
        raise RuntimeError("--dump-logits files are little-endian float32; this host is big-endian")
    data = array.array("f")
    with open(path, "rb") as f:
        raw = f.read()
    expected = rows * vocab * 4
    if len(raw) != expected:
        raise RuntimeError(f"{path}: {len(raw)} bytes, expected {rows} rows x {vocab} x 4 = {expected}")
    data.frombytes(raw)
    return [data[r * vocab:(r + 1) * vocab].tolist() for r in range(rows)]


def run_engine(engine, model_dir, prompt, steps, mode, dump_path, log_path):
    cmd = [engine, "--model", model_dir, "--prompt-tokens", ",".join(map(str, prompt)), "--steps", str(steps),
           "--dump-logits", dump_path]
    cmd += {"graph": ["--graph"], "eager": ["--eager"], "cpu": ["--cpu", "--eager"]}[mode]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    with open(log_path, "w") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout)
    info = dict(command=" ".join(cmd), returncode=proc.returncode, log=log_path)
    m = re.search(r"^ferrum_engine: backend (.*), (\S+) decoding$", proc.stdout, re.M)
    if m:
        info["backend"], info["mode_run"] = m.group(1), m.group(2)
    m = re.search(r"^\s*generated:(.*)$", proc.stdout, re.M)
    info["tokens"] = [int(t) for t in m.group(1).split()] if m else None
    if proc.returncode != 0:
        info["error"] = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "no output"
    return info


# ── Comparisons (pure Python lists, so testable without torch) ─────────────


def argmax(row):
    best = 0
    for i, x in enumerate(row):
        if x > row[best]:
            best = i  # first index on ties, as the engine and torch.argmax
    return best


def top2_gap(row):
    top = sorted(row, reverse=True)
    return top[0] - top[1]


def compare_logits(test, ref, tol):
    """Per-row max |test - ref| against tol * max(1, max |ref row|)."""
    worst = dict(max_abs_diff=0.0, step_of_max_abs_diff=None, max_norm_diff=0.0, step_of_max_norm_diff=None)
    max_abs_ref, total, count = 0.0, 0.0, 0
    failing = []
    for step, (a, b) in enumerate(zip(test, ref)):
        diff = max(abs(x - y) for x, y in zip(a, b))
        scale = max(abs(y) for y in b)
        norm = diff / max(1.0, scale)
        total += sum(abs(x - y) for x, y in zip(a, b))
        count += len(b)
        max_abs_ref = max(max_abs_ref, scale)
        if diff > worst["max_abs_diff"]:
            worst.update(max_abs_diff=diff, step_of_max_abs_diff=step)
        if norm > worst["max_norm_diff"]:
            worst.update(max_norm_diff=norm, step_of_max_norm_diff=step)
        if not all(math.isfinite(x) for x in a) or norm > tol:
            failing.append(step)
    worst.update(max_abs_logit=max_abs_ref, mean_abs_diff=total / max(1, count), rows_over_tolerance=failing,
                 within_tolerance=not failing)
    return worst


def first_divergence(engine_tokens, hf_tokens, engine_rows, hf_rows, fp32_rows):
    for step, (e, h) in enumerate(zip(engine_tokens, hf_tokens)):
        if e != h:
            hf_row, eng_row, ref_row = hf_rows[step], engine_rows[step], fp32_rows[step]
            return dict(
                step=step, engine_token=e, hf_token=h, fp32_token=argmax(ref_row),
                hf16_gap=hf_row[h] - hf_row[e],    # how far HF fp16 prefers its token over the engine's
                engine_gap=eng_row[e] - eng_row[h],  # and the engine its own over HF's
                fp32_gap=ref_row[h] - ref_row[e],  # > 0: fp32 sides with HF; < 0: with the engine
                hf16_top2_gap=top2_gap(hf_row))
    return None


# ── The Hugging Face side (torch imported here only) ──────────────────────


def hf_rope(config):
    """(rope_type, rope_theta, the engine's view of the scaling) of what transformers runs."""
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict) and rp:
        return rp.get("rope_type", rp.get("type", "default")), float(rp["rope_theta"]), rope_scaling_view(rp)
    rs = getattr(config, "rope_scaling", None)
    return ((rs.get("rope_type", rs.get("type")) if rs else "default"), float(config.rope_theta),
            rope_scaling_view(rs) if rs else ("default",))


def build_hf_model(name, spec, seed, init, model_dir):
    import torch
    import transformers

    llama = spec["arch"] == "LlamaForCausalLM"
    cls_config = getattr(transformers, "LlamaConfig" if llama else "Qwen3Config")
    cls_model = getattr(transformers, spec["arch"])
    kwargs = {k: v for k, v in spec.items() if k not in ("arch", "rope_theta", "rope_scaling")}
    kwargs.update(hidden_act="silu", attention_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if llama:
        kwargs["mlp_bias"] = False
    else:
        kwargs["use_sliding_window"] = False
    scaling = spec.get("rope_scaling") or {"rope_type": "default"}
    # transformers >= 4.57 / 5 keep RoPE settings in rope_parameters; older ones in rope_theta / rope_scaling.
    if isinstance(getattr(cls_config(), "rope_parameters", None), dict):
        kwargs["rope_parameters"] = dict(scaling, rope_theta=spec["rope_theta"])
    else:
        kwargs["rope_theta"] = spec["rope_theta"]
        kwargs["rope_scaling"] = spec.get("rope_scaling")
    config = cls_config(**kwargs)
    wanted = (scaling["rope_type"], spec["rope_theta"], rope_scaling_view(scaling))
    if hf_rope(config) != wanted:
        raise RuntimeError(f"{name}: transformers config has RoPE {hf_rope(config)}, wanted {wanted}")

    torch.manual_seed(seed)
    model = cls_model(config)  # fp32, on the CPU, transformers' own init
    if init == "scaled":
        gen = torch.Generator().manual_seed(seed)
        hidden = spec["hidden_size"]
        with torch.no_grad():
            for pname, p in model.named_parameters():  # tied weights appear once
                if pname.endswith("norm.weight"):
                    p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=gen))
                elif pname == "model.embed_tokens.weight":
                    std = 1.5 / math.sqrt(hidden) if spec["tie_word_embeddings"] else 1.0
                    p.copy_(std * torch.randn(p.shape, generator=gen))
                elif pname.endswith("_proj.weight") or pname == "lm_head.weight":
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
                else:
                    raise RuntimeError(f"{name}: unexpected parameter {pname} {tuple(p.shape)}")
    if spec["tie_word_embeddings"]:
        model.tie_weights()
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise RuntimeError(f"{name}: lm_head is not tied to embed_tokens")
    model = model.to(torch.float16).eval()
    shutil.rmtree(model_dir, ignore_errors=True)  # no stale shards from an earlier run
    os.makedirs(model_dir)
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        model.save_pretrained(model_dir, safe_serialization=True)
    else:  # transformers 5 always writes safetensors and dropped the argument
        model.save_pretrained(model_dir)
    # What transformers runs, in the keys of engine_view_of_config().
    cfg = model.config
    rope_type, theta, rope_view = hf_rope(cfg)
    if rope_type != scaling["rope_type"]:
        raise RuntimeError(f"{name}: rope_type {rope_type}, wanted {scaling['rope_type']}")
    facts = {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "max_position_embeddings")}
    facts.update(arch=spec["arch"], rope_theta=theta, rope_scaling=rope_view, dtype="float16",
                 rms_norm_eps=float(cfg.rms_norm_eps),
                 head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                 tie_word_embeddings=bool(cfg.tie_word_embeddings))
    if facts["head_dim"] != spec["head_dim"] or facts["rope_theta"] != spec["rope_theta"]:
        raise RuntimeError(f"{name}: transformers built head_dim {facts['head_dim']}, theta {facts['rope_theta']}")
    return model, facts


def hf_decode(model, prompt, steps, forced=None):
    """Prefill, then one token at a time with the KV cache: the engine's
    schedule. Feeds argmax (greedy) or forced[step]. Returns (tokens fed,
    logits rows as float lists); row i is what token i was chosen from."""
    import torch

    device = next(model.parameters()).device
    rows, tokens = [], []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        for step in range(steps):
            row = out.logits[0, -1].float().cpu()
            rows.append(row.tolist())
            token = int(torch.argmax(row)) if forced is None else int(forced[step])
            tokens.append(token)
            if step + 1 < steps:
                out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=out.past_key_values,
                            use_cache=True)
    return tokens, rows


# ── Driver ────────────────────────────────────────────────────────────────


def unmet_requirement(spec):
    """Why the installed transformers cannot be this model's reference, or
    None. transformers' YaRN learned its fields over several releases (the
    mscale pair, then truncate); a release whose _compute_yarn_parameters
    does not read a field the spec sets would silently compute another
    RoPE, so the model is skipped and says why."""
    rope = spec.get("rope_scaling") or {}
    if rope.get("rope_type") != "yarn":
        return None
    import transformers

    try:
        from transformers import modeling_rope_utils
    except ImportError:
        return f"transformers {transformers.__version__} has no modeling_rope_utils"
    compute = getattr(modeling_rope_utils, "_compute_yarn_parameters", None)
    if compute is None:
        return f"transformers {transformers.__version__} has no _compute_yarn_parameters"
    try:
        source = inspect.getsource(compute)
    except (OSError, TypeError):
        return f"transformers {transformers.__version__}: cannot read _compute_yarn_parameters' source"
    # A field counts as read where the function names it as a key ("truncate"
    # or 'truncate'), not where a comment or another name holds the word.
    unread = [k for k in rope if k not in ("rope_type", "factor")
              and not re.search(rf"[\"']{re.escape(k)}[\"']", source)]
    if unread:
        return f"transformers {transformers.__version__}'s YaRN does not read {', '.join(unread)}"
    return None


def check_model(name, args, prompt):
    import copy

    import torch

    spec = MODELS[name]
    model_dir = os.path.join(args.workdir, name)
    result = dict(config={k: v for k, v in spec.items()}, checkpoint=model_dir, runs={}, reasons=[])
    model, facts = build_hf_model(name, spec, args.seed, args.init, model_dir)
    if args.write_rope_theta:
        path = os.path.join(model_dir, "config.json")
        with open(path) as f:
            config = json.load(f)
        if "rope_theta" not in config:
            config["rope_theta"] = facts["rope_theta"]
            with open(path, "w") as f:
                json.dump(config, f, indent=2)
            result["rope_theta_added_to_config_json"] = facts["rope_theta"]
    problems, info = check_checkpoint(model_dir, facts)
    result["checkpoint_check"] = dict(problems=problems, **(info or {}))
    result["reasons"] += problems

    torch.set_float32_matmul_precision("highest")  # the fp32 reference in true fp32 (no TF32)
    model = model.to(args.device)
    ref32 = copy.deepcopy(model).float()  # the same fp16-rounded weights, computed in fp32
    hf_tokens, hf_rows = hf_decode(model, prompt, args.steps)
    _, fp32_rows = hf_decode(ref32, prompt, args.steps, forced=hf_tokens)
    floor = compare_logits(hf_rows, fp32_rows, args.tol)
    result["hf"] = dict(tokens=hf_tokens, min_top2_gap=min(top2_gap(r) for r in hf_rows),
                        hf16_vs_fp32=dict((k, floor[k]) for k in ("max_abs_diff", "max_norm_diff", "max_abs_logit")))

    for mode in args.modes:
        dump = os.path.join(args.workdir, f"{name}-{mode}.logits.f32")
        run = run_engine(args.engine, model_dir, prompt, args.steps, mode, dump,
                         os.path.join(args.workdir, f"{name}-{mode}.log"))
        reasons = []
        result["runs"][mode] = run
        if run["returncode"] != 0:
            reasons.append(f"engine exited {run['returncode']}: {run.get('error')}")
        else:
            if mode in ("graph", "eager") and run.get("mode_run") != mode:
                reasons.append(f"asked for {mode} decoding, the engine ran {run.get('mode_run')}")
            if mode in ("graph", "eager") and str(run.get("backend", "cpu")).startswith("cpu") and not args.allow_cpu:
                reasons.append(f"the engine ran on {run.get('backend')}, not a GPU")
            try:
                rows = read_dump(dump, args.steps, spec["vocab_size"])
            except RuntimeError as e:
                rows = None
                reasons.append(str(e))
            if rows is not None:
                tokens = run["tokens"] or []
                if [argmax(r) for r in rows] != tokens:
                    reasons.append("the dumped logits' argmaxes differ from the printed tokens")
                if tokens == hf_tokens:
                    ref_rows, ref32_rows = hf_rows, fp32_rows
                else:
                    # Compare logits on the engine's own prefix (HF fed the engine's tokens).
                    forced = (tokens + [0] * args.steps)[:args.steps]
                    _, ref_rows = hf_decode(model, prompt, args.steps, forced=forced)
                    _, ref32_rows = hf_decode(ref32, prompt, args.steps, forced=forced)
                    div = first_divergence(tokens, hf_tokens, rows, hf_rows, fp32_rows)
                    run["first_divergence"] = div
                    if div is None:
                        reasons.append(f"the engine printed {len(tokens)} tokens, expected {args.steps}")
                    else:
                        reasons.append(
                            f"greedy tokens differ at step {div['step']}: engine {div['engine_token']}, HF "
                            f"{div['hf_token']} (HF fp16 prefers its token by {div['hf16_gap']:.4f}, the engine "
                            f"its own by {div['engine_gap']:.4f}; fp32 picks {div['fp32_token']})")
                run["tokens_equal"] = tokens == hf_tokens
                run["vs_hf16"] = compare_logits(rows, ref_rows, args.tol)
                vs32 = compare_logits(rows, ref32_rows, args.tol)
                run["vs_fp32"] = dict((k, vs32[k]) for k in ("max_abs_diff", "max_norm_diff", "mean_abs_diff"))
                if not run["vs_hf16"]["within_tolerance"]:
                    reasons.append(
                        f"logits over tolerance at steps {run['vs_hf16']['rows_over_tolerance']}: max |diff| "
                        f"{run['vs_hf16']['max_abs_diff']:.4g}, normalized {run['vs_hf16']['max_norm_diff']:.4g} > "
                        f"{args.tol}")
                run["rows"] = rows  # kept for the graph-vs-eager figure below, dropped before JSON
        run["reasons"] = reasons
        run["pass"] = not reasons
    modes_with_rows = [m for m in args.modes if "rows" in result["runs"][m]]
    if len(modes_with_rows) >= 2:
        a, b = (result["runs"][m]["rows"] for m in modes_with_rows[:2])
        result[f"{modes_with_rows[0]}_vs_{modes_with_rows[1]}_max_abs_diff"] = max(
            max(abs(x - y) for x, y in zip(ra, rb)) for ra, rb in zip(a, b))
    for run in result["runs"].values():
        run.pop("rows", None)
        result["reasons"] += run["reasons"]
    result["pass"] = not problems and all(run["pass"] for run in result["runs"].values())
    del model, ref32
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def print_summary(report, args):
    print(f"\nferrum_engine vs transformers {report['transformers_version']} (torch {report['torch_version']}, "
          f"{report['device_name']}); {args.steps} steps, prompt of {len(report['prompt'])} tokens, "
          f"tolerance max|diff| <= {args.tol} * max(1, max|logit|) per position")
    for name, res in report["models"].items():
        hf = res["hf"]
        print(f"\n[{name}] {res['config']['arch']}: hidden {res['config']['hidden_size']}, "
              f"{res['config']['num_hidden_layers']} layers, heads {res['config']['num_attention_heads']}/"
              f"{res['config']['num_key_value_heads']}, head_dim {res['config']['head_dim']}, vocab "
              f"{res['config']['vocab_size']}, rope_theta {res['config']['rope_theta']:g}"
              f"{', rope scaling ' + str(res['config']['rope_scaling']) if res['config'].get('rope_scaling') else ''}"
              f", tied {res['config']['tie_word_embeddings']}; checkpoint {res['checkpoint']}")
        if "rope_theta_added_to_config_json" in res:
            print(f"  (--write-rope-theta: added rope_theta = {res['rope_theta_added_to_config_json']:g} to config.json)")
        for p in res["checkpoint_check"]["problems"]:
            print(f"  CHECKPOINT PROBLEM: {p}")
        if res["checkpoint_check"].get("unused_tensors"):
            print(f"  (tensors the engine does not read: {res['checkpoint_check']['unused_tensors']})")
        print(f"  HF fp16 vs fp32 (noise floor): max|diff| {hf['hf16_vs_fp32']['max_abs_diff']:.4g}, "
              f"max|logit| {hf['hf16_vs_fp32']['max_abs_logit']:.3g}; closest top-2 gap over the steps "
              f"{hf['min_top2_gap']:.4g}")
        for mode, run in res["runs"].items():
            status = "PASS" if run["pass"] else "FAIL"
            if "vs_hf16" in run:
                v = run["vs_hf16"]
                print(f"  {mode:6s} {status}: backend {run.get('backend')}, {run.get('mode_run')} decoding; "
                      f"tokens {'identical' if run['tokens_equal'] else 'DIFFER'} over {args.steps} steps; "
                      f"max|diff| vs HF fp16 {v['max_abs_diff']:.4g} (step {v['step_of_max_abs_diff']}, "
                      f"normalized {v['max_norm_diff']:.4g}, mean {v['mean_abs_diff']:.3g}); vs fp32 "
                      f"{run['vs_fp32']['max_abs_diff']:.4g}")
            else:
                print(f"  {mode:6s} {status}")
            for r in run["reasons"]:
                print(f"         - {r}")
        for key, value in res.items():
            if key.endswith("_max_abs_diff"):
                print(f"  {key.replace('_', ' ')}: {value:.4g}")
        print(f"  {name}: {'PASS' if res['pass'] else 'FAIL'}")
    for name, why in report.get("skipped", {}).items():
        print(f"\n[{name}] SKIPPED: {why}")
    print(f"\nOVERALL: {'PASS' if report['pass'] else 'FAIL'}"
          f"{' (skipped: ' + ', '.join(report['skipped']) + ')' if report.get('skipped') else ''}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", default="build-gpu/apps/engine/ferrum_engine", help="path to ferrum_engine")
    p.add_argument("--workdir", default="/tmp/ferrum_hf_check", help="checkpoints, dumps and engine logs go here")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--models", default="llama,qwen3,llama31,qwen3yarn,llamayarn",
                   help="comma-separated: llama, qwen3, llama31 (Llama 3.1's RoPE scaling), qwen3yarn and "
                        "llamayarn (YaRN)")
    p.add_argument("--modes", default="graph,eager", help="comma-separated engine modes: graph, eager, cpu")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens to generate (default 32)")
    p.add_argument("--prompt-tokens", default=DEFAULT_PROMPT, help="comma-separated prompt token ids")
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    p.add_argument("--tol", type=float, default=0.02,
                   help="logit tolerance: max|engine - hf16| <= TOL * max(1, max|hf16|) per position")
    p.add_argument("--init", choices=("scaled", "hf"), default="scaled", help="weight init (see the top of the file)")
    p.add_argument("--device", default="cuda", help="torch device for the HF model")
    p.add_argument("--allow-cpu", action="store_true", help="accept an engine run that fell back to the CPU backend")
    p.add_argument("--write-rope-theta", action="store_true",
                   help="add a top-level rope_theta to config.json when transformers wrote only rope_parameters "
                        "(model_config.cpp reads either and requires the two to agree: this checks both together)")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r} ({', '.join(MODELS)})")
    for m in args.modes:
        if m not in ("graph", "eager", "cpu"):
            p.error(f"--modes: unknown mode {m!r} (graph, eager, cpu)")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    try:
        args.prompt = [int(t) for t in args.prompt_tokens.split(",")]
    except ValueError:
        p.error(f"--prompt-tokens: not a comma-separated list of integers: {args.prompt_tokens!r}")
    for m in args.models:
        spec = MODELS[m]
        if not args.prompt or any(t < 0 or t >= spec["vocab_size"] for t in args.prompt):
            p.error(f"--prompt-tokens: ids must lie in [0, {spec['vocab_size']}) ({m})")
        if len(args.prompt) + args.steps > spec["max_position_embeddings"]:
            p.error(f"prompt + steps exceed max_position_embeddings = {spec['max_position_embeddings']}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not (os.path.isfile(args.engine) and os.access(args.engine, os.X_OK)):
        print(f"hf_check: --engine {args.engine}: not an executable file", file=sys.stderr)
        return 2
    args.engine = os.path.abspath(args.engine)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"hf_check: needs torch and transformers ({e})", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hf_check: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    os.makedirs(args.workdir, exist_ok=True)
    report = dict(
        transformers_version=transformers.__version__, torch_version=torch.__version__,
        device_name=torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        engine=args.engine, prompt=args.prompt, steps=args.steps, seed=args.seed, init=args.init,
        tolerance=dict(rule="per position: max|engine - hf16| <= tol * max(1, max|hf16|)", tol=args.tol),
        models={})
    report["skipped"] = {}
    for name in args.models:
        why = unmet_requirement(MODELS[name])
        if why is not None:
            report["skipped"][name] = why
            continue
        report["models"][name] = check_model(name, args, args.prompt)
    # A skipped model is no pass: with every model skipped the run fails.
    report["pass"] = bool(report["models"]) and all(res["pass"] for res in report["models"].values())
    print_summary(report, args)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"figures: {args.json}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Reads a GGUF file written by `moe-convert export-gguf` with the `gguf` package (llama.cpp's own
reader, from PyPI) and checks it against the checkpoint it came from, read with h5py: every key
this script expects with its value, no other tensor than expected, every tensor's shape and type,
and every tensor's bytes equal to what the package itself encodes from the checkpoint's values
(f16, bf16, and Q8_0 with the package's own quantiser: the layout is llama.cpp's to the byte).
The name table and the q/k row permutation are written here from llama.cpp's conventions, not
shared with the exporter: mixtral is its "llama" architecture (NORM rope: q/k rows permuted),
qwen2_moe, qwen3_moe and olmoe its "qwen2moe", "qwen3moe" and "olmoe" (NEOX rope: rows as they
are), with their biases, q/k norms and shared expert; glm4_moe llama.cpp's "glm4moe" (NEOX, RoPE
on rope_dim features: leading dense layers, the correction bias exp_probs_b, post_attention_norm,
an ungated shared expert, its routing keys).
With a tokenizer.json (the one the checkpoint stores), its vocabulary, special tokens, merges and
pre-tokenizer name are checked too; without, the byte-level vocabulary.
The 4-bit block types: MXFP4 bytes equal the package's own quantiser's; Q4_K and Q6_K (which
the package only dequantises) dequantise, by the package, to within the format's error of the
checkpoint's values (their bytes are llama.cpp's reference quantiser's by the golden tests of
backend/cpu/quant_blocks); q4_k_m checks llama.cpp's choice of q6_k per tensor.
Usage: gguf_readback.py CHECKPOINT.h5 MODEL.gguf TYPE [TOKENIZER.json]
  (TYPE: f32 f16 bf16 q8_0 q4_k q6_k mxfp4 q4_k_m)"""
import json
import sys

import gguf
import h5py
import numpy as np

ckpt_path, gguf_path, type_name = sys.argv[1:4]
tokenizer_json = json.load(open(sys.argv[4], encoding="utf-8")) if len(sys.argv) > 4 else None
QT = gguf.GGMLQuantizationType
want_type = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_k": QT.Q4_K,
             "q6_k": QT.Q6_K, "mxfp4": QT.MXFP4, "q4_k_m": QT.Q4_K}[type_name]
BLOCK = {QT.Q8_0: 32, QT.MXFP4: 32, QT.Q4_K: 256, QT.Q6_K: 256}
# RMS error over RMS value a block type stays within on these (trained, near-normal) weights.
RMS_BOUND = {QT.Q4_K: 0.12, QT.Q6_K: 0.03}


def q4_k_m_wants_q6_k(name, layers):
    """llama.cpp's Q4_K_M: output.weight, and attn_v / ffn_down in use_more_bits layers."""
    if name == "output.weight":
        return True
    if not (name.endswith(".attn_v.weight") or name.endswith(".ffn_down_exps.weight")):
        return False
    i = int(name.split(".")[1])
    return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2
failures = []


def fail(msg):
    failures.append(msg)


with h5py.File(ckpt_path, "r") as f:
    config = json.loads(f.attrs["model_config"])
    params = {name: np.asarray(f["params"][name][()], dtype=np.float32) for name in f["params"]}

D, H, F, L = config["d_model"], config["heads"], config["d_ff"], config["layers"]
KV = config.get("kv_heads") or H
hd = config.get("head_dim") or D // H
Fs = config.get("shared_expert_ff", 0)
arch = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
        "olmoe": "olmoe", "glm4_moe": "glm4moe"}[config["arch"]]
glm = arch == "glm4moe"
qwen = arch in ("qwen2moe", "qwen3moe")
E = max(config["experts_per_layer"])
dense = [i for i in range(L) if config["experts_per_layer"][i] == 0]
V = config["vocab_size"]

reader = gguf.GGUFReader(gguf_path)
fields = {name: field for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def value(key):
    field = fields.get(key)
    if field is None:
        fail(f"key {key} missing")
        return None
    return field.contents()


expected_keys = {
    "general.architecture": arch,
    arch + ".embedding_length": D,
    arch + ".block_count": L,
    # glm4moe, qwen2moe, qwen3moe: the dense layers' width (HF intermediate_size), as llama.cpp's
    # converter writes it
    arch + ".feed_forward_length": (config.get("dense_ff") or F) if glm or qwen else F,
    arch + ".attention.head_count": H,
    arch + ".attention.head_count_kv": KV,
    arch + ".attention.key_length": hd,
    arch + ".attention.value_length": hd,
    arch + ".rope.dimension_count": config.get("rope_dim") or hd,
    arch + ".expert_count": E,
    arch + ".expert_used_count": config["top_k"],
    arch + ".context_length": config["seq"],
    arch + ".vocab_size": V,
    "tokenizer.ggml.model": "gpt2",
    "general.file_type": {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32, "q4_k": 14, "q6_k": 18,
                          "mxfp4": 38, "q4_k_m": 15}[type_name],
}
if arch != "llama":  # the qwen and olmoe architectures size their experts by this key
    expected_keys[arch + ".expert_feed_forward_length"] = F
if Fs > 0 and not glm:
    expected_keys[arch + ".expert_shared_feed_forward_length"] = Fs
if glm:  # llama.cpp's converter's Glm4MoeModel keys; all groups taking part is no group limit
    groups, group_k = config.get("router_groups", 1), config.get("router_group_topk", 1)
    grouped = groups > 1 and group_k < groups
    expected_keys.update({
        arch + ".expert_shared_count": Fs // F,
        arch + ".leading_dense_block_count": len(dense),
        arch + ".expert_group_count": groups if grouped else 1,
        arch + ".expert_group_used_count": group_k if grouped else 1,
        arch + ".expert_gating_func": 2,
        arch + ".expert_weights_norm": config["normalize_topk"],
    })
    if np.float32(value(arch + ".expert_weights_scale")) != np.float32(config["routed_scale"]):
        fail(f"{arch}.expert_weights_scale differs from routed_scale {config['routed_scale']}")
for key, want in expected_keys.items():
    got = value(key)
    if got != want:
        fail(f"{key} = {got!r}, expected {want!r}")
if glm:  # every architecture key the file holds is one llama.cpp's glm4moe reads and we check
    extra = {k for k in fields if k.startswith(arch + ".")} - set(expected_keys) - {
        arch + ".rope.freq_base", arch + ".attention.layer_norm_rms_epsilon",
        arch + ".expert_weights_scale"}
    if extra:
        fail(f"unexpected keys {sorted(extra)}")
for key, want in ((arch + ".rope.freq_base", config["rope_theta"]),
                  (arch + ".attention.layer_norm_rms_epsilon", config["norm_eps"])):
    got = value(key)
    if got is None or np.float32(got) != np.float32(want):
        fail(f"{key} = {got!r}, expected {want!r}")
tokens = value("tokenizer.ggml.tokens")
if tokenizer_json is None:
    # GPT-2's byte alphabet, written here from its definition: printable bytes are themselves.
    if tokens is None or len(tokens) != V or tokens[ord("a")] != "a" or tokens[ord(" ")] != "\u0120":
        fail(f"tokenizer.ggml.tokens: {None if tokens is None else tokens[:40]!r}")
    elif len(set(tokens)) != V:
        fail("tokenizer.ggml.tokens: not all distinct")
    if value("tokenizer.ggml.merges") != []:
        fail("tokenizer.ggml.merges is not an empty list")
else:
    # The tokenizer's own vocabulary by id, then [PAD<id>] up to the model's V; special added
    # tokens are control (3), padding unused (5), merges in rank order as "a b".
    want = [None] * V
    kinds = [1] * V
    for text, i in tokenizer_json["model"]["vocab"].items():
        want[i] = text
    for t in tokenizer_json.get("added_tokens", []):
        want[t["id"]] = t["content"]
        kinds[t["id"]] = 3 if t["special"] else 4
    for i in range(V):
        if want[i] is None:
            want[i], kinds[i] = f"[PAD{i}]", 5
    if tokens != want:
        fail("tokenizer.ggml.tokens differ from tokenizer.json's vocabulary")
    if value("tokenizer.ggml.token_type") != kinds:
        fail("tokenizer.ggml.token_type differs")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer_json["model"]["merges"]]
    if value("tokenizer.ggml.merges") != merges:
        fail("tokenizer.ggml.merges differ from tokenizer.json's")
    if value("tokenizer.ggml.pre") != "qwen2":
        fail(f"tokenizer.ggml.pre = {value('tokenizer.ggml.pre')!r}, expected 'qwen2'")
    if value("tokenizer.ggml.eos_token_id") != 0:
        fail("tokenizer.ggml.eos_token_id is not <|endoftext|>'s id 0")
    if value("tokenizer.ggml.add_eos_token") is not False:
        fail("tokenizer.ggml.add_eos_token is not false")
recorded = json.loads(value("moe.model_config"))
if recorded["d_model"] != D:
    fail("moe.model_config does not hold the model's config")
if recorded.get("router_center_rate", 0) != 0:
    fail("moe.model_config records router centring, which the file's plain routers do not have")


def centred(w, c):
    # A centred router (moe-train's default) is written as the weight its logits use:
    # W' = W - C (W c) c^T / |c|^2, C centring over the experts. The same operations in the same
    # order as nn::center_router_weight: sums in double, index order; the update in f32.
    cc = 0.0
    for x in c:
        cc += float(x) * float(x)
    if cc == 0.0:
        return w
    proj = []
    for row in w:
        a = 0.0
        for x, y in zip(row, c):
            a += float(x) * float(y)
        proj.append(a / cc)
    mean = 0.0
    for p in proj:
        mean += p
    mean /= len(proj)
    out = w.copy()
    for e, p in enumerate(proj):
        out[e] = w[e] - np.float32(p - mean) * c
    return out


def router(b):
    w = params[b + "moe.router.weight"]
    c = params.get(b + "moe.router.center")
    return w if c is None else centred(w, c)


def rope_permuted(w, heads):
    # llama rotates adjacent pairs; our rows pair (i, i + hd/2): row 2i + j <- row j*hd/2 + i.
    # The NEOX architectures pair (i, i + hd/2) as we do: rows as they are.
    if arch != "llama":
        return w
    return w.reshape(heads, 2, hd // 2, -1).swapaxes(1, 2).reshape(w.shape)


expected = {"token_embd.weight": (params["embed.tokens"], True),
            "output.weight": (params["lm_head.weight"], True),
            "output_norm.weight": (params["final_norm.weight"], False)}
for i in range(L):
    b, blk = f"blocks.{i}.", f"blk.{i}."
    expected.update({
        blk + "attn_norm.weight": (params[b + "norm1.weight"], False),
        blk + ("post_attention_norm.weight" if glm else "ffn_norm.weight"):
            (params[b + "norm2.weight"], False),
        blk + "attn_q.weight": (rope_permuted(params[b + "attn.q.weight"], H), True),
        blk + "attn_k.weight": (rope_permuted(params[b + "attn.k.weight"], KV), True),
        blk + "attn_v.weight": (params[b + "attn.v.weight"], True),
        blk + "attn_output.weight": (params[b + "attn.o.weight"], True),
    })
    for x in "qkv":  # qwen2moe's and glm4moe's q/k/v biases
        if b + f"attn.{x}.bias" in params:
            expected[blk + f"attn_{x}.bias"] = (params[b + f"attn.{x}.bias"], False)
    for x in "qk":  # qwen3moe's and glm4moe's per-head, olmoe's full-width q/k norms
        if b + f"attn.{x}_norm.weight" in params:
            expected[blk + f"attn_{x}_norm.weight"] = (params[b + f"attn.{x}_norm.weight"], False)
    if i in dense:  # glm4moe's leading dense layers
        expected.update({blk + f"ffn_{x}.weight": (params[b + f"mlp.{w}"], True)
                         for x, w in (("gate", "w1"), ("down", "w2"), ("up", "w3"))})
        continue
    expected.update({
        blk + "ffn_gate_inp.weight": (router(b), False),
        blk + "ffn_gate_exps.weight": (params[b + "moe.experts.w1"], True),
        blk + "ffn_down_exps.weight": (params[b + "moe.experts.w2"], True),
        blk + "ffn_up_exps.weight": (params[b + "moe.experts.w3"], True),
    })
    if b + "moe.router.bias" in params:  # glm4moe's correction bias, f32
        expected[blk + "exp_probs_b.bias"] = (params[b + "moe.router.bias"], False)
    if Fs > 0 and not glm:  # qwen2moe's shared gate [1, D] as llama.cpp's converter writes it
        expected[blk + "ffn_gate_inp_shexp.weight"] = (params[b + "moe.shared_gate.weight"], False)
    if Fs > 0:  # qwen2moe's and glm4moe's shared expert
        expected.update({
            blk + "ffn_gate_shexp.weight": (params[b + "moe.shared.w1"], True),
            blk + "ffn_down_shexp.weight": (params[b + "moe.shared.w2"], True),
            blk + "ffn_up_shexp.weight": (params[b + "moe.shared.w3"], True),
        })

seen = set()
for t in reader.tensors:
    seen.add(t.name)
    if t.name not in expected:
        fail(f"unexpected tensor {t.name}")
        continue
    values, matrix = expected[t.name]
    if list(t.shape) != list(reversed(values.shape)):
        fail(f"{t.name}: shape {list(t.shape)}, expected {list(reversed(values.shape))}")
        continue
    qtype = want_type if matrix else QT.F32
    if matrix and type_name == "q4_k_m" and q4_k_m_wants_q6_k(t.name, config["layers"]):
        qtype = QT.Q6_K
    if qtype in BLOCK and values.shape[-1] % BLOCK[qtype] != 0:
        qtype = QT.F16
    if t.tensor_type != qtype:
        fail(f"{t.name}: type {t.tensor_type.name}, expected {qtype.name}")
        continue
    back = gguf.quants.dequantize(t.data, qtype).reshape(values.shape)
    if qtype in RMS_BOUND:
        rms = float(np.sqrt(np.mean((back.astype(np.float64) - values) ** 2) /
                            max(np.mean(values.astype(np.float64) ** 2), 1e-30)))
        if not rms < RMS_BOUND[qtype]:
            fail(f"{t.name}: {qtype.name} dequantised RMS error {rms:.4f} of the RMS value "
                 f"(bound {RMS_BOUND[qtype]})")
    elif t.data.tobytes() != gguf.quants.quantize(values, qtype).tobytes():
        fail(f"{t.name}: bytes differ from gguf's own {qtype.name} encoding")
    if qtype == QT.F32 and not np.array_equal(back, values):
        fail(f"{t.name}: f32 values differ")
missing = set(expected) - seen
if missing:
    fail(f"tensors missing: {sorted(missing)}")

for msg in failures:
    print("FAIL:", msg)
print(f"{gguf_path}: {len(reader.tensors)} tensors, {len(fields)} keys read by gguf; "
      f"{len(failures)} failures")
sys.exit(1 if failures else 0)

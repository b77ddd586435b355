"""A gpt_oss checkpoint exported as llama.cpp's "gpt-oss", read back by llama.cpp's own `gguf`
package and checked against the checkpoint (read with h5py).
Usage: gguf_gpt_oss_readback.py CHECKPOINT.h5 MODEL.gguf TYPE   (TYPE: f32 f16 bf16 q8_0 mxfp4)
Checked, each written here from llama.cpp's converter (GptOssModel) and the package's tables, not
shared with the exporter:
- general.architecture "gpt-oss" and every gpt-oss.* key the converter writes, with its value:
  intermediate_size as both feed_forward_length and expert_feed_forward_length, the head width
  (head_dim, not hidden / heads), the sliding window (the context's length when nothing slides),
  YaRN's type, factor, original context and betas; no key beyond those (no expert_gating_func,
  no sliding_window_pattern: llama.cpp's graph fixes both);
- every tensor named by the package's own MODEL_TENSOR table for GPT_OSS (+ ".weight" / ".bias"),
  none else, with the shape (dims reversed) and type: matrices in TYPE (q8_0 / mxfp4 rows not
  whole blocks of 32 in f16), norms, biases, sinks and the router f32;
- every tensor's bytes equal to the package's own encoding of the checkpoint's values (its f16,
  bf16, Q8_0 and MXFP4 quantisers); q/k rows as they are (NEOX rope).
The experts' gate / up / down and their biases are our w1 / w3 / w2, b1 / b3 / b2 as they are:
llama.cpp's converter splits HF's interleaved gate_up_proj into exactly those."""
import json
import sys

import gguf
import h5py
import numpy as np

ckpt_path, gguf_path, type_name = sys.argv[1:4]
QT = gguf.GGMLQuantizationType
MT = gguf.MODEL_TENSOR
want_type = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0,
             "mxfp4": QT.MXFP4}[type_name]
BLOCK = {QT.Q8_0: 32, QT.MXFP4: 32}
failures = []


def fail(msg):
    failures.append(msg)


with h5py.File(ckpt_path, "r") as f:
    config = json.loads(f.attrs["model_config"])
    params = {name: np.asarray(f["params"][name][()], dtype=np.float32) for name in f["params"]}

if config["arch"] != "gpt_oss":
    sys.exit(f"{ckpt_path}: arch {config['arch']!r}, not gpt_oss")
D, H, F, L, V = config["d_model"], config["heads"], config["d_ff"], config["layers"], \
    config["vocab_size"]
KV = config.get("kv_heads") or H
hd = config.get("head_dim") or D // H
E = max(config["experts_per_layer"])
seq = config["seq"]
window = config.get("sliding_window", 0)

reader = gguf.GGUFReader(gguf_path)
fields = {name: field for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def value(key):
    field = fields.get(key)
    if field is None:
        fail(f"key {key} missing")
        return None
    return field.contents()


A = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT_OSS]  # "gpt-oss"
expected_keys = {
    "general.architecture": A,
    A + ".vocab_size": V,
    A + ".context_length": seq,
    A + ".embedding_length": D,
    A + ".block_count": L,
    A + ".feed_forward_length": F,
    A + ".expert_feed_forward_length": F,
    A + ".attention.head_count": H,
    A + ".attention.head_count_kv": KV,
    A + ".attention.key_length": hd,
    A + ".attention.value_length": hd,
    A + ".rope.dimension_count": hd,
    A + ".expert_count": E,
    A + ".expert_used_count": config["top_k"],
    # the even layers slide in llama.cpp's gpt-oss: a model with no window shorter than its
    # context goes out with one as long as the context (it masks nothing)
    A + ".attention.sliding_window": window if 0 < window < seq else seq,
    "general.file_type": {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32, "mxfp4": 38}[type_name],
}
float_keys = {A + ".rope.freq_base": config["rope_theta"],
              A + ".attention.layer_norm_rms_epsilon": config["norm_eps"]}
if config.get("rope_type", "none") == "yarn":
    y = config["yarn"]
    expected_keys[A + ".rope.scaling.type"] = "yarn"
    expected_keys[A + ".rope.scaling.original_context_length"] = int(y["original_ctx"])
    float_keys.update({A + ".rope.scaling.factor": y["factor"],
                       A + ".rope.scaling.yarn_beta_fast": y.get("beta_fast", 32),
                       A + ".rope.scaling.yarn_beta_slow": y.get("beta_slow", 1)})
for key, want in expected_keys.items():
    got = value(key)
    if got != want:
        fail(f"{key} = {got!r}, expected {want!r}")
for key, want in float_keys.items():
    got = value(key)
    if got is None or np.float32(got) != np.float32(want):
        fail(f"{key} = {got!r}, expected {want!r}")
extra = {k for k in fields if k.startswith(A + ".")} - set(expected_keys) - set(float_keys)
if extra:
    fail(f"keys llama.cpp's converter does not write for gpt-oss: {sorted(extra)}")
if json.loads(value("moe.model_config") or "{}").get("d_model") != D:
    fail("moe.model_config does not hold the model's config")


def name(tensor, suffix, bid=None):
    base = gguf.TENSOR_NAMES[tensor]
    if tensor not in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT_OSS]:
        fail(f"{base} is not one of gguf's GPT_OSS tensors")
    return (base.format(bid=bid) if bid is not None else base) + "." + suffix


# name -> (values, matrix: in TYPE, else f32)
expected = {name(MT.TOKEN_EMBD, "weight"): (params["embed.tokens"], True),
            name(MT.OUTPUT, "weight"): (params["lm_head.weight"], True),
            name(MT.OUTPUT_NORM, "weight"): (params["final_norm.weight"], False)}
for i in range(L):
    b = f"blocks.{i}."

    def put(tensor, suffix, ours, matrix):
        expected[name(tensor, suffix, i)] = (params[b + ours], matrix)

    put(MT.ATTN_NORM, "weight", "norm1.weight", False)
    put(MT.ATTN_POST_NORM, "weight", "norm2.weight", False)
    for t, x in ((MT.ATTN_Q, "q"), (MT.ATTN_K, "k"), (MT.ATTN_V, "v"), (MT.ATTN_OUT, "o")):
        put(t, "weight", f"attn.{x}.weight", True)
        put(t, "bias", f"attn.{x}.bias", False)
    put(MT.ATTN_SINKS, "weight", "attn.sinks", False)
    put(MT.FFN_GATE_INP, "weight", "moe.router.weight", False)
    put(MT.FFN_GATE_INP, "bias", "moe.router.logit_bias", False)
    for t, w, bias in ((MT.FFN_GATE_EXP, "w1", "b1"), (MT.FFN_DOWN_EXP, "w2", "b2"),
                       (MT.FFN_UP_EXP, "w3", "b3")):
        put(t, "weight", f"moe.experts.{w}", True)
        put(t, "bias", f"moe.experts.{bias}", False)

# (a centred router's moe.router.center too: the script expects plain routers, moe-train
# --router-center-rate 0)
taken = {id(v) for v, _ in expected.values()}
for n in params:
    if id(params[n]) not in taken:
        fail(f"checkpoint parameter {n} is in no tensor")

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
    if qtype in BLOCK and values.shape[-1] % BLOCK[qtype] != 0:
        qtype = QT.F16
    if t.tensor_type != qtype:
        fail(f"{t.name}: type {t.tensor_type.name}, expected {qtype.name}")
        continue
    if t.data.tobytes() != gguf.quants.quantize(values, qtype).tobytes():
        fail(f"{t.name}: bytes differ from gguf's own {qtype.name} encoding")
    back = gguf.quants.dequantize(t.data, qtype).reshape(values.shape)
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

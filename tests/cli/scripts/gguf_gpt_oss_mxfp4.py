"""gpt-oss's released MXFP4 experts through import-hf --keep-mxfp4 and export-gguf, checked by
llama.cpp's own `gguf` package against the Hugging Face directory.
  write DIR         writes a tiny transformers-format gpt-oss directory as the released
                    checkpoints are: config.json (GptOssConfig's keys, quantization_config
                    mxfp4), model.safetensors with every tensor GptOssForCausalLM has, the experts
                    as U8 _blocks [E, rows, in/32, 16] and _scales [E, rows, in/32] (rows the
                    output features, gate and up interleaved: row 2i gate i, 2i+1 up i), the rest
                    F32 (random from a fixed seed; scales 120..126).
  check DIR FILE    FILE = export-gguf --type f32 of DIR's import-hf --keep-mxfp4. Every expert
                    tensor is MXFP4 with the bytes llama.cpp's converter writes (per block the
                    scale byte, then the 32 nibbles reordered: byte j holds element j low and
                    element j + 16 high), and its values, dequantised by the package, equal the
                    directory's by transformers' own formula (lut[nibble] * 2^(scale - 127),
                    element 2j the low nibble of HF byte j); gate / up are the interleaved rows
                    ::2 / 1::2 and their biases the columns ::2 / 1::2; every other tensor the
                    directory's f32 values exactly; general.file_type 38 (MOSTLY_MXFP4_MOE).
Written from the format's definition and transformers' gpt-oss code, not shared with ours."""
import json
import os
import struct
import sys

import numpy as np

V, D, H, KV, HD, F, E, K, L = 256, 64, 4, 2, 32, 64, 4, 2, 2
LUT = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


def tensors():
    rng = np.random.default_rng(44)
    t = {}

    def rand(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def mxfp4(rows, inner):  # blocks and scales of E experts' [rows, inner] matrices
        blocks = rng.integers(0, 256, size=(E, rows, inner // 32, 16), dtype=np.uint8)
        scales = rng.integers(120, 127, size=(E, rows, inner // 32), dtype=np.uint8)
        return blocks, scales

    t["model.embed_tokens.weight"] = rand(V, D, scale=1.0)
    for i in range(L):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        t[p + "input_layernorm.weight"] = 1 + rand(D)
        t[p + "post_attention_layernorm.weight"] = 1 + rand(D)
        for x, rows in (("q", H * HD), ("k", KV * HD), ("v", KV * HD)):
            t[a + f"{x}_proj.weight"] = rand(rows, D)
            t[a + f"{x}_proj.bias"] = rand(rows)
        t[a + "o_proj.weight"] = rand(D, H * HD)
        t[a + "o_proj.bias"] = rand(D)
        t[a + "sinks"] = rand(H, scale=1.0)
        t[m + "router.weight"] = rand(E, D)
        t[m + "router.bias"] = rand(E)
        t[m + "experts.gate_up_proj_blocks"], t[m + "experts.gate_up_proj_scales"] = mxfp4(2 * F, D)
        t[m + "experts.gate_up_proj_bias"] = rand(E, 2 * F)
        t[m + "experts.down_proj_blocks"], t[m + "experts.down_proj_scales"] = mxfp4(D, F)
        t[m + "experts.down_proj_bias"] = rand(E, D)
    t["model.norm.weight"] = 1 + rand(D)
    t["lm_head.weight"] = rand(V, D)
    return t


CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": V,
    "hidden_size": D, "intermediate_size": F, "num_hidden_layers": L,
    "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": HD,
    "num_local_experts": E, "num_experts_per_tok": K, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"], "rms_norm_eps": 1e-5,
    "max_position_embeddings": 32, "attention_bias": True, "tie_word_embeddings": False,
    "hidden_act": "silu", "swiglu_limit": 7.0, "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                        "truncate": False, "original_max_position_embeddings": 8,
                        "rope_theta": 150000.0},
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn",
                                                       "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"]},
    "torch_dtype": "float32",
}


def write(d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    header, blobs, offset = {}, [], 0
    for name, a in tensors().items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": "U8" if a.dtype == np.uint8 else "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_values(blocks, scales):
    """transformers' dequantisation: [E, rows, in] from U8 blocks / scales (float64)."""
    lo, hi = LUT[blocks & 15], LUT[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)  # element 2j, 2j + 1
    vals = vals * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    return vals.reshape(blocks.shape[0], blocks.shape[1], -1)


def ggml_bytes(blocks, scales):
    """llama.cpp's MXFP4 blocks of HF's: the scale byte, then byte j = nibble j | nibble j+16 << 4."""
    nib = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = (nib[..., :16] | (nib[..., 16:] << 4)).astype(np.uint8)
    return np.concatenate([scales[..., None], qs], axis=-1).tobytes()


def check(d, path):
    import gguf
    t = tensors()
    reader = gguf.GGUFReader(path)
    got = {x.name: x for x in reader.tensors}
    fails = []
    ft = reader.fields["general.file_type"].contents()
    if ft != 38:
        fails.append(f"general.file_type {ft}, expected 38")
    expected = {"token_embd.weight": t["model.embed_tokens.weight"],
                "output.weight": t["lm_head.weight"], "output_norm.weight": t["model.norm.weight"]}
    for i in range(L):
        p, a, m, b = (f"model.layers.{i}.", f"model.layers.{i}.self_attn.",
                      f"model.layers.{i}.mlp.", f"blk.{i}.")
        expected.update({
            b + "attn_norm.weight": t[p + "input_layernorm.weight"],
            b + "post_attention_norm.weight": t[p + "post_attention_layernorm.weight"],
            b + "attn_sinks.weight": t[a + "sinks"],
            b + "ffn_gate_inp.weight": t[m + "router.weight"],
            b + "ffn_gate_inp.bias": t[m + "router.bias"],
            b + "ffn_gate_exps.bias": t[m + "experts.gate_up_proj_bias"][:, ::2],
            b + "ffn_up_exps.bias": t[m + "experts.gate_up_proj_bias"][:, 1::2],
            b + "ffn_down_exps.bias": t[m + "experts.down_proj_bias"],
        })
        for x, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
            expected[b + f"attn_{g}.weight"] = t[a + f"{x}_proj.weight"]
            expected[b + f"attn_{g}.bias"] = t[a + f"{x}_proj.bias"]
        gu_b, gu_s = t[m + "experts.gate_up_proj_blocks"], t[m + "experts.gate_up_proj_scales"]
        dn_b, dn_s = t[m + "experts.down_proj_blocks"], t[m + "experts.down_proj_scales"]
        for name, (bl, sc) in {"ffn_gate_exps.weight": (gu_b[:, ::2], gu_s[:, ::2]),
                               "ffn_up_exps.weight": (gu_b[:, 1::2], gu_s[:, 1::2]),
                               "ffn_down_exps.weight": (dn_b, dn_s)}.items():
            x = got.get(b + name)
            if x is None:
                fails.append(f"no {b + name}")
                continue
            if x.tensor_type != gguf.GGMLQuantizationType.MXFP4:
                fails.append(f"{b + name}: type {x.tensor_type.name}, expected MXFP4")
                continue
            want = hf_values(bl, sc)  # [E, rows, in]
            if list(x.shape) != list(reversed(want.shape)):
                fails.append(f"{b + name}: shape {list(x.shape)}, expected {list(reversed(want.shape))}")
                continue
            if x.data.tobytes() != ggml_bytes(bl, sc):
                fails.append(f"{b + name}: bytes differ from the converter's repacking")
            back = gguf.quants.dequantize(x.data, x.tensor_type).reshape(want.shape)
            if not np.array_equal(back.astype(np.float64), want):
                fails.append(f"{b + name}: values differ from transformers' dequantisation")
    for name, want in expected.items():
        x = got.get(name)
        if x is None:
            fails.append(f"no {name}")
            continue
        back = gguf.quants.dequantize(x.data, x.tensor_type).reshape(want.shape)
        if x.tensor_type != gguf.GGMLQuantizationType.F32 or not np.array_equal(back, want):
            fails.append(f"{name}: not the directory's f32 values ({x.tensor_type.name})")
    extra = set(got) - set(expected) - {f"blk.{i}.ffn_{x}_exps.weight" for i in range(L)
                                         for x in ("gate", "up", "down")}
    if extra:
        fails.append(f"unexpected tensors {sorted(extra)}")
    for msg in fails:
        print("FAIL:", msg)
    print(f"{path}: {len(reader.tensors)} tensors; {len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))

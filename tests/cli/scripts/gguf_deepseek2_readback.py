"""DeepSeek models as llama.cpp's "deepseek2", read back by llama.cpp's own `gguf` package.
  write DIR v3|v2lite   writes a tiny Hugging Face DeepSeek directory: config.json with the keys
                        transformers' DeepseekV3Config (DeepseekV2Config) writes, model.safetensors
                        holding every tensor its classes create (f32, random from a fixed seed).
                        v3: q latent, sigmoid router with e_score_correction_bias, 4 groups of
                        which 2 are chosen, one shared expert, a multi-token-prediction layer;
                        v2lite: plain q_proj, softmax router, two shared experts.
  check DIR FILE TYPE   reads FILE (moe-convert export-gguf of DIR's import, TYPE f32 or q8_0)
                        with the gguf package and checks it against DIR's tensors: every key
                        llama.cpp's converter writes for deepseek2 with its value, every tensor's
                        name, shape, type, and bytes equal to the package's own encoding of the
                        values expected here. The expectations are written from llama.cpp's
                        converter's conventions (DeepseekV2Model), not shared with the exporter:
                        kv_b_proj split per head into attn_k_b (transposed, {dn, c, H}) and
                        attn_v_b ({c, dv, H}); q / kv_a rows as DeepSeek holds them (interleaved
                        RoPE pairs, llama.cpp's NORM rope); one key/value head; q8_0 rows that are
                        not whole blocks of 32 in f16."""
import json
import os
import struct
import sys

import numpy as np

V, D, H, C, DN, DR, DV, F, FD, E, K, L = 256, 64, 4, 32, 16, 16, 16, 32, 96, 8, 2, 3
SHAPES = {"v3": dict(r=32, shared=1, groups=4, group_k=2, scale=2.5, v2=False, nextn=1),
          "v2lite": dict(r=0, shared=2, groups=1, group_k=1, scale=1.0, v2=True, nextn=0)}


def tensors_of(s):
    rng = np.random.default_rng(44 if s["v2"] else 45)
    t = {}

    def rand(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def mlp(prefix, width):
        t[prefix + "gate_proj.weight"] = rand(width, D)
        t[prefix + "up_proj.weight"] = rand(width, D)
        t[prefix + "down_proj.weight"] = rand(D, width)

    t["model.embed_tokens.weight"] = rand(V, D, scale=1.0)
    for i in range(L + s["nextn"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t[p + "input_layernorm.weight"] = 1 + rand(D)
        t[p + "post_attention_layernorm.weight"] = 1 + rand(D)
        if s["r"]:
            t[a + "q_a_proj.weight"] = rand(s["r"], D)
            t[a + "q_a_layernorm.weight"] = 1 + rand(s["r"])
            t[a + "q_b_proj.weight"] = rand(H * (DN + DR), s["r"])
        else:
            t[a + "q_proj.weight"] = rand(H * (DN + DR), D)
        t[a + "kv_a_proj_with_mqa.weight"] = rand(C + DR, D)
        t[a + "kv_a_layernorm.weight"] = 1 + rand(C)
        t[a + "kv_b_proj.weight"] = rand(H * (DN + DV), C)
        t[a + "o_proj.weight"] = rand(D, H * DV)
        if i < 1:
            mlp(p + "mlp.", FD)
            continue
        t[p + "mlp.gate.weight"] = rand(E, D)
        if not s["v2"]:
            t[p + "mlp.gate.e_score_correction_bias"] = rand(E, scale=0.05)
        for e in range(E):
            mlp(p + f"mlp.experts.{e}.", F)
        mlp(p + "mlp.shared_experts.", s["shared"] * F)
        if i >= L:  # the multi-token-prediction layer's own tensors
            t[p + "eh_proj.weight"] = rand(D, 2 * D)
            t[p + "enorm.weight"] = 1 + rand(D)
            t[p + "hnorm.weight"] = 1 + rand(D)
    t["model.norm.weight"] = 1 + rand(D)
    t["lm_head.weight"] = rand(V, D)
    return t


def config_of(s):
    c = {"architectures": ["DeepseekV2ForCausalLM" if s["v2"] else "DeepseekV3ForCausalLM"],
         "model_type": "deepseek_v2" if s["v2"] else "deepseek_v3", "vocab_size": V,
         "hidden_size": D, "intermediate_size": FD, "moe_intermediate_size": F,
         "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": H,
         "q_lora_rank": s["r"] or None, "kv_lora_rank": C, "qk_nope_head_dim": DN,
         "qk_rope_head_dim": DR, "v_head_dim": DV, "head_dim": DR, "hidden_act": "silu",
         "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
         "attention_bias": False, "n_shared_experts": s["shared"], "n_routed_experts": E,
         "num_experts_per_tok": K, "routed_scaling_factor": s["scale"],
         "first_k_dense_replace": 1, "norm_topk_prob": not s["v2"],
         "tie_word_embeddings": False, "torch_dtype": "float32"}
    if s["v2"]:
        c["topk_method"] = "greedy"
    else:
        c.update({"n_group": s["groups"], "topk_group": s["group_k"], "rope_interleave": True,
                  "num_nextn_predict_layers": s["nextn"], "topk_method": "noaux_tc"})
    return c


def write(out, variant):
    s = SHAPES[variant]
    os.makedirs(out, exist_ok=True)
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors_of(s).items():
        data = t.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_of(s), f, indent=2)
    with open(os.path.join(out, "variant"), "w") as f:
        f.write(variant)


def expected_tensors(s, t):
    """llama.cpp's name -> (values in HF's row-major order, is a weight matrix)."""
    out = {"token_embd.weight": (t["model.embed_tokens.weight"], True),
           "output.weight": (t["lm_head.weight"], True),
           "output_norm.weight": (t["model.norm.weight"], False)}
    for i in range(L):  # the prediction layer is not exported
        p, a, b = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"blk.{i}."
        out[b + "attn_norm.weight"] = (t[p + "input_layernorm.weight"], False)
        out[b + "ffn_norm.weight"] = (t[p + "post_attention_layernorm.weight"], False)
        if s["r"]:
            out[b + "attn_q_a.weight"] = (t[a + "q_a_proj.weight"], True)
            out[b + "attn_q_a_norm.weight"] = (t[a + "q_a_layernorm.weight"], False)
            out[b + "attn_q_b.weight"] = (t[a + "q_b_proj.weight"], True)
        else:
            out[b + "attn_q.weight"] = (t[a + "q_proj.weight"], True)
        out[b + "attn_kv_a_mqa.weight"] = (t[a + "kv_a_proj_with_mqa.weight"], True)
        out[b + "attn_kv_a_norm.weight"] = (t[a + "kv_a_layernorm.weight"], False)
        kv_b = t[a + "kv_b_proj.weight"].reshape(H, DN + DV, C)
        out[b + "attn_k_b.weight"] = (np.ascontiguousarray(kv_b[:, :DN, :].transpose(0, 2, 1)), True)
        out[b + "attn_v_b.weight"] = (np.ascontiguousarray(kv_b[:, DN:, :]), True)
        out[b + "attn_output.weight"] = (t[a + "o_proj.weight"], True)
        if i < 1:
            for x in ("gate", "up", "down"):
                out[b + f"ffn_{x}.weight"] = (t[p + f"mlp.{x}_proj.weight"], True)
            continue
        out[b + "ffn_gate_inp.weight"] = (t[p + "mlp.gate.weight"], False)
        if not s["v2"]:
            out[b + "exp_probs_b.bias"] = (t[p + "mlp.gate.e_score_correction_bias"], False)
        for x in ("gate", "up", "down"):
            out[b + f"ffn_{x}_exps.weight"] = (
                np.stack([t[p + f"mlp.experts.{e}.{x}_proj.weight"] for e in range(E)]), True)
            out[b + f"ffn_{x}_shexp.weight"] = (t[p + f"mlp.shared_experts.{x}_proj.weight"], True)
    return out


def check(src, path, type_name):
    import gguf
    s = SHAPES[open(os.path.join(src, "variant")).read()]
    t = tensors_of(s)
    QT = gguf.GGMLQuantizationType
    want_type = {"f32": QT.F32, "q8_0": QT.Q8_0}[type_name]
    failures = []
    reader = gguf.GGUFReader(path)
    fields = {n: f for n, f in reader.fields.items() if not n.startswith("GGUF.")}

    def value(key):
        return fields[key].contents() if key in fields else None

    a = "deepseek2."
    keys = {"general.architecture": "deepseek2", a + "block_count": L, a + "context_length": 128,
            a + "embedding_length": D, a + "feed_forward_length": FD,
            a + "expert_feed_forward_length": F, a + "attention.head_count": H,
            a + "attention.head_count_kv": 1, a + "attention.key_length": C + DR,
            a + "attention.value_length": C, a + "attention.key_length_mla": DN + DR,
            a + "attention.value_length_mla": DV, a + "attention.q_lora_rank": s["r"],
            a + "attention.kv_lora_rank": C, a + "rope.dimension_count": DR,
            a + "expert_count": E, a + "expert_used_count": K,
            a + "leading_dense_block_count": 1, a + "expert_shared_count": s["shared"],
            a + "expert_gating_func": 1 if s["v2"] else 2,
            a + "expert_weights_norm": not s["v2"],
            a + "expert_group_count": s["groups"], a + "expert_group_used_count": s["group_k"],
            a + "vocab_size": V}
    for key, want in keys.items():
        if value(key) != want:
            failures.append(f"{key} = {value(key)!r}, expected {want!r}")
    for key, want in ((a + "expert_weights_scale", s["scale"]), (a + "rope.freq_base", 10000.0),
                      (a + "attention.layer_norm_rms_epsilon", 1e-6)):
        if value(key) is None or np.float32(value(key)) != np.float32(want):
            failures.append(f"{key} = {value(key)!r}, expected {want!r}")
    extra = {k for k in fields if k.startswith(a)} - set(keys) - {
        a + "expert_weights_scale", a + "rope.freq_base", a + "attention.layer_norm_rms_epsilon"}
    if extra:
        failures.append(f"keys not checked here: {sorted(extra)}")

    expected = expected_tensors(s, t)
    for ten in reader.tensors:
        if ten.name not in expected:
            failures.append(f"unexpected tensor {ten.name}")
            continue
        values, matrix = expected.pop(ten.name)
        if list(ten.shape) != list(reversed(values.shape)):
            failures.append(f"{ten.name}: shape {list(ten.shape)}, expected "
                            f"{list(reversed(values.shape))}")
            continue
        qtype = want_type if matrix else QT.F32
        if qtype == QT.Q8_0 and values.shape[-1] % 32 != 0:
            qtype = QT.F16
        if ten.tensor_type != qtype:
            failures.append(f"{ten.name}: type {ten.tensor_type.name}, expected {qtype.name}")
        elif ten.data.tobytes() != gguf.quants.quantize(values, qtype).tobytes():
            failures.append(f"{ten.name}: bytes differ from gguf's own {qtype.name} encoding")
    if expected:
        failures.append(f"tensors missing: {sorted(expected)}")
    for msg in failures:
        print("FAIL:", msg)
    print(f"{path}: {len(reader.tensors)} tensors, {len(fields)} keys read by gguf; "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4]))

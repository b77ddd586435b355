"""Writes a tiny Hugging Face GLM-4-MoE directory for the GGUF read-back test: config.json with
the keys transformers' Glm4MoeConfig writes and model.safetensors (u64 header length, JSON header,
little-endian f32 data) holding every tensor Glm4MoeForCausalLM creates: a leading dense layer
(first_k_dense_replace 1), q/k/v biases, per-head q/k norms, 8 experts in 4 groups of which 2 are
chosen, the correction bias, one shared expert; RoPE on half of each head. Random values from a
fixed seed. Usage: hf_tiny_glm4_moe.py DIR"""
import json
import os
import struct
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
V, D, H, KV, hd, F, Fd, E, L, DENSE = 256, 64, 4, 2, 32, 32, 96, 8, 3, 1
rng = np.random.default_rng(44)
tensors = {}


def rand(*shape, scale=0.1):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp(prefix, width):
    tensors[prefix + "gate_proj.weight"] = rand(width, D)
    tensors[prefix + "up_proj.weight"] = rand(width, D)
    tensors[prefix + "down_proj.weight"] = rand(D, width)


tensors["model.embed_tokens.weight"] = rand(V, D, scale=1.0)
for i in range(L):
    p = f"model.layers.{i}."
    tensors[p + "input_layernorm.weight"] = 1 + rand(D)
    tensors[p + "post_attention_layernorm.weight"] = 1 + rand(D)
    for x, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
        tensors[p + f"self_attn.{x}_proj.weight"] = rand(rows, D)
        tensors[p + f"self_attn.{x}_proj.bias"] = rand(rows)
    tensors[p + "self_attn.o_proj.weight"] = rand(D, H * hd)
    tensors[p + "self_attn.q_norm.weight"] = 1 + rand(hd)
    tensors[p + "self_attn.k_norm.weight"] = 1 + rand(hd)
    if i < DENSE:
        mlp(p + "mlp.", Fd)
        continue
    tensors[p + "mlp.gate.weight"] = rand(E, D)
    tensors[p + "mlp.gate.e_score_correction_bias"] = rand(E, scale=0.05)
    for e in range(E):
        mlp(p + f"mlp.experts.{e}.", F)
    mlp(p + "mlp.shared_experts.", F)
tensors["model.norm.weight"] = 1 + rand(D)
tensors["lm_head.weight"] = rand(V, D)

header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
for name, t in tensors.items():
    data = t.astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    offset += len(data)
    blobs.append(data)
head = json.dumps(header).encode()
head += b" " * ((8 - len(head) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
config = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": V,
    "hidden_size": D, "intermediate_size": Fd, "moe_intermediate_size": F,
    "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
    "head_dim": hd, "partial_rotary_factor": 0.5, "hidden_act": "silu",
    "max_position_embeddings": 128, "initializer_range": 0.02, "rms_norm_eps": 1e-5,
    "use_cache": True, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
    "attention_bias": True, "attention_dropout": 0.0, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "n_routed_experts": E, "routed_scaling_factor": 2.5, "n_group": 4,
    "topk_group": 2, "first_k_dense_replace": DENSE, "norm_topk_prob": True,
    "use_qk_norm": True, "num_nextn_predict_layers": 0, "output_router_logits": False,
    "router_aux_loss_coef": 0.001, "torch_dtype": "float32"}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)

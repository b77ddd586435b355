"""Writes a tiny Hugging Face Qwen2-MoE directory for the GGUF read-back test: config.json with
the keys transformers' Qwen2MoeConfig writes and model.safetensors (written here from the
format's definition: u64 header length, JSON header, little-endian f32 data) holding every tensor
Qwen2MoeForCausalLM creates: q/k/v biases, 4 experts, the shared expert and its gate. Random
values from a fixed seed. Usage: hf_tiny_qwen2_moe.py DIR"""
import json
import os
import struct
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
V, D, H, KV, F, Fs, E, L = 256, 64, 4, 2, 64, 32, 4, 2
hd = D // H
rng = np.random.default_rng(21)
tensors = {}


def rand(*shape, scale=0.1):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


tensors["model.embed_tokens.weight"] = rand(V, D, scale=1.0)
for i in range(L):
    p = f"model.layers.{i}."
    tensors[p + "input_layernorm.weight"] = 1 + rand(D)
    tensors[p + "post_attention_layernorm.weight"] = 1 + rand(D)
    tensors[p + "self_attn.q_proj.weight"] = rand(H * hd, D)
    tensors[p + "self_attn.k_proj.weight"] = rand(KV * hd, D)
    tensors[p + "self_attn.v_proj.weight"] = rand(KV * hd, D)
    tensors[p + "self_attn.o_proj.weight"] = rand(D, H * hd)
    tensors[p + "self_attn.q_proj.bias"] = rand(H * hd)
    tensors[p + "self_attn.k_proj.bias"] = rand(KV * hd)
    tensors[p + "self_attn.v_proj.bias"] = rand(KV * hd)
    tensors[p + "mlp.gate.weight"] = rand(E, D)
    for e in range(E):
        x = p + f"mlp.experts.{e}."
        tensors[x + "gate_proj.weight"] = rand(F, D)
        tensors[x + "up_proj.weight"] = rand(F, D)
        tensors[x + "down_proj.weight"] = rand(D, F)
    tensors[p + "mlp.shared_expert.gate_proj.weight"] = rand(Fs, D)
    tensors[p + "mlp.shared_expert.up_proj.weight"] = rand(Fs, D)
    tensors[p + "mlp.shared_expert.down_proj.weight"] = rand(D, Fs)
    tensors[p + "mlp.shared_expert_gate.weight"] = rand(1, D)
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
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": V,
    "hidden_size": D, "intermediate_size": 4 * F, "moe_intermediate_size": F,
    "shared_expert_intermediate_size": Fs, "num_hidden_layers": L, "num_attention_heads": H,
    "num_key_value_heads": KV, "hidden_act": "silu", "max_position_embeddings": 128,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "tie_word_embeddings": False, "rope_theta": 1000000.0, "rope_scaling": None,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    "attention_dropout": 0.0, "decoder_sparse_step": 1, "num_experts_per_tok": 2,
    "num_experts": E, "norm_topk_prob": False, "output_router_logits": False,
    "router_aux_loss_coef": 0.001, "mlp_only_layers": [], "torch_dtype": "float32"}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)

"""Writes a Hugging Face model directory of random bf16 weights at a real MoE configuration, one
tensor at a time (memory: the largest tensor), for bench/real_size.sh. The tensors and config keys
are the ones transformers writes for the family; the values are normal(0, 0.02) rounded to bf16,
from a seeded generator, so two runs write the same bytes.
Usage: make_hf_random.py FAMILY LAYERS OUT_DIR   (FAMILY: olmoe | qwen3_moe)
  olmoe      OLMoE-1B-7B: D 2048, F 1024, 64 experts top-8, 16 heads, V 50304 (16 layers: 6.9B)
  qwen3_moe  Qwen3-30B-A3B: D 2048, F 768, 128 experts top-8, 32 heads / 4 kv, hd 128,
             V 151936 (48 layers: 30.5B)"""
import json
import os
import sys

import numpy as np

family, layers, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if family == "olmoe":
    D, F, E, K, H, KV, hd, V = 2048, 1024, 64, 8, 16, 16, 128, 50304
    config = {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "hidden_size": D,
              "intermediate_size": F, "num_hidden_layers": layers, "num_attention_heads": H,
              "num_key_value_heads": KV, "num_experts": E, "num_experts_per_tok": K,
              "vocab_size": V, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "norm_topk_prob": False, "clip_qkv": None,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
elif family == "qwen3_moe":
    D, F, E, K, H, KV, hd, V = 2048, 768, 128, 8, 32, 4, 128, 151936
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
              "hidden_size": D, "moe_intermediate_size": F, "intermediate_size": 6144,
              "num_hidden_layers": layers, "num_attention_heads": H, "num_key_value_heads": KV,
              "head_dim": hd, "num_experts": E, "num_experts_per_tok": K, "vocab_size": V,
              "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
else:
    sys.exit(f"make_hf_random.py: unknown family {family!r} (olmoe, qwen3_moe)")

norm_width = H * hd if family == "olmoe" else hd  # OLMoE's q/k norms span all heads
tensors = [("model.embed_tokens.weight", (V, D))]
for i in range(layers):
    p = f"model.layers.{i}."
    tensors += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,)),
                (p + "self_attn.q_proj.weight", (H * hd, D)),
                (p + "self_attn.k_proj.weight", (KV * hd, D)),
                (p + "self_attn.v_proj.weight", (KV * hd, D)),
                (p + "self_attn.o_proj.weight", (D, H * hd)),
                (p + "self_attn.q_norm.weight", (norm_width,)),
                (p + "self_attn.k_norm.weight", (norm_width if family == "qwen3_moe" else KV * hd,)),
                (p + "mlp.gate.weight", (E, D))]
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        tensors += [(q + "gate_proj.weight", (F, D)), (q + "up_proj.weight", (F, D)),
                    (q + "down_proj.weight", (D, F))]
tensors += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]

os.makedirs(out, exist_ok=True)
header, offset = {}, 0
for name, shape in tensors:
    n = int(np.prod(shape)) * 2
    header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
    offset += n
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
rng = np.random.default_rng(43)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    for name, shape in tensors:
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        bits = (values.view(np.uint32) + 0x8000) >> 16  # round to bf16 (no NaN here)
        f.write(bits.astype("<u2").tobytes())
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
print(f"{out}: {len(tensors)} tensors, {offset / 1e9:.2f} GB")

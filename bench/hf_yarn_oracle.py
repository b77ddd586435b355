#!/usr/bin/env python3
"""Oracle for YaRN RoPE (issue 44): a tiny random DeepSeek-V3 with rope_type "yarn", saved by
transformers' own classes, scored and greedily continued by transformers; compare with
moe-convert import-hf + moe-infer score / generate on the same bytes (see bench/hf_yarn_oracle.sh).

usage: hf_yarn_oracle.py OUT_DIR   (writes OUT_DIR/hf, OUT_DIR/data.bin, OUT_DIR/prompts.jsonl,
                                    OUT_DIR/reference.json)
Needs torch and transformers (5.25 was used)."""
import json
import os
import sys

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

out = sys.argv[1]
torch.manual_seed(44)
config = DeepseekV3Config(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
    n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
    routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=16,
    qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=1024, initializer_range=0.2,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                     "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 0.707, "mscale_all_dim": 1.0},
    tie_word_embeddings=False)
model = DeepseekV3ForCausalLM(config).float().eval()
with torch.no_grad():  # a correction bias that is not zero, as trained checkpoints have
    for layer in model.model.layers[config.first_k_dense_replace:]:
        layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.05)
model.save_pretrained(os.path.join(out, "hf"), safe_serialization=True)

T = 96  # one window of T + 1 bytes: T predicted tokens
ids = torch.randint(0, 256, (1, T + 1), generator=torch.Generator().manual_seed(7))
with open(os.path.join(out, "data.bin"), "wb") as f:
    f.write(bytes(ids[0].tolist()))
with torch.no_grad():
    logits = model(ids[:, :T]).logits.double()
    logprob_sum = float(torch.log_softmax(logits, -1)[0, torch.arange(T), ids[0, 1:]].sum())
    prompt = ids[:, :24]
    greedy = model.generate(prompt, max_new_tokens=40, do_sample=False, min_new_tokens=40,
                            eos_token_id=None, pad_token_id=0)[0, 24:].tolist()
with open(os.path.join(out, "prompts.jsonl"), "w") as f:
    f.write(json.dumps({"tokens": prompt[0].tolist(), "max_new": 40}) + "\n")
json.dump({"tokens": T, "logprob_sum": logprob_sum, "greedy": greedy,
           "config_rope": model.config.rope_parameters,
           "attention_scaling": float(model.model.rotary_emb.attention_scaling),
           "softmax_scaling": float(model.model.layers[0].self_attn.scaling)},
          open(os.path.join(out, "reference.json"), "w"), indent=1)
print(json.dumps({"logprob_sum": logprob_sum, "greedy": greedy}))

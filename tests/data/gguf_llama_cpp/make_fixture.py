"""Makes the llama.cpp-written GGUF fixture once (the files next to this script are its output,
committed; tests/cli/test_gguf_llama_cpp_cli.cpp reads them):
  hf/           a tiny Mixtral written by transformers (MixtralForCausalLM, seeded random weights,
                save_pretrained in f32) with the SentencePiece tokenizer of ../tokenizers/spm;
  mixtral-f32.gguf, mixtral-q8_0.gguf
                that directory converted by llama.cpp's own converter (convert_hf_to_gguf.py,
                --outtype f32 / q8_0; the converter permutes q/k rows and quantises with gguf-py);
  q8_0-dequantized.safetensors
                what llama.cpp's Python reader (gguf-py: GGUFReader + quants.dequantize) reads out
                of mixtral-q8_0.gguf, every tensor widened to f32 and put back under its Hugging
                Face name and row order (q/k rows un-permuted), so that hf/'s config and tokenizer
                beside it make the model llama.cpp's q8_0 file holds.
Run: make_fixture.sh (it says what it needs)."""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import MixtralConfig, MixtralForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
llama_cpp = sys.argv[1]
sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
import gguf  # noqa: E402  (the converter's own copy)

V, D, F, H, KV, E, K, L = 600, 32, 32, 4, 2, 4, 2, 2


def write_hf(out):
    torch.manual_seed(7)
    config = MixtralConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                           num_attention_heads=H, num_key_value_heads=KV, num_local_experts=E,
                           num_experts_per_tok=K, max_position_embeddings=64, rms_norm_eps=1e-5,
                           rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                           tie_word_embeddings=False)
    model = MixtralForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # weights far from the init's tiny values, so scores tell models apart
        for _, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if p.dim() == 1 else 0.2 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(os.path.join(here, "..", "tokenizers", "spm", "tokenizer.model"), out)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}, f)
    os.remove(os.path.join(out, "generation_config.json"))


def unpermute(w, heads):
    # The converter's permute(w, heads) groups each head's rows as (2, hd / 2) and swaps the two
    # axes; its inverse swaps them back.
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_names(name, data):
    """The Hugging Face tensors of one GGUF tensor, as (name, f32 array) pairs."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "output_norm.weight": "model.norm.weight"}
    if name in fixed:
        return [(fixed[name], data)]
    _, layer, part, _ = name.split(".")
    p = f"model.layers.{layer}."
    single = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
              "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
              "ffn_gate_inp": "block_sparse_moe.gate"}
    if part in single:
        return [(p + single[part] + ".weight", data)]
    if part == "attn_q":
        return [(p + "self_attn.q_proj.weight", unpermute(data, H))]
    if part == "attn_k":
        return [(p + "self_attn.k_proj.weight", unpermute(data, KV))]
    w = {"ffn_gate_exps": "w1", "ffn_down_exps": "w2", "ffn_up_exps": "w3"}[part]
    return [(f"{p}block_sparse_moe.experts.{e}.{w}.weight", data[e]) for e in range(E)]


def dequantized(path):
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        for name, value in hf_names(t.name, data):
            out[name] = np.ascontiguousarray(value)
    return out


if sys.argv[2:] == ["dequantize"]:  # after the conversion
    save_file(dequantized(os.path.join(here, "mixtral-q8_0.gguf")),
              os.path.join(here, "q8_0-dequantized.safetensors"))
else:
    write_hf(os.path.join(here, "hf"))

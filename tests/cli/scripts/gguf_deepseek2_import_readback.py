"""A quantised deepseek2 GGUF file and our import of it (gguf_deepseek2_import_readback.sh), read
by llama.cpp's own `gguf` package: our attn.k_b [H*dn, c] must be, bit for bit, its dequantisation
of attn_k_b [H, c, dn] with each head transposed; our q_b (or q), kv_a and k_rope the file's block
rows (attn_q_b / attn_q, attn_kv_a_mqa) moved from DeepSeek's layout (each head [dn nope | dr rope
in interleaved pairs]) into ours ([dr rope in rotate-half order | dn nope]), each row's bytes as
the file holds them (our Q8_0 rows in a q8_0 checkpoint: the block's int8 values, then its f16
scales). Usage: gguf_deepseek2_import_readback.py FILE.gguf IMPORTED.h5"""
import sys

import h5py
import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize


def key(reader, name):
    return int(reader.fields[name].parts[-1][0])


def rope(first, dr):
    return [first + 2 * j for j in range(dr // 2)] + [first + 2 * j + 1 for j in range(dr // 2)]


def our_rows(raw, qtype, in_dim):
    """Rows of raw file bytes as we store them: q8_0 as our Q8_0 rows, the others as they are."""
    if qtype != GGMLQuantizationType.Q8_0:
        return raw
    blocks = raw.reshape(raw.shape[0], in_dim // 32, 34)
    return np.concatenate([blocks[:, :, 2:].reshape(raw.shape[0], in_dim),
                           blocks[:, :, :2].reshape(raw.shape[0], -1)], axis=1)


def main(gguf_path, h5_path):
    r = GGUFReader(gguf_path)
    t = {x.name: x for x in r.tensors}
    params = h5py.File(h5_path, "r")["params"]
    H = key(r, "deepseek2.attention.head_count")
    c = key(r, "deepseek2.attention.kv_lora_rank")
    dr = key(r, "deepseek2.rope.dimension_count")
    hd = key(r, "deepseek2.attention.key_length_mla")
    dn = hd - dr
    checked = 0
    for i in range(key(r, "deepseek2.block_count")):
        kb = t[f"blk.{i}.attn_k_b.weight"]
        want = dequantize(kb.data, kb.tensor_type).reshape(H, c, dn).transpose(0, 2, 1)
        got = params[f"blocks.{i}.attn.k_b.weight"][()]
        if got.dtype != np.float32 or not np.array_equal(
                got.view(np.uint32), want.reshape(H * dn, c).astype(np.float32).view(np.uint32)):
            sys.exit(f"blocks.{i}.attn.k_b.weight is not gguf's dequantisation of {kb.name}")
        q = "attn_q_b" if f"blk.{i}.attn_q_b.weight" in t else "attn_q"
        q_rows = []
        for h in range(H):
            q_rows += rope(h * hd + dn, dr) + [h * hd + j for j in range(dn)]
        parts = [(q, "attn.q_b" if q == "attn_q_b" else "attn.q", q_rows),
                 ("attn_kv_a_mqa", "attn.kv_a", list(range(c))),
                 ("attn_kv_a_mqa", "attn.k_rope", rope(c, dr))]
        for gguf_name, ours, rows in parts:
            f = t[f"blk.{i}.{gguf_name}.weight"]
            in_dim = int(f.shape[0])
            raw = np.array(f.data).reshape(-1, np.array(f.data).size // int(np.prod(f.shape[1:])))
            want = our_rows(raw[rows], f.tensor_type, in_dim)
            got = params[f"blocks.{i}.{ours}.weight"][()]
            if not np.array_equal(got, want):
                sys.exit(f"blocks.{i}.{ours}.weight is not {f.name}'s rows in our order")
        checked += 4
    print(f"{gguf_path}: {checked} tensors as gguf reads them")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

#!/usr/bin/env python3
"""Helpers of bench/llama_perplexity.sh (standard library only: no numpy, no gguf package).

  meta FILE.gguf                     prints "add_bos bos_id" (the tokenizer keys llama-perplexity
                                     reads; add_bos false and bos -1 where absent)
  scale IN.gguf OUT.gguf REGEX K     copies IN with every F32 tensor whose name matches REGEX
                                     multiplied by K (so that a tiny model's attention is sharp
                                     enough for RoPE, windows and sinks to matter)
  windows LOGITS ADD_BOS BOS T OUT   the tokens llama-perplexity scored (its --kl-divergence-base
                                     file: "_logits_", n_ctx, n_vocab, n_chunk, then the n_chunk * n_ctx
                                     token ids), one .u32 file per chunk as llama-perplexity
                                     evaluates it (the first token replaced by BOS when ADD_BOS),
                                     padded to T + 1 tokens (moe-infer score's window for a model
                                     of context T; a causal model's first n_ctx predictions do
                                     not see the padding); writes OUT.0.u32, OUT.1.u32, ...
                                     and prints n_ctx and the chunk count
  ours N_CTX JSONL...                per chunk (one moe-infer score --per-token line each) the
                                     running perplexity over llama-perplexity's tokens: the
                                     predictions of positions n_ctx/2 .. n_ctx-2 of each chunk
"""
import array
import json
import math
import re
import shutil
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        size = struct.calcsize("<" + fmt)
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += size
        return value

    def string(self):
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("I"), self.take("Q")
            return [self.value(etype) for _ in range(n)]
        if vtype not in SCALAR:
            sys.exit(f"llama_perplexity.py: unknown GGUF value type {vtype}")
        return self.take(SCALAR[vtype])


def read_gguf(path):
    """(bytes, kv dict, [(name, dims, type, absolute offset)])"""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        sys.exit(f"llama_perplexity.py: {path} is not a GGUF file")
    r.pos = 4
    r.take("I")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = r.value(r.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        infos.append((name, dims, r.take("I"), r.take("Q")))
    align = kv.get("general.alignment", 32)
    start = (r.pos + align - 1) // align * align
    return data, kv, [(n, d, t, start + o) for n, d, t, o in infos]


def meta(path):
    _, kv, _ = read_gguf(path)
    add_bos = bool(kv.get("tokenizer.ggml.add_bos_token", False))
    print(int(add_bos), kv.get("tokenizer.ggml.bos_token_id", -1))


def scale(src, dst, pattern, k):
    data, _, infos = read_gguf(src)
    out = bytearray(data)
    scaled = []
    for name, dims, ttype, off in infos:
        if ttype != 0 or not re.search(pattern, name):
            continue
        n = math.prod(dims)
        values = array.array("f")
        values.frombytes(bytes(out[off:off + 4 * n]))
        values = array.array("f", (v * k for v in values))
        if sys.byteorder != "little":
            values.byteswap()
        out[off:off + 4 * n] = values.tobytes()
        scaled.append(name)
    if not scaled:
        sys.exit(f"llama_perplexity.py: no F32 tensor of {src} matches {pattern}")
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    shutil.move(tmp, dst)
    print(f"scaled {len(scaled)} tensors by {k}: {' '.join(scaled)}")


def windows(logits, add_bos, bos, context, out):
    with open(logits, "rb") as f:
        head = f.read(20)
        if head[:8] != b"_logits_":
            sys.exit(f"llama_perplexity.py: {logits} is not llama-perplexity's logits file")
        n_ctx, _, n_chunk = struct.unpack("<iii", head[8:])
        tokens = array.array("i")
        tokens.frombytes(f.read(4 * n_ctx * n_chunk))
    if context + 1 < n_ctx:
        sys.exit(f"llama_perplexity.py: the model's context {context} is shorter than n_ctx - 1")
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if int(add_bos):
            chunk[0] = int(bos)
        chunk += [chunk[-1]] * (context + 1 - n_ctx)
        with open(f"{out}.{c}.u32", "wb") as f:
            f.write(array.array("I", chunk).tobytes())
    print(n_ctx, n_chunk)


def ours(n_ctx, paths):
    first = n_ctx // 2
    nll, count, running = 0.0, 0, []
    for path in paths:
        with open(path) as f:
            line = json.loads(f.readline())
        lp = line["token_logprobs"]
        # token_logprobs[p] is the log-prob of token p + 1 given tokens 0..p
        nll -= sum(lp[first:n_ctx - 1])
        count += n_ctx - 1 - first
        running.append(math.exp(nll / count))
    print(" ".join(f"{p:.6f}" for p in running))


def main(argv):
    cmds = {"meta": (meta, 1), "scale": (scale, 4), "windows": (windows, 5)}
    if argv and argv[0] == "ours" and len(argv) >= 3:
        return ours(int(argv[1]), argv[2:])
    if not argv or argv[0] not in cmds or len(argv) - 1 != cmds[argv[0]][1]:
        sys.exit(__doc__)
    fn, _ = cmds[argv[0]]
    args = argv[1:]
    if fn is scale:
        args = [args[0], args[1], args[2], float(args[3])]
    if fn is windows:
        args = [args[0], args[1], args[2], int(args[3]), args[4]]
    fn(*args)


if __name__ == "__main__":
    main(sys.argv[1:])

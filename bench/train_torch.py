#!/usr/bin/env python3
"""The moe-train model and step in PyTorch (eager), for the tokens/s comparison in bench/train_torch.sh.

Builds the model moe-train builds from the same flags (the gpt flavour: learned positions,
pre-LayerNorm eps 1e-5, GELU tanh, biases, tied LM head; the mixtral flavour: RMSNorm, RoPE with
the halves rotated, grouped-query attention, SwiGLU experts, no biases, untied head), with the same
MoE layer: router logits x Wg^T, fp32 softmax over all experts, top-k (renormalised for mixtral),
dropless (every assignment kept: --capacity-factor 0, moe-train's default), one gather / expert
MLP / weighted index_add per expert, and the same losses (cross-entropy + aux_coef * sum of
E * sum_e f_e P_e + z_coef * sum of mean logsumexp^2). The step is moe-train's: forward, backward,
global-norm clip 1.0, AdamW (betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices), on
byte-level windows of --data. Prints one JSON line: tokens_per_s (the median over the timed
steps), the steps timed and the thread count.

torch is not a dependency of the project; install it only to measure (Debian: python3-torch).
"""

import argparse
import json
import math
import statistics
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="text file (every byte is a token)")
    ap.add_argument("--arch", choices=["gpt", "mixtral"], default="gpt")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--moe-every", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--aux-loss-coef", type=float, default=0.01)
    ap.add_argument("--z-loss-coef", type=float, default=0.001)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20, help="steps timed after --warmup")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (timings synchronise the device)")
    ap.add_argument("--seed", type=int, default=1234)
    return ap.parse_args()


def build(args, torch):
    nn = torch.nn
    F = torch.nn.functional
    gpt = args.arch == "gpt"
    D, H = args.d_model, args.heads
    KV = args.kv_heads or H
    hd = D // H
    V = 256

    def norm():
        return nn.LayerNorm(D, eps=1e-5) if gpt else RMSNorm(D)

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    def rope(x, T):  # x [B, h, T, hd]; HF convention: rotate the two halves
        half = hd // 2
        inv = 1.0 / (10000.0 ** (torch.arange(0, half, dtype=torch.float32, device=x.device) / half))
        ang = torch.arange(T, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
        cos, sin = torch.cos(ang).repeat(1, 2), torch.sin(ang).repeat(1, 2)
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(D, H * hd, bias=gpt)
            self.k = nn.Linear(D, KV * hd, bias=gpt)
            self.v = nn.Linear(D, KV * hd, bias=gpt)
            self.o = nn.Linear(H * hd, D, bias=gpt)

        def forward(self, x):
            B, T, _ = x.shape
            q = self.q(x).view(B, T, H, hd).transpose(1, 2)
            k = self.k(x).view(B, T, KV, hd).transpose(1, 2)
            v = self.v(x).view(B, T, KV, hd).transpose(1, 2)
            if not gpt:
                q, k = rope(q, T), rope(k, T)
            if KV != H:
                k = k.repeat_interleave(H // KV, dim=1)
                v = v.repeat_interleave(H // KV, dim=1)
            # Eager attention materialising the [B, H, T, T] probabilities, as moe does.
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
            return self.o((p @ v).transpose(1, 2).reshape(B, T, H * hd))

    def act(h):
        return F.gelu(h, approximate="tanh")

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(D, args.d_ff, bias=gpt)
            self.w2 = nn.Linear(args.d_ff, D, bias=gpt)
            self.w3 = None if gpt else nn.Linear(D, args.d_ff, bias=False)

        def forward(self, x):
            h = act(self.w1(x)) if gpt else F.silu(self.w1(x)) * self.w3(x)
            return self.w2(h)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(D, args.experts, bias=False)
            self.experts = nn.ModuleList(MLP() for _ in range(args.experts))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, D)
            logits = self.router(x).float()
            probs = torch.softmax(logits, dim=-1)
            w, idx = torch.topk(probs, args.top_k, dim=-1)
            if not gpt:
                w = w / w.sum(-1, keepdim=True)
            E = args.experts
            load = torch.bincount(idx.reshape(-1), minlength=E).float()
            f = load / idx.numel()
            aux = E * (f * probs.mean(0)).sum()
            z = torch.logsumexp(logits, dim=-1).pow(2).mean()
            y = torch.zeros_like(x)
            for e in range(E):  # dropless: every assignment of expert e
                tok, slot = torch.where(idx == e)
                if tok.numel() == 0:
                    continue
                out = self.experts[e](x[tok]) * w[tok, slot, None]
                y.index_add_(0, tok, out)
            return y.view(shape), aux, z

    class Block(nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.norm1, self.norm2 = norm(), norm()
            self.attn = Attention()
            self.ffn = MoE() if moe else MLP()

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            out = self.ffn(self.norm2(x))
            if isinstance(out, tuple):
                return x + out[0], out[1], out[2]
            return x + out, None, None

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(V, D)
            self.positions = nn.Embedding(args.seq, D) if gpt else None
            K = args.moe_every
            self.blocks = nn.ModuleList(Block(K > 0 and i % K == K - 1) for i in range(args.layers))
            self.norm = norm()
            self.head = None if gpt else nn.Linear(D, V, bias=False)

        def forward(self, ids, targets):
            B, T = ids.shape
            x = self.tokens(ids)
            if self.positions is not None:
                x = x + self.positions(torch.arange(T, device=ids.device))
            aux = z = 0.0
            for b in self.blocks:
                x, a, zz = b(x)
                if a is not None:
                    aux, z = aux + a, z + zz
            h = self.norm(x)
            logits = h @ self.tokens.weight.t() if self.head is None else self.head(h)
            ce = F.cross_entropy(logits.view(-1, V), targets.reshape(-1))
            return ce + args.aux_loss_coef * aux + args.z_loss_coef * z

    model = Model()
    # moe-train's initialisation (so the losses are comparable): N(0, 0.02) matrices and tables,
    # positions N(0, 0.01), projections into the residual stream N(0, 0.02 / sqrt(2 L)), zero
    # biases, unit norm weights.
    out_std = 0.02 / math.sqrt(2 * args.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                if "norm" not in name:
                    p.zero_()
                continue
            std = 0.01 if "positions" in name else 0.02
            if name.endswith(("attn.o.weight", "w2.weight")):
                std = out_std
            p.normal_(0.0, std)
    return model


def main():
    args = parse_args()
    import torch  # late: --help works without torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with open(args.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    if data.numel() < args.seq + 2:
        raise SystemExit(f"train_torch.py: {args.data} holds fewer than {args.seq + 2} bytes")
    model = build(args, torch).to(args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    step_fn = torch.compile(model) if args.compile else model
    gen = torch.Generator().manual_seed(args.seed)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        at = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen)
        win = torch.stack([data[i:i + args.seq + 1] for i in at.tolist()]).to(args.device)
        loss = step_fn(win[:, :-1], win[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    tokens = args.batch * args.seq
    print(json.dumps({"tokens_per_s": tokens / statistics.median(times), "steps": len(times),
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()

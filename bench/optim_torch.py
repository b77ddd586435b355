#!/usr/bin/env python3
"""torch's CPU AdamW on the same problem as moe-optim-bench, for docs/PERFORMANCE.md.

Times torch.optim.AdamW(fused=True) and AdamW(foreach=True) stepping one fp32 parameter of N
elements (the same hyper-parameters as moe-optim-bench: lr 1e-4, betas 0.9/0.95, eps 1e-8, weight
decay 0.1), and a triad a = b + s c with torch ops as the ceiling, in the same process. Rates are
params/s and GB/s at 28 B/param (read grad, m, v, param; write m, v, param), as moe-optim-bench
counts them. Run both with the same thread count, one after the other, on an idle machine.

torch is not a dependency of the project; install it only to measure:
    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    (or plain `pip install torch` from PyPI)
    /tmp/torchvenv/bin/python bench/optim_torch.py --threads 2
"""

import argparse
import json
import os
import platform
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def best_time(fn, seconds, min_runs=2):
    """Best (smallest) seconds per call over >= min_runs calls and >= seconds in all."""
    best = None
    runs = 0
    start = time.perf_counter()
    while runs < min_runs or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
        runs += 1
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds per row over all rounds")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds; best time kept")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.params <= 0 or args.rounds <= 0 or args.min_time < 0:
        ap.error("--params and --rounds must be positive, --min-time non-negative")

    import torch  # imported late: --help works without torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    n = args.params
    gen = torch.Generator().manual_seed(0)
    rows = {}

    def make(kind):
        p = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.02)
        p.grad = torch.randn(n, generator=gen) * 2e-3
        flags = {"fused": True} if kind == "fused" else {"foreach": True}
        opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                **flags)
        opt.step()  # creates the state (m, v): not part of a steady-state step
        return opt

    optimizers = {"fused": make("fused"), "foreach": make("foreach")}
    a, b, c = (torch.randn(n, generator=gen) for _ in range(3))
    measures = {
        "triad": (12.0, lambda: torch.add(b, c, alpha=1.0001, out=a)),
        "fused": (28.0, optimizers["fused"].step),
        "foreach": (28.0, optimizers["foreach"].step),
    }
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, (_, fn) in measures.items():
                s = best_time(fn, args.min_time / args.rounds)
                rows[name] = min(rows.get(name, s), s)

    triad_gbs = 12.0 * n / rows["triad"] * 1e-9
    out = {
        "benchmark": "optim-adamw-torch",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "params": n,
        "triad_gbs": triad_gbs,
        "rows": [],
    }
    for name in ("fused", "foreach"):
        s = rows[name]
        gbs = 28.0 * n / s * 1e-9
        out["rows"].append({"impl": "AdamW(%s=True)" % name, "seconds": s,
                            "params_per_s": n / s, "gbs": gbs, "triad_ratio": gbs / triad_gbs})
    if args.json:
        print(json.dumps(out, indent=2))
        return
    wait = os.environ.get("OMP_WAIT_POLICY", "(unset)")
    print("# optim_torch.py: torch %s AdamW step over %d fp32 parameters" % (out["torch"], n))
    print("# %s, %s, %d threads, capability %s, OMP_WAIT_POLICY=%s"
          % (out["date"], out["cpu"], out["threads"], out["cpu_capability"], wait))
    print("# triad a = b + s c (torch.add out=): %.1f GB/s at 12 B/element (STREAM's count)"
          % triad_gbs)
    print("# GB/s at 28 B/param; time: best over %d interleaved rounds" % args.rounds)
    print("# %22s %9s %10s %8s %8s" % ("impl", "time", "rate", "rate", "triad"))
    print("# %22s %9s %10s %8s %8s" % ("", "(ms)", "(param/s)", "(GB/s)", "(%)"))
    for r in out["rows"]:
        print("  %22s %9.2f %10.3e %8.1f %8.1f" % (r["impl"], r["seconds"] * 1e3,
                                                  r["params_per_s"], r["gbs"],
                                                  100.0 * r["triad_ratio"]))


if __name__ == "__main__":
    main()

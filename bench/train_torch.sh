#!/usr/bin/env bash
# Training tokens/s of moe-train against the same model and step in PyTorch eager
# (bench/train_torch.py), same flags, same threads, same machine, run in turn (moe, torch, moe,
# torch, ...) so a drift of the machine's speed hits both. Prints a table: per round each one's
# median tokens/s over the timed steps and their ratio (torch's rate is the faster of its two
# OpenMP wait policies, below), then the median ratio, the GEMM bounds
# (the step's GEMM operations at this machine's best sgemm rate and FMA peak, from moe-bench in
# the same run: the most tokens/s any kernel could reach), and moe-train's step breakdown (-v)
# of its last round.
#
#   bench/train_torch.sh [--bin DIR] [--data FILE] [--threads N] [--rounds R] [--steps S]
#                        [--warmup W] [--python PY] [-- MODEL FLAGS...]
#
# MODEL FLAGS are moe-train's model and batch flags that bench/train_torch.py also takes
# (--arch --layers --d-model --heads --kv-heads --d-ff --seq --experts --moe-every --top-k
# --batch --aux-loss-coef --z-loss-coef); with none, the demo model (README). The d 512 row of
# docs/PERFORMANCE.md:  bench/train_torch.sh -- --d-model 512 --d-ff 2048 --moe-every 1
# Optional: the torch column needs python3 with torch (Debian: python3-torch), which is not a
# project dependency (without it the script prints moe-train's rates and breakdown alone); it
# never runs in scripts/test.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin data="" threads=2 rounds=3 steps=20 warmup=3 python=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "train_torch.sh: unknown argument $1 (model flags go after --)" >&2; exit 2 ;;
  esac
done
model=("$@")
# Without torch the moe-train column and its breakdown still come out (the torch column reads -).
have_torch=1
if ! "$python" -c 'import torch' 2>/dev/null; then
  have_torch=0
  echo "train_torch.sh: $python has no torch (Debian: apt-get install python3-torch): moe-train only" >&2
fi
[ -x "$bin/moe-train" ] || { echo "train_torch.sh: no $bin/moe-train (build first)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$data" ]; then
  data=$work/corpus.txt
  scripts/corpus "$data" >/dev/null
fi

# The median of the per-step tokens/s of moe-train's metrics after the warm-up steps.
moe_rate() {
  "$python" - "$1" "$warmup" <<'EOF'
import json, statistics, sys
rates = [j["tokens_per_s"] for j in map(json.loads, open(sys.argv[1]))
         if "tokens_per_s" in j and j["step"] > int(sys.argv[2])]
print(statistics.median(rates))
EOF
}

torch_version=$([ $have_torch = 1 ] && "$python" -c 'import torch; print(torch.__version__)' || echo "not installed")
echo "# training tokens/s: moe-train vs PyTorch eager ($torch_version), same model and step"
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), threads $threads, steps $steps (+$warmup warm-up), model flags: ${model[*]:-(demo defaults)}"
# Which GEMM kernels torch gets decides much of the ratio: Debian's torch calls OpenBLAS, whose
# kernel family follows the CPU unless the environment sets OPENBLAS_CORETYPE (which can pin AVX2
# kernels on an AVX-512 CPU). Read in a process that has loaded torch, so it is torch's own.
if [ $have_torch = 1 ]; then
  torch_blas=$("$python" - 2>/dev/null <<'EOF' || echo "unknown"
import ctypes, torch
if "libopenblas" in open("/proc/self/maps").read():
    lib = ctypes.CDLL("libopenblas.so.0")
    lib.openblas_get_corename.restype = ctypes.c_char_p
    print("OpenBLAS, " + lib.openblas_get_corename().decode() + " kernels")
else:
    info = [w for w in torch.__config__.show().split() if w.startswith("BLAS_INFO=")]
    print("not OpenBLAS (" + (info[0].rstrip(",") if info else "BLAS unknown") + ")")
EOF
)
  echo "# torch's GEMMs: $torch_blas (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
fi
# torch runs twice a round: with the environment as given and with OMP_WAIT_POLICY=passive, and
# the ratio takes the faster. Debian's torch has two thread pools, ATen's OpenMP threads and
# OpenBLAS's own pthreads; when the OpenMP threads spin while waiting (libgomp's default), the
# two pools fight over the cores. On a 2-vCPU AMD EPYC Zen 4 that made torch 2.5-3x slower
# (3.5k against 10k tok/s, demo model) than with passive waiting, which would flatter moe.
torch_env() {
  local policy=$1; shift
  if [ "$policy" = given ]; then "$@"; else OMP_WAIT_POLICY=$policy "$@"; fi
}
torch_rate() {
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads torch_env "$1" "$python" \
    bench/train_torch.py --data "$data" --threads "$threads" --steps "$steps" \
    --warmup "$warmup" "${model[@]}" |
    "$python" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])'
}
printf '%-6s %14s %14s %14s %8s\n' round moe torch torch ratio
printf '%-6s %14s %14s %14s %8s\n' "" tok/s "tok/s (env)" "tok/s passive" moe/torch
ratios=() torch_rates=()
for r in $(seq 1 "$rounds"); do
  rm -rf "$work/run" "$work/metrics.jsonl"
  # Plain routers, as bench/train_torch.py builds them (moe-train centres its routers by default).
  "$bin/moe-train" --data "$data" --out "$work/run" --steps $((steps + warmup)) --warmup 1 \
    --eval-every 0 --eval-batches 1 --log-every 1 --metrics "$work/metrics.jsonl" \
    --threads "$threads" -v --router-center-rate 0 "${model[@]}" 2>"$work/moe.log"
  moe=$(moe_rate "$work/metrics.jsonl")
  if [ $have_torch = 0 ]; then
    printf '%-6s %14.0f %14s %14s %8s\n' "$r" "$moe" - - -
    continue
  fi
  torch_given=$(torch_rate given)
  torch_passive=$(torch_rate passive)
  torch=$("$python" -c "print(max($torch_given, $torch_passive))")
  ratio=$("$python" -c "print($moe / $torch)")
  ratios+=("$ratio")
  torch_rates+=("$torch")
  printf '%-6s %14.0f %14.0f %14.0f %8.2f\n' "$r" "$moe" "$torch_given" "$torch_passive" "$ratio"
done
torch_median=0
if [ $have_torch = 1 ]; then
  joined=$(IFS=,; echo "${ratios[*]}")
  echo "# median ratio: $("$python" -c "import statistics; print(round(statistics.median([$joined]), 2))")"
  joined=$(IFS=,; echo "${torch_rates[*]}")
  torch_median=$("$python" -c "import statistics; print(statistics.median([$joined]))")
fi
# The GEMM bounds, in the same run: the step's GEMM operations (moe-train's gemm_gflop, counted
# from the shapes) over the best sgemm rate this machine reaches (moe-bench at the d 512 expert
# shapes: the fastest of its dense and per-product rows), and over its FMA peak (moe-bench's
# register-only multiply-adds: no GEMM can go faster), are the least time a step can take even
# if everything else took none; tokens per step over them are the most tokens/s any kernel of
# ours could reach. moe-train's own GEMM rate in the step is beside them. Under --device cuda
# both are the host CPU's, not the GPU's, and the -v parts are host times (a part that waits on
# the GPU holds the work queued before it), so the bound is left out there.
on_gpu=0
prev=""
for f in "${model[@]}"; do
  case "$prev=$f" in --device=cuda*|*=--device=cuda*) on_gpu=1 ;; esac
  prev=$f
done
if [ $on_gpu = 1 ]; then
  echo "# GEMM bound: not printed under --device cuda (moe-bench's rates are the host CPU's);"
  echo "# the breakdown below is host time: a part that waits on the GPU holds the work queued before it"
  echo "# (moe-train -v --breakdown-sync gives each part its GPU time, at the cost of the step's overlap)"
elif [ -x "$bin/moe-bench" ]; then
  "$bin/moe-bench" --threads "$threads" --shape 512,8,2,2048 --json >"$work/bench.json"
  "$python" - "$work/metrics.jsonl" "$warmup" "$work/bench.json" "$torch_median" <<'EOF'
import json, statistics, sys
lines = [j for j in map(json.loads, open(sys.argv[1]))
         if "gemm_gflop" in j and j["step"] > int(sys.argv[2])]
bench = json.load(open(sys.argv[3]))
rates = [r[k] for r in bench["ceiling"] for k in ("gflops", "blas_gflops", "tiled_gflops")]
rates += [r[k] for r in bench["gemm_kernels"] for k in ("blas_gflops", "host_gflops")]
gflop = statistics.median(j["gemm_gflop"] for j in lines)
gemm_s = statistics.median(j["step_breakdown"]["gemm"] for j in lines)
tokens = lines[-1]["tokens_seen"] / lines[-1]["step"]
rate = statistics.median(j["tokens_per_s"] for j in lines)
torch = float(sys.argv[4])
print(f"# GEMM bound: {gflop:.1f} GFLOP of GEMMs per step ({tokens:.0f} tokens), which "
      f"moe-train ran at {gflop / gemm_s:.0f} GFLOP/s (last round)")
for name, ceiling in (("best sgemm rate", max(rates)), ("FMA peak", bench["fma_peak_gflops"])):
    if ceiling <= 0:
        continue
    bound = tokens / (gflop / ceiling)
    line = (f"#   at the {name} ({ceiling:.0f} GFLOP/s) the GEMMs alone take "
            f"{gflop / ceiling:.3f} s a step: at most {bound:.0f} tok/s (moe-train reached "
            f"{rate / bound:.2f} of it)")
    if torch > 0:
        line += f", {bound / torch:.2f}x torch's median ({torch:.0f} tok/s)"
    print(line)
EOF
fi
# Where moe-train's timed steps went (its -v breakdown, --metrics step_breakdown), last round:
# each part's median over the steps (a step the OS preempted adds its stall to one part; the
# median leaves such outliers out, so the parts need not add up to the median step exactly).
"$python" - "$work/metrics.jsonl" "$warmup" <<'EOF'
import json, statistics, sys
lines = [j for j in map(json.loads, open(sys.argv[1]))
         if "step_breakdown" in j and j["step"] > int(sys.argv[2])]
parts = {k: statistics.median(j["step_breakdown"][k] for j in lines)
         for k in lines[0]["step_breakdown"]}
total = sum(parts.values())
print(f"# moe-train step breakdown (last round, median of {len(lines)} steps per part, "
      f"sum {total:.4f} s):")
print("# " + " | ".join(f"{k} {v:.4f} s {100 * v / total:.0f}%"
                        for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                        if v >= 0.005 * total))
EOF

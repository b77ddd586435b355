#!/usr/bin/env bash
# Lina's popularity-aware placement on a skewed workload: trains an MoE without the aux loss (so
# routing is skewed, as it is in many trained MoEs), records a trace on one text and builds the
# path table, then scores another text with `moe-infer score --ep R` with and without
# `--popularity` on 2 and 4 ranks. Prints each run's stderr report: per-layer mean max/mean rank
# load (static layout, phase-1 plan, plan used; 1.00 is the ceiling, perfect balance), re-plans,
# and p50/p95 batch latency; and checks the scores are the same.
# Usage: bench/placement.sh [BUILD_DIR] (default build); STEPS=100 SEQS=256 override the sizes.
set -euo pipefail
bin=${1:-build}/bin
work=${WORK:-run/bench-placement}
steps=${STEPS:-100} seqs=${SEQS:-256}
mkdir -p "$work"
"$bin/moe-train" --data /usr/share/games/fortunes/linux --layers 4 --d-model 128 --heads 4 \
  --d-ff 512 --seq 64 --experts 8 --moe-every 1 --batch 8 --steps "$steps" --aux-loss-coef 0 \
  --threads 2 --out "$work/run" -q
"$bin/moe-profile" record --model "$work/run/last.h5" --data /usr/share/common-licenses/GPL-2 \
  -o "$work/trace.h5" -q
"$bin/moe-profile" summary "$work/trace.h5" | cut -f1-7
"$bin/moe-profile" paths "$work/trace.h5" --path-length 2 -o "$work/paths.json" -q
"$bin/moe-profile" accuracy "$work/paths.json" "$work/trace.h5"
args="score --model $work/run/last.h5 --data /usr/share/common-licenses/GPL-3 --max-sequences $seqs --batch 4 --threads 1"
for n in 2 4; do
  echo "== $n ranks, static layout (E/R experts per rank)"
  mpiexec -n "$n" "$bin/moe-infer" $args --ep "$n" -o "$work/static$n.jsonl"
  echo "== $n ranks, --popularity"
  mpiexec -n "$n" "$bin/moe-infer" $args --ep "$n" --popularity "$work/paths.json" \
    -o "$work/placed$n.jsonl"
  if cmp -s "$work/static$n.jsonl" "$work/placed$n.jsonl"; then
    echo "scores: identical"
  else
    echo "scores: differ in bits (BLAS row rounding); compare nll_mean"
  fi
done

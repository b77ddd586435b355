#!/usr/bin/env bash
# moe-infer --expert-budget: the ring of whole layers against the cache of single experts
# (--expert-cache lru|lfu, with and without --pin-from a trace), at 25% and 50% of the experts.
# Trains a small bf16 mixtral without the aux loss (skewed routing, as trained MoEs have), records
# a trace on one text with moe-profile, then generates from 4 prompts one at a time (a token a
# pass: each layer routes k of its experts, and what stays cached across tokens matters) and
# scores another text a 64-token window a pass (every expert routed in every layer). Each
# configuration runs ROUNDS times in turn with the ring (A B A B ...), so that the ratios are
# pairs taken close in time on a busy machine. Prints each run's summary (tokens/s) and the
# store's own line (bytes read; the cache's hit rate beside Belady's on the same accesses and the
# next-layer estimate's hit rate), and checks the outputs are the resident model's bytes. Then
# generation at 25% under each --prefetch mode (none, the trace's estimate, the next layer's
# router before or after a layer's MoE block, with a margin), in turn. Last, a q4_k model of a few
# hundred MB generating at 25%: resident, cache and ring (tokens/s, peak RSS). Usage:
# bench/expert_cache.sh [BUILD_DIR] (default build); STEPS=30 SEQS=32 ROUNDS=2 Q4=1 PREFETCH=1
# override (Q4=0: without the q4_k part; Q4=only: that part alone; PREFETCH=only: the bf16
# model's prefetch modes alone).
set -euo pipefail
bin=${1:-build}/bin
work=${WORK:-run/bench-expert-cache}
steps=${STEPS:-30} seqs=${SEQS:-32} rounds=${ROUNDS:-2}
mkdir -p "$work"
printf 'The kernel\nFree software\nA program\nLinux is\n' > "$work/prompts.txt"
if [ "${Q4:-1}" != only ]; then
if [ ! -f "$work/model.h5" ]; then
  "$bin/moe-train" --arch mixtral --data /usr/share/games/fortunes/linux --layers 4 \
    --d-model 256 --heads 4 --kv-heads 2 --d-ff 512 --seq 64 --experts 8 --moe-every 1 \
    --batch 8 --steps "$steps" --aux-loss-coef 0 --threads 2 --out "$work/run" -q
  "$bin/moe-convert" dtype "$work/run/last.h5" --to bf16 -o "$work/model.h5" -q
fi
"$bin/moe-profile" record --model "$work/model.h5" --data /usr/share/common-licenses/GPL-2 \
  -o "$work/trace.h5" -q --force
score="score --model $work/model.h5 --data /usr/share/common-licenses/GPL-3 --max-sequences $seqs --batch 1 --threads 1"
generate="generate --model $work/model.h5 --prompts $work/prompts.txt --max-new 48 --batch 1 --threads 1"
"$bin/moe-infer" $score -q -o "$work/resident-score.jsonl" --force
"$bin/moe-infer" $generate -q -o "$work/resident-generate.jsonl" --force
run() {  # score|generate, name, flags
  local args=$score
  [ "$1" = generate ] && args=$generate
  "$bin/moe-infer" $args $3 -o "$work/$2-$1.jsonl" --force 2>&1 |
    grep -E "moe-infer (score|generate):|expert ring: compute|expert cache: [0-9]|estimate" |
    sed "s/^/$1 $2: /"
  cmp -s "$work/resident-$1.jsonl" "$work/$2-$1.jsonl" ||
    echo "$1 $2: OUTPUT DIFFERS from the resident model's"
}
[ "${PREFETCH:-1}" = only ] || for what in generate score; do
  for budget in 25 50; do
    for round in $(seq "$rounds"); do
      echo "== $what, budget $budget%, round $round"
      run "$what" "ring$budget" "--expert-budget $budget%"
      run "$what" "lru$budget" "--expert-budget $budget% --expert-cache lru"
      run "$what" "ring$budget" "--expert-budget $budget%"
      run "$what" "lfu$budget" "--expert-budget $budget% --expert-cache lfu"
      run "$what" "ring$budget" "--expert-budget $budget%"
      run "$what" "pin$budget" "--expert-budget $budget% --expert-cache lru --pin-from $work/trace.h5"
    done
  done
done
# --prefetch modes at 25% (generate, lru + pin from the trace alike), in turn (A B C D E A B ...):
# off (the trace's estimate only counted), trace (its estimate read ahead), router (the next
# layer's router on the hidden state before a layer's MoE block: reads overlap that layer's
# experts), router-output (on the block's output: closer, but the reads overlap only the next
# block's attention), router with a margin of one expert a token. The estimate line says how many
# of the next layer's routed experts each predicted, and the prefetches issued, used and wasted.
if [ "${PREFETCH:-1}" != 0 ]; then
  for round in $(seq "$rounds"); do
    echo "== generate, prefetch modes, budget 25%, round $round"
    for mode in off trace router router-output router+1; do
      flags="--expert-budget 25% --expert-cache lru --pin-from $work/trace.h5"
      case $mode in
        off) ;;
        router+1) flags="$flags --prefetch router --prefetch-margin 1" ;;
        *) flags="$flags --prefetch $mode" ;;
      esac
      run generate "prefetch-$mode" "$flags"
    done
  done
fi
fi
# A q4_k model of a few hundred MB (Q4=0 skips it): generation at 25% of the experts' stored bytes,
# resident against the cache and the ring, in turn (A B C A B C ...), each run's tokens/s and peak
# RSS (GNU time's maximum resident set), and the outputs checked against the resident model's.
[ "${Q4:-1}" = 0 ] && exit 0
q4=$work/q4k.h5
if [ ! -f "$q4" ]; then
  "$bin/moe-train" --arch mixtral --data /usr/share/games/fortunes/linux --layers 4 \
    --d-model 1024 --heads 8 --kv-heads 4 --d-ff 1024 --seq 32 --experts 24 --moe-every 1 \
    --batch 1 --steps 1 --threads 2 --out "$work/run-q4" -q
  "$bin/moe-convert" quantize "$work/run-q4/last.h5" --type q4_k -o "$q4" -q
  rm -rf "$work/run-q4"
fi
q4gen="generate --model $q4 --prompts $work/prompts.txt --max-new 32 --batch 1 --threads 1"
q4run() {  # name, flags
  /usr/bin/time -f "peak RSS %M KiB, %e s" \
    "$bin/moe-infer" $q4gen $2 -o "$work/q4-$1.jsonl" --force 2>&1 |
    grep -E "moe-infer generate:|expert ring: compute|expert cache: [0-9]|peak RSS" |
    sed "s/^/generate q4_k $1: /"
  [ "$1" = resident ] || cmp -s "$work/q4-resident.jsonl" "$work/q4-$1.jsonl" ||
    echo "generate q4_k $1: OUTPUT DIFFERS from the resident model's"
}
for round in $(seq "$rounds"); do
  echo "== generate, q4_k ($(du -m "$q4" | cut -f1) MB), budget 25%, round $round"
  q4run resident ""
  q4run lru25 "--expert-budget 25% --expert-cache lru"
  q4run ring25 "--expert-budget 25%"
done

#!/bin/sh
# What each weight format costs in perplexity, as llama.cpp's quantisation tables give it: a
# Mixtral-shaped model trained on a real corpus (the demo's corpus, the English text of Debian's fortunes; widths of
# 256 so that every matrix is whole 256-value blocks), quantised by moe-convert quantize in each
# type, each scored by moe-infer score on a held-out text (the GPL-3 in /usr/share/common-licenses)
# against the f32 model in the same run. Prints a markdown table: bits a weight of the quantised
# matrices, file size, perplexity, and its change against f32.
# Usage: bench/quant_ppl.sh [BIN_DIR] (default build/bin); STEPS (default 400), WORK
# (default run/quant-ppl, deleted at the end), TYPES (default "q8_0 q6_k q4_k_m q4_k mxfp4").
set -u
bin=${1:-build/bin}
steps=${STEPS:-400}
work=${WORK:-run/quant-ppl}
types=${TYPES:-q8_0 q6_k q4_k_m q4_k mxfp4}
here=$(dirname "$0")
heldout=/usr/share/common-licenses/GPL-3
fail() { echo "FAIL: $*"; exit 1; }
for tool in moe-train moe-convert moe-infer; do
  [ -x "$bin/$tool" ] || fail "no $bin/$tool (build first)"
done
[ -f "$heldout" ] || fail "needs $heldout"
mkdir -p "$work" || exit 1
trap 'rm -rf "$work"' EXIT
corpus=$work/corpus.txt
"$here/../scripts/corpus" "$corpus" > /dev/null || fail "scripts/corpus (the demo's corpus)"
cpu=$(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1)
echo "# quant_ppl: mixtral, 4 layers, d_model 256, d_ff 512, 8 experts top-2, $steps steps on fortunes"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}; scored on $heldout"
"$bin/moe-train" --data "$corpus" --out "$work/run" --arch mixtral --layers 4 --moe-every 1 \
  --d-model 256 --heads 4 --kv-heads 2 --d-ff 512 --experts 8 --top-k 2 --seq 128 --batch 8 \
  --steps "$steps" --eval-every 0 --checkpoint-every 0 -q 2> "$work/train.err" ||
  fail "moe-train: $(tail -3 "$work/train.err")"
"$bin/moe-convert" freeze "$work/run/last.h5" -o "$work/f32.h5" -q || fail "freeze"
score() {  # score FILE: prints "ppl nll_mean"
  "$bin/moe-infer" score -q --model "$1" --data "$heldout" -o "$work/scores.jsonl" --force --summary - |
    sed -n 's/.*"nll_mean":\([0-9.e+-]*\).*"ppl":\([0-9.e+-]*\).*/\2 \1/p'
}
base=$(score "$work/f32.h5")
[ -n "$base" ] || fail "scoring the f32 model"
bytes=$(stat -c %s "$work/f32.h5")
echo
echo "| type | bits / weight | file MB | perplexity | vs f32 |"
echo "|---|---:|---:|---:|---:|"
echo "$base $bytes" | awk '{printf "| f32 | 32 | %.1f | %.4f | - |\n", $3 / 1e6, $1}'
for type in $types; do
  "$bin/moe-convert" quantize "$work/f32.h5" --type "$type" -o "$work/$type.h5" 2> "$work/q.err" ||
    fail "quantize $type: $(tail -2 "$work/q.err")"
  got=$(score "$work/$type.h5")
  [ -n "$got" ] || fail "scoring $type"
  bits=$(case $type in q8_0) echo 8.5 ;; q6_k) echo 6.5625 ;; q4_k) echo 4.5 ;;
    mxfp4) echo "4.25 experts, 8.5 others" ;; q4_k_m) echo "4.5-6.56" ;; esac)
  echo "$got $base $(stat -c %s "$work/$type.h5")" | awk -v t="$type" -v b="$bits" \
    '{printf "| %s | %s | %.1f | %.4f | %+.2f%% |\n", t, b, $5 / 1e6, $1, 100 * ($1 / $3 - 1)}'
done

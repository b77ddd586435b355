#!/bin/sh
# Conversions at a real model's size, in bounded memory (issue 43): a Hugging Face directory of
# random bf16 weights at a real MoE configuration (bench/make_hf_random.py: OLMoE-1B-7B by
# default, 13.8 GB), then moe-convert import-hf, inspect --verify, partition into 2 rank files,
# merge of them, export-hf in 5 GB shards, quantize --type q4_k_m and export-gguf --type q4_k_m of
# it, each timed with GNU time: its peak RSS against the size of what it reads; then moe-infer
# score of one window at the model's context and moe-profile record of two windows in one pass.
# Prints a markdown table; every file is deleted at the end (each output once it is measured).
# Usage: bench/real_size.sh [BIN_DIR] (default build/bin); FAMILY=olmoe|qwen3_moe, LAYERS (default
# the model's own: 16 for olmoe, 48 for qwen3_moe: 61 GB, which needs that much free disk twice),
# QUANT=0 (skip the 4-bit steps), RESHARD=0 (skip partition, merge and export-hf), INFER=0 (skip
# score and record), WORK=run/real-size, PYTHON (one with numpy; default /opt/moe-python/bin/python).
set -u
bin=${1:-build/bin}
family=${FAMILY:-olmoe}
layers=${LAYERS:-$([ "$family" = qwen3_moe ] && echo 48 || echo 16)}
work=${WORK:-run/real-size}
python=${PYTHON:-/opt/moe-python/bin/python}
here=$(dirname "$0")
fail() { echo "FAIL: $*"; exit 1; }
[ -x /usr/bin/time ] || fail "GNU time (/usr/bin/time) is needed: apt-get install time"
for tool in moe-convert moe-infer moe-profile; do [ -x "$bin/$tool" ] || fail "no $bin/$tool (build first)"; done
mkdir -p "$work" || exit 1
trap 'rm -rf "$work"' EXIT
cpu=$(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1)
echo "# real-size conversions: $family, $layers layers, random bf16 weights"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(getconf _NPROCESSORS_ONLN) cores," \
  "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) RAM"
"$python" "$here/make_hf_random.py" "$family" "$layers" "$work/hf" > "$work/make.out" ||
  fail "make_hf_random.py failed"
# A small real tokenizer (704 tokens of a Qwen2-style byte-level BPE), so that the GGUF export has
# a vocabulary to describe (the model's other ids are padding to llama.cpp).
cp "$here/../tests/data/tokenizers/bpe-qwen/tokenizer.json" "$work/hf/" || fail "no test tokenizer"
echo "# $(cat "$work/make.out")"
echo
echo "| step | reads GB | writes GB | peak RSS GB | RSS / read | wall s |"
echo "|---|---:|---:|---:|---:|---:|"
size_gb() { du -sb "$1" 2>/dev/null | awk '{printf "%.2f", $1 / 1e9}'; }
# step NAME INPUT OUTPUT ARGS...: runs moe-convert ARGS under GNU time and prints the row
# (TOOL=moe-infer or moe-profile runs that tool instead).
step() {
  name=$1 input=$2 output=$3
  shift 3
  /usr/bin/time -f '%M %e' -o "$work/time" "$bin/${TOOL:-moe-convert}" "$@" -q > "$work/out" \
    2> "$work/err" || fail "$name: $(tail -3 "$work/err")"
  read -r rss_kib wall < "$work/time"
  in_gb=$(size_gb "$input")
  out_gb=$([ -n "$output" ] && size_gb "$output" || echo -)
  echo "$name $in_gb $out_gb $rss_kib $wall" | awk '{printf "| %s | %s | %s | %.2f | %.3f | %s |\n",
    $1, $2, $3, $4 * 1024 / 1e9, $4 * 1024 / 1e9 / $2, $5}'
}
step import-hf "$work/hf" "$work/model.h5" import-hf "$work/hf" -o "$work/model.h5"
rm -rf "$work/hf"
step inspect--verify "$work/model.h5" "" inspect --verify "$work/model.h5"
if [ "${RESHARD:-1}" != 0 ]; then  # re-sharding and the HF export, each read as it is written
  step partition-2 "$work/model.h5" "$work/parts" partition "$work/model.h5" --ranks 2 \
    -o "$work/parts"
  step merge "$work/parts" "$work/merged.h5" merge "$work/parts" -o "$work/merged.h5"
  rm -rf "$work/parts" "$work/merged.h5"
  step export-hf "$work/model.h5" "$work/hf-out" export-hf "$work/model.h5" --max-shard-size 5000 \
    -o "$work/hf-out"
  rm -rf "$work/hf-out"
fi
if [ "${QUANT:-1}" != 0 ]; then  # QUANT=0 leaves out the two 4-bit steps (24 min at 16 layers)
  step quantize-q4_k_m "$work/model.h5" "$work/q4.h5" quantize "$work/model.h5" --type q4_k_m -o "$work/q4.h5"
  rm -f "$work/q4.h5"
  step export-gguf-q4_k_m "$work/model.h5" "$work/q4.gguf" export-gguf "$work/model.h5" --type q4_k_m \
    -o "$work/q4.gguf"
fi
[ "${INFER:-1}" = 0 ] && exit 0
# Inference at the model's context (issue 43: activations by blocks): one window scored, and two
# windows recorded as a routing trace in one pass, of random token ids.
config=$("$bin/moe-convert" inspect "$work/model.h5" | sed -n 's/^# model_config\t//p')
seq=$(echo "$config" | sed 's/.*"seq":\([0-9]*\).*/\1/')
vocab=$(echo "$config" | sed 's/.*"vocab_size":\([0-9]*\).*/\1/')
"$python" -c "import numpy as np, sys; n, v = int(sys.argv[1]), int(sys.argv[2])
np.random.default_rng(1).integers(0, v, size=2 * n + 1, dtype='<u4').tofile(sys.argv[3])" \
  "$seq" "$vocab" "$work/tokens.u32" || fail "could not write the token file"
TOOL=moe-infer step "score-1x$seq" "$work/model.h5" "" score --model "$work/model.h5" \
  --data "$work/tokens.u32" --batch 1 --max-sequences 1
TOOL=moe-profile step "record-2x$seq" "$work/model.h5" "$work/trace.h5" record --model \
  "$work/model.h5" --data "$work/tokens.u32" --batch 2 --max-tokens $((2 * seq)) \
  -o "$work/trace.h5"

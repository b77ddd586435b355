#!/usr/bin/env bash
# Do our GGUF files score in llama.cpp as in moe-infer (issue 43 item 4, issue 44)? For each case,
# llama.cpp's `llama-perplexity -c N --chunks 2` on a GGUF file beside `moe-infer score
# --per-token` of the same model (the file through `moe-convert import-gguf`, or the checkpoint
# it was exported from) on the very tokens llama-perplexity scored: its --kl-divergence-base file
# gives them, each chunk's first token BOS where the file adds one, as llama-perplexity does. Ours
# sums the log-probs of the same predictions (positions N/2 .. N-2 of each chunk) and prints the
# same running perplexity; the table gives both and their relative difference. llama.cpp runs
# with an f32 KV cache and without flash attention (-ctk f32 -ctv f32 -fa off), so that f32 files
# should agree to f32 rounding (~1e-5); its defaults (f16 cache) moved them 5e-6 .. 4e-5 here.
#   a. tests/data/gguf_llama_cpp's files written by llama.cpp's own converter (f32, q8_0).
#   b. an f32 export of ours (a Mixtral of widths 256), then llama-quantize's Q4_K_M and Q6_K of
#      it, import-gguf'd (k-quants need rows of 256: the fixture's widths of 32 fall back to other
#      types).
#   c. a gpt_oss trained here (moe-train --arch gpt_oss), exported f32, its q/k weights and biases
#      scaled 4x in the file (so that RoPE, the sliding window and the sinks matter), the result
#      scored by llama.cpp and, imported, by us; then the same model exported mxfp4. Without YaRN
#      the two must agree to f32 rounding; with YaRN (factor 4 over 32 positions) llama.cpp floors /
#      ceils the correction range, as import-gguf does (truncate true), while the trained model
#      (HF gpt-oss: truncate false) does not: both of ours are printed.
#   d. deepseek_v3 exported q8_0 and q4_k by export-gguf, import-gguf'd.
#   (c's "unscaled" rows: the export itself against the checkpoint it was exported from.)
# Quantised files are scored by us twice: the full pass (weights dequantised, f32 inputs) and
# --incremental (the decode GEMV, which quantises its inputs as ggml's CPU matmuls do for q4_K,
# q6_K, mxfp4 and Q8_0: f16 input scales, as ggml).
#
# llama.cpp is not a project dependency: give its llama-perplexity (and, for case b,
# llama-quantize) in LLAMA_PERPLEXITY / LLAMA_QUANTIZE; built as bench/llama_cpp.sh says, with
# `--target llama-perplexity llama-quantize`. Case b is skipped without LLAMA_QUANTIZE.
# Usage: LLAMA_PERPLEXITY=... [LLAMA_QUANTIZE=...] bench/llama_perplexity.sh [BUILD_DIR]
# (default build); THREADS=2, CASES="a b c d", TEXT (default the computers fortunes), WORK (default
# a mktemp directory; deleted at the end unless KEEP=1). Small models only: minutes on 2 cores.
set -euo pipefail
shopt -s inherit_errexit
bin=${1:-build}/bin
here=$(cd "$(dirname "$0")" && pwd)
helper="python3 $here/llama_perplexity.py"
threads=${THREADS:-2} cases=${CASES:-a b c d}
text=${TEXT:-/usr/share/games/fortunes/computers}
ppl=${LLAMA_PERPLEXITY:-} quant=${LLAMA_QUANTIZE:-}
[ -n "$ppl" ] && [ -x "$ppl" ] || {
  echo "llama_perplexity.sh: set LLAMA_PERPLEXITY to a llama-perplexity binary (how: this file)" >&2
  exit 2
}
for tool in moe-train moe-convert moe-infer; do
  [ -x "$bin/$tool" ] || { echo "llama_perplexity.sh: no $bin/$tool (build first)" >&2; exit 2; }
done
[ -f "$text" ] || { echo "llama_perplexity.sh: no text $text (set TEXT)" >&2; exit 2; }
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
head -c 8192 "$text" > "$work/text.txt"
fixture=$here/../tests/data/gguf_llama_cpp

# llama GGUF N [llama.cpp flags...]: llama-perplexity's running perplexities after chunks 1 and 2;
# leaves the tokens it scored in GGUF.logits.
llama() {
  local gguf=$1 n=$2
  shift 2
  if [ -f "$gguf.ppl" ]; then cat "$gguf.ppl"; return; fi
  local try
  # its log is written by a thread that may lose the last lines at exit on a busy machine: rerun
  for try in 1 2 3 4 5; do
    "$ppl" -m "$gguf" -f "$work/text.txt" -c "$n" -b "$n" --chunks 2 -t "$threads" -ctk f32 \
      -ctv f32 -fa off --kl-divergence-base "$gguf.logits" "$@" > "$gguf.log" 2>&1 || {
      echo "llama_perplexity.sh: llama-perplexity failed on $gguf:" >&2
      tail -20 "$gguf.log" >&2
      return 1
    }
    grep -q 'Final estimate' "$gguf.log" && break
    [ "$try" -lt 5 ] || { echo "llama_perplexity.sh: no final estimate in $gguf.log" >&2; return 1; }
  done
  grep -o '\[[0-9]*\][0-9.]*' "$gguf.log" | sed 's/\[[0-9]*\]//' | tr '\n' ' ' > "$gguf.ppl"
  cat "$gguf.ppl"
}

# ours CKPT GGUF N [moe-infer flags...]: our running perplexities on the tokens llama scored
ours() {
  local ckpt=$1 gguf=$2 n=$3 context files=()
  shift 3
  context=$("$bin/moe-convert" inspect "$ckpt" --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["model_config"]["seq"])')
  # shellcheck disable=SC2046 # meta prints two words
  $helper windows "$gguf.logits" $($helper meta "$gguf") "$context" "$ckpt.w" > /dev/null
  for c in 0 1; do
    "$bin/moe-infer" score --model "$ckpt" --data "$ckpt.w.$c.u32" --per-token --threads \
      "$threads" -q "$@" > "$ckpt.w.$c.jsonl"
    files+=("$ckpt.w.$c.jsonl")
  done
  $helper ours "$n" "${files[@]}"
}

# row NAME "LLAMA1 LLAMA2" "OURS1 OURS2"
row() {
  python3 - "$@" << 'EOF'
import sys
name, a, b = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rel = abs(float(b[-1]) - float(a[-1])) / float(a[-1])
print(f"| {name:<44} | {a[0]:>10} | {a[-1]:>10} | {float(b[0]):>12.4f} | {float(b[-1]):>12.4f} | {rel:8.1e} |")
EOF
}

# compare NAME GGUF N CKPT [moe-infer flags...]: llama.cpp on GGUF vs ours on CKPT
compare() {
  local name=$1 gguf=$2 n=$3 ckpt=$4 theirs mine
  shift 4
  theirs=$(llama "$gguf" "$n")
  mine=$(ours "$ckpt" "$gguf" "$n" "$@")
  row "$name" "$theirs" "$mine"
}

# imported GGUF: import-gguf's checkpoint of GGUF, GGUF.h5
imported() {
  "$bin/moe-convert" import-gguf "$1" -o "$1.h5" --force -q
}

case_a() {
  local t
  for t in f32 q8_0; do
    cp "$fixture/mixtral-$t.gguf" "$work/fixture-$t.gguf"
    imported "$work/fixture-$t.gguf"
    compare "a fixture mixtral-$t (llama.cpp's converter)" "$work/fixture-$t.gguf" 64 \
      "$work/fixture-$t.gguf.h5"
  done
  compare "a fixture mixtral-q8_0, ours --incremental" "$work/fixture-q8_0.gguf" 64 \
    "$work/fixture-q8_0.gguf.h5" --incremental
}

case_b() {
  local t m=$work/mixtral256
  "$bin/moe-train" --data "$text" --out "$m" --force --arch mixtral --d-model 256 --heads 4 \
    --kv-heads 2 --d-ff 512 --layers 2 --moe-every 1 --experts 4 --top-k 2 --seq 128 --batch 4 \
    --steps 200 --lr 3e-3 --eval-every 0 --checkpoint-every 0 --threads "$threads" -q
  "$bin/moe-convert" export-gguf "$m/last.h5" -o "$m-f32.gguf" --type f32 --force -q
  compare "b mixtral d256 f32 export, trained checkpoint" "$m-f32.gguf" 128 "$m/last.h5"
  for t in Q4_K_M Q6_K; do
    "$quant" "$m-f32.gguf" "$m-$t.gguf" "$t" "$threads" > "$m-$t.quantize.log" 2>&1 || {
      tail -5 "$m-$t.quantize.log" >&2
      return 1
    }
    imported "$m-$t.gguf"
    compare "b mixtral d256 llama-quantize $t" "$m-$t.gguf" 128 "$m-$t.gguf.h5"
    compare "b mixtral d256 llama-quantize $t, --incremental" "$m-$t.gguf" 128 "$m-$t.gguf.h5" \
      --incremental
  done
}

# gpt_oss NAME [moe-train flags]: a tiny gpt_oss, exported f32 with q/k scaled 4x: NAME.gguf
gpt_oss() {
  local g=$work/$1
  shift
  "$bin/moe-train" --data "$text" --out "$g" --force --arch gpt_oss --layers 2 --d-model 64 \
    --heads 4 --kv-heads 2 --head-dim 16 --d-ff 64 --seq 128 --experts 4 --top-k 2 \
    --sliding-window 16 --batch 4 --steps 200 --lr 3e-3 --eval-every 0 --checkpoint-every 0 \
    --threads "$threads" -q "$@"
  "$bin/moe-convert" export-gguf "$g/last.h5" -o "$g-raw.gguf" --type f32 --force -q 2> /dev/null
  $helper scale "$g-raw.gguf" "$g.gguf" 'attn_[qk]\.(weight|bias)$' 4 > /dev/null
}

case_c() {
  local g=$work/gptoss y=$work/gptoss-yarn
  gpt_oss gptoss
  compare "c gpt_oss f32 unscaled, trained checkpoint" "$g-raw.gguf" 128 "$g/last.h5"
  imported "$g.gguf"
  compare "c gpt_oss f32, no YaRN" "$g.gguf" 128 "$g.gguf.h5"
  "$bin/moe-convert" export-gguf "$g.gguf.h5" -o "$g-mxfp4.gguf" --type mxfp4 --force -q
  imported "$g-mxfp4.gguf"
  compare "c gpt_oss mxfp4 experts, no YaRN" "$g-mxfp4.gguf" 128 "$g-mxfp4.gguf.h5"
  compare "c gpt_oss mxfp4, no YaRN, --incremental" "$g-mxfp4.gguf" 128 "$g-mxfp4.gguf.h5" \
    --incremental
  gpt_oss gptoss-yarn --rope-scaling yarn --rope-factor 4 --original-max-position-embeddings 32
  compare "c gpt_oss f32 YaRN unscaled, trained (trunc. false)" "$y-raw.gguf" 128 "$y/last.h5"
  imported "$y.gguf"
  compare "c gpt_oss f32 YaRN, import (truncate true)" "$y.gguf" 128 "$y.gguf.h5"
  # the same weights with HF gpt-oss's unrounded correction range (truncate false)
  "$bin/moe-convert" export-hf "$y.gguf.h5" -o "$y-hf" --force -q
  python3 - "$y-hf/config.json" << 'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
rp = c.get("rope_parameters") or c.get("rope_scaling")
rp["truncate"] = False
json.dump(c, open(sys.argv[1], "w"), indent=2)
EOF
  "$bin/moe-convert" import-hf "$y-hf" -o "$y-untruncated.h5" --force -q
  compare "c gpt_oss f32 YaRN, truncate false (HF)" "$y.gguf" 128 "$y-untruncated.h5"
}

case_d() {
  local d=$work/dsv3 t
  "$bin/moe-train" --data "$text" --out "$d" --force --arch deepseek_v3 --layers 2 --d-model 256 \
    --heads 4 --d-ff 256 --shared-expert-ff 256 --seq 128 --experts 4 --top-k 2 --batch 4 \
    --steps 200 --lr 3e-3 --eval-every 0 --checkpoint-every 0 --threads "$threads" -q
  for t in q8_0 q4_k; do
    "$bin/moe-convert" export-gguf "$d/last.h5" -o "$d-$t.gguf" --type "$t" --force -q 2> /dev/null
    imported "$d-$t.gguf"
    compare "d deepseek_v3 export-gguf $t" "$d-$t.gguf" 128 "$d-$t.gguf.h5"
    compare "d deepseek_v3 export-gguf $t, --incremental" "$d-$t.gguf" 128 "$d-$t.gguf.h5" \
      --incremental
  done
}

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# llama-perplexity -c N --chunks 2 (-ctk f32 -ctv f32 -fa off) vs moe-infer score --per-token"
echo "# on the same tokens (first 8 KiB of $text); $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}"
echo "| case | llama.cpp [1] | llama.cpp [2] | ours [1] | ours [2] | rel. diff [2] |"
echo "|---|---:|---:|---:|---:|---:|"
for c in $cases; do
  if [ "$c" = b ] && [ -z "$quant" ]; then
    echo "# case b skipped: set LLAMA_QUANTIZE" >&2
    continue
  fi
  "case_$c"
done

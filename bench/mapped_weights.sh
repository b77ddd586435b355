#!/bin/sh
# Mapped weights against weights read into memory (issue 43 item 2), at a real model's layer
# shape: a Hugging Face directory of random bf16 weights at OLMoE-1B-7B's configuration with
# LAYERS layers (default 2: 2.09 GB; bench/make_hf_random.py), imported, then moe-infer generate
# of a 1-token prompt (1 new token) and of a 4-token prompt (8 new tokens), each with the weights
# mapped (the default) and read (--read-weights), in pairs A B A B. Prints peak RSS and wall time
# (GNU time), the opening time moe-infer logs (-v: "opened in S s"), and whether the tokens agree.
# Every file is deleted at the end.
# Usage: bench/mapped_weights.sh [BIN_DIR] (default build/bin); LAYERS, ROUNDS (default 2),
# WORK=run/mapped-weights, PYTHON (one with numpy; default /opt/moe-python/bin/python).
set -u
bin=${1:-build/bin}
layers=${LAYERS:-2}
rounds=${ROUNDS:-2}
work=${WORK:-run/mapped-weights}
python=${PYTHON:-/opt/moe-python/bin/python}
here=$(dirname "$0")
fail() { echo "FAIL: $*"; exit 1; }
[ -x /usr/bin/time ] || fail "GNU time (/usr/bin/time) is needed: apt-get install time"
for tool in moe-convert moe-infer; do [ -x "$bin/$tool" ] || fail "no $bin/$tool (build first)"; done
mkdir -p "$work" || exit 1
trap 'rm -rf "$work"' EXIT
cpu=$(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1)
echo "# mapped vs read weights: olmoe, $layers layers, random bf16 weights"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(getconf _NPROCESSORS_ONLN) cores," \
  "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) RAM; page cache warm"
"$python" "$here/make_hf_random.py" olmoe "$layers" "$work/hf" > "$work/make.out" ||
  fail "make_hf_random.py failed"
cp "$here/../tests/data/tokenizers/bpe-qwen/tokenizer.json" "$work/hf/" || fail "no test tokenizer"
"$bin/moe-convert" import-hf "$work/hf" -o "$work/model.h5" -q || fail "import-hf failed"
rm -rf "$work/hf"
echo "# $(du -b "$work/model.h5" | awk '{printf "%.2f GB checkpoint", $1 / 1e9}')"
printf 'A\n' > "$work/one.txt"
printf 'The quick brown fox\n' > "$work/four.txt"
echo
echo "| case | weights | round | peak RSS GB | open s | wall s | tokens |"
echo "|---|---|---:|---:|---:|---:|---|"
# run CASE PROMPTS MAX_NEW MODE ROUND: one generate, its row; the first mapped output of a case
# is the reference the others must equal.
run() {
  flag=$([ "$4" = read ] && echo --read-weights)
  /usr/bin/time -f '%M %e' -o "$work/time" "$bin/moe-infer" generate --model "$work/model.h5" \
    --prompts "$2" --max-new "$3" --temperature 0 -v $flag > "$work/out" 2> "$work/err" ||
    fail "$1 $4: $(tail -3 "$work/err")"
  read -r rss_kib wall < "$work/time"
  open=$(sed -n 's/.*opened in \([0-9.]*\) s.*/\1/p' "$work/err" | head -1)
  [ -f "$work/ref-$1" ] || cp "$work/out" "$work/ref-$1"
  same=$(cmp -s "$work/out" "$work/ref-$1" && echo same || echo DIFFERENT)
  echo "$1 $4 $5 $rss_kib ${open:-?} $wall $same" |
    awk '{printf "| %s | %s | %s | %.2f | %.2f | %s | %s |\n", $1, $2, $3, $4 * 1024 / 1e9, $5, $6, $7}'
}
for c in "1-token:$work/one.txt:1" "4+8-tokens:$work/four.txt:8"; do
  name=${c%%:*} rest=${c#*:}
  prompts=${rest%:*} new=${rest##*:}
  round=1
  while [ "$round" -le "$rounds" ]; do
    run "$name" "$prompts" "$new" mapped "$round"
    run "$name" "$prompts" "$new" read "$round"
    round=$((round + 1))
  done
done

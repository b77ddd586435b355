#!/usr/bin/env bash
# Decode speed of moe-infer against llama.cpp on the same weights (issue 20's peer): one model of
# moe-bench --decode's shape (Mixtral-shaped, d_model 512, 8 layers all MoE, 8 heads / 4 kv heads,
# F 1408, 8 experts top-2, byte vocabulary: 145M parameters, 41M active per token), trained one
# step so that it is a real checkpoint, then per weight type the same weights as our checkpoint
# (moe-convert dtype / quantize) and as GGUF (moe-convert export-gguf --type), and in turn, R
# rounds: `moe-infer generate` of 128 new tokens after a 12-token prompt (tokens/s over the
# generation, as moe-infer prints it) and llama.cpp's `llama-bench -p 0 -n 128` (text generation
# tokens/s, after its own warm-up run). Prints each round and the median ratio moe / llama.cpp.
#
# llama.cpp is not a project dependency: give its llama-bench binary in LLAMA_BENCH. One way to
# build it (the sources vendored in the llama-cpp-python package on PyPI):
#   pip download llama-cpp-python --no-deps --no-binary :all: -d /tmp/llsrc
#   tar xzf /tmp/llsrc/llama_cpp_python-*.tar.gz -C /tmp/llsrc
#   cd /tmp/llsrc/llama_cpp_python-*/vendor/llama.cpp
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
#     -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF && cmake --build build -j --target llama-bench
#   LLAMA_BENCH=$PWD/build/bin/llama-bench
# Usage: LLAMA_BENCH=... bench/llama_cpp.sh [BUILD_DIR] (default build); THREADS=2, ROUNDS=3,
# TYPES="f32 bf16 f16 q8_0", WORK=run/bench-llama-cpp (about 2 GB of files).
set -euo pipefail
bin=${1:-build}/bin
work=${WORK:-run/bench-llama-cpp}
threads=${THREADS:-2} rounds=${ROUNDS:-3} types=${TYPES:-f32 bf16 f16 q8_0}
llama=${LLAMA_BENCH:-}
[ -n "$llama" ] && [ -x "$llama" ] || {
  echo "llama_cpp.sh: set LLAMA_BENCH to a llama-bench binary (how to build one: this file)" >&2
  exit 2
}
for tool in moe-train moe-convert moe-infer; do
  [ -x "$bin/$tool" ] || { echo "llama_cpp.sh: no $bin/$tool (build first)" >&2; exit 2; }
done
mkdir -p "$work"
ckpt=$work/run/last.h5
if [ ! -f "$ckpt" ]; then
  "$bin/moe-train" --data /usr/share/games/fortunes/computers --out "$work/run" --force \
    --arch mixtral --d-model 512 --heads 8 --kv-heads 4 --d-ff 1408 --layers 8 --moe-every 1 \
    --experts 8 --top-k 2 --seq 1024 --batch 1 --steps 1 --eval-every 0 --checkpoint-every 0 \
    --threads "$threads" -q
fi
"$bin/moe-convert" freeze "$ckpt" -o "$work/f32.h5" --force -q
for t in $types; do
  case $t in
    f32) ;;
    bf16 | f16) "$bin/moe-convert" dtype "$work/f32.h5" --to "$t" -o "$work/$t.h5" --force -q ;;
    q8_0) "$bin/moe-convert" quantize "$work/f32.h5" -o "$work/$t.h5" --force -q ;;
    *) echo "llama_cpp.sh: unknown type $t (f32 bf16 f16 q8_0)" >&2; exit 2 ;;
  esac
  "$bin/moe-convert" export-gguf "$ckpt" -o "$work/$t.gguf" --type "$t" --force -q
done
printf 'The computer\n' > "$work/prompt.txt"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# decode tokens/s, batch 1, 128 new tokens: moe-infer generate vs llama.cpp llama-bench tg128, same weights"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $threads threads, OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-(unset)}, $rounds rounds in turn"
printf '%-6s %-5s %10s %10s %8s\n' round type moe llama.cpp ratio
declare -A ratios
for r in $(seq 1 "$rounds"); do
  for t in $types; do
    moe=$("$bin/moe-infer" generate --model "$work/$t.h5" --prompts "$work/prompt.txt" \
      --max-new 128 --threads "$threads" 2>&1 >/dev/null |
      sed -n 's/.* new tokens, \([0-9.]*\) tokens\/s.*/\1/p')
    theirs=$("$llama" -m "$work/$t.gguf" -p 0 -n 128 -t "$threads" -r 1 -o csv 2>/dev/null |
      python3 -c 'import csv, sys; print([r["avg_ts"] for r in csv.DictReader(sys.stdin)][-1])')
    ratio=$(python3 -c "print(f'{$moe / $theirs:.2f}')")
    ratios[$t]="${ratios[$t]:-} $ratio"
    printf '%-6s %-5s %10.1f %10.1f %8s\n' "$r" "$t" "$moe" "$theirs" "$ratio"
  done
done
for t in $types; do
  # shellcheck disable=SC2086 # the ratios are a word list
  echo "# $t median moe/llama.cpp: $(python3 -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' ${ratios[$t]})"
done

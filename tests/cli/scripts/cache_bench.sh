#!/bin/sh
# moe-cache-bench on the routing trace of a real (tiny) training run: exit 0, one row per cache
# size and policy (lru, the 4 default lfu settings, min, belady), every row's check "ok", belady's
# ratio 100; bad flags are usage errors (exit 2) naming the flag; a missing trace exits 1.
# Usage: cache_bench.sh MOE_TRAIN MOE_CACHE_BENCH CORPUS
set -u
train=$1 bench=$2 corpus=$3
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

"$train" --data "$corpus" --out "$work/run" --layers 2 --moe-every 1 --d-model 16 --heads 2 \
  --d-ff 16 --experts 8 --top-k 2 --batch 2 --seq 16 --steps 12 --eval-every 0 --threads 1 -q \
  --trace "$work/trace.h5" > /dev/null 2> "$work/train.err" || fail "moe-train: $(cat "$work/train.err")"

"$bench" "$work/trace.h5" --sizes 25,50 > "$work/out" 2> "$work/err"
rc=$?
[ "$rc" -eq 0 ] || fail "moe-cache-bench exit $rc: $(cat "$work/err")"
rows=$(grep -vc '^#' "$work/out")
[ "$rows" -eq 14 ] || fail "expected 14 rows (2 sizes x 7 policies), got $rows: $(cat "$work/out")"
[ "$(grep -v '^#' "$work/out" | awk '$NF != "ok"' | wc -l)" -eq 0 ] || fail "a check failed: $(cat "$work/out")"
for p in lru min belady; do
  [ "$(grep -v '^#' "$work/out" | awk -v p=$p '$3 == p' | wc -l)" -eq 2 ] || fail "no $p rows"
done
[ "$(grep -v '^#' "$work/out" | awk '$3 == "lfu"' | wc -l)" -eq 8 ] || fail "expected 8 lfu rows"
grep -v '^#' "$work/out" | awk '$3 == "belady" && $9 != "100.0" { exit 1 }' || fail "belady ratio is not 100"
grep -q '^# trace: .*2 MoE layers, experts per layer 8,8 (16 in all), top-2, 12 batches' "$work/out" ||
  fail "header: $(grep '^# trace' "$work/out")"

usage() {  # usage EXPECTED_TEXT ARGS...: exit 2, stderr names the flag, nothing on stdout
  want=$1
  shift
  "$bench" "$@" > "$work/out" 2> "$work/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "$* : exit $rc, expected 2: $(cat "$work/err")"
  grep -qF -- "$want" "$work/err" || fail "$* : stderr lacks '$want': $(cat "$work/err")"
  [ ! -s "$work/out" ] || fail "$* : wrote to stdout: $(cat "$work/out")"
}
usage "--lfu '1:2'" "$work/trace.h5" --lfu 1:2
usage "--lfu-beta 0" "$work/trace.h5" --lfu 0:0:1
usage "--lfu-period 0" "$work/trace.h5" --lfu 0:0.5:0
usage "--sizes 0" "$work/trace.h5" --sizes 0
"$bench" "$work/missing.h5" > "$work/out" 2> "$work/err"
rc=$?
[ "$rc" -eq 1 ] || fail "missing trace: exit $rc, expected 1"
grep -q "missing.h5" "$work/err" || fail "missing trace: stderr does not name it: $(cat "$work/err")"
echo "ok"

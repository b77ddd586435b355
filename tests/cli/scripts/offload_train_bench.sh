#!/bin/sh
# moe-offload-train-bench --quick on a real corpus: exit 0; the three tables with their rows
# (memory: 2 sizes x resident/host/ssd; throughput: 2 regimes x 4 modes; ablation: 7 rows); every
# offloaded row's parameters equal the resident run's ("yes", never "NO") and every run within
# its memory bound; the scratch directory removed; bad flags are usage errors (exit 2) naming the
# flag, before any output.
# Usage: offload_train_bench.sh MOE_OFFLOAD_TRAIN_BENCH CORPUS
set -u
bench=$1 corpus=$2
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

"$bench" --quick --data "$corpus" --ssd-dir "$work" > "$work/out" 2> "$work/err"
rc=$?
[ "$rc" -eq 0 ] || fail "exit $rc: $(cat "$work/err")"
rows() { grep -v '^#' "$work/out" | awk -v k="$1" -v f="$2" '$f == k' | wc -l; }
[ "$(rows resident 2)" -eq 2 ] && [ "$(rows host 2)" -eq 2 ] && [ "$(rows ssd 2)" -eq 2 ] ||
  fail "memory table: expected 2 rows per mode: $(cat "$work/out")"
[ "$(rows compute 1)" -eq 4 ] && [ "$(rows load 1)" -eq 4 ] ||
  fail "throughput table: expected 4 rows per regime: $(cat "$work/out")"
for row in "full system" "- pinning" "- opt overlap" "- prefetch" "full, --clip 1" \
  "resident --clip 0" "resident --clip 1"; do
  grep -qF -- "  $row " "$work/out" || fail "ablation: no '$row' row"
done
grep -v '^#' "$work/out" | grep -qw NO && fail "a check failed: $(grep -w NO "$work/out")"
[ "$(grep -v '^#' "$work/out" | grep -cw yes)" -ge 15 ] || fail "too few checked rows"
grep -q '^# 1. memory' "$work/out" && grep -q '^# 2. throughput' "$work/out" &&
  grep -q '^# 3. ablation' "$work/out" || fail "table headers missing"
grep -q '^# compute-bound median ratio' "$work/out" || fail "no median ratio line"
[ -z "$(ls -A "$work" | grep -v '^out$\|^err$')" ] || fail "scratch left behind: $(ls "$work")"

usage() {  # usage EXPECTED_TEXT ARGS...: exit 2, stderr names the flag, nothing on stdout
  want=$1
  shift
  "$bench" "$@" > "$work/out" 2> "$work/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "$* : exit $rc, expected 2: $(cat "$work/err")"
  grep -qF -- "$want" "$work/err" || fail "$* : stderr lacks '$want': $(cat "$work/err")"
  [ ! -s "$work/out" ] || fail "$* : wrote to stdout: $(cat "$work/out")"
}
usage "--ram-budget" --quick --data "$corpus" --ram-budget lots
usage "--rounds" --quick --data "$corpus" --rounds 0
usage "--data" --quick --data "$work/missing.txt"
usage "--ssd-dir" --quick --data "$corpus" --ssd-dir "$work/missing"
echo "ok"

#!/bin/sh
# `mpiexec -n 2 moe-comm-bench --device cuda --quick`, judged against the GPUs this machine has
# (counted without the bench: nvidia-smi -L and CUDA_VISIBLE_DEVICES).
# - No GPU usable (or a build without CUDA): refused before any work: exit 1,
#   "moe-comm-bench: error: --device cuda: <why>", nothing on stdout.
# - One GPU: NCCL cannot put both ranks on it: the job ends non-zero, saying so.
# - Two or more: it runs: exit 0, the NCCL tables (flat and hierarchical all-to-all-v, all_reduce)
#   with busbw and d2d columns, a row per size, no wrong element.
# Usage: comm_bench_cuda.sh MPIEXEC MOE_COMM_BENCH MOE_HAVE_CUDA(ON|OFF)
set -u
mpiexec=$1 bench=$2 have_cuda=$3
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

# GPUs the bench should see, counted without it.
gpus=0
case "$have_cuda" in
  ON | on | TRUE | true | 1)
    if command -v nvidia-smi > /dev/null 2>&1; then
      gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
    fi
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
      visible=$(printf '%s\n' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
      [ "$visible" -ge "$gpus" ] || gpus=$visible
    fi
    ;;
esac

timeout 150 "$mpiexec" -n 2 "$bench" --device cuda --quick > "$work/out" 2> "$work/err"
rc=$?
echo "--- stdout"; cat "$work/out"
echo "--- stderr"; cat "$work/err"
echo "--- exit code $rc; build with CUDA: $have_cuda; GPUs expected usable: $gpus"
[ "$rc" -ne 124 ] || fail "the bench hung until the timeout"

if [ "$gpus" -eq 0 ]; then
  [ "$rc" -eq 1 ] || fail "expected exit code 1 where no GPU is usable, got $rc"
  grep -q '^moe-comm-bench: error: --device cuda: ..*' "$work/err" ||
    fail "no 'moe-comm-bench: error: --device cuda: <why>' on stderr"
  [ ! -s "$work/out" ] || fail "the refused run wrote to stdout"
  grep -q ' done$' "$work/err" && fail "the refused run measured something"
  echo "refused as expected where no GPU is usable"
  exit 0
fi

if [ "$gpus" -eq 1 ]; then
  [ "$rc" -ne 0 ] || fail "2 ranks on 1 GPU: expected a non-zero exit"
  grep -q 'moe-comm-bench: error: NCCL needs a GPU of its own for every rank: on this node, local ranks 0 and 1 both use cuda:0' \
    "$work/err" || fail "no message saying 2 ranks cannot share the GPU"
  [ ! -s "$work/out" ] || fail "the refused run wrote to stdout"
  echo "refused as expected with 2 ranks on 1 GPU"
  exit 0
fi

[ "$rc" -eq 0 ] || fail "expected exit code 0 on a machine with a usable GPU, got $rc"
grep -q '^# moe-comm-bench: .*NCCL' "$work/out" || fail "no NCCL header"
grep -q '^# all-to-all-v, flat' "$work/out" || fail "no flat all-to-all table"
grep -q '^# all-to-all-v, hierarchical' "$work/out" || fail "no hierarchical all-to-all table"
grep -q '^# all_reduce' "$work/out" || fail "no all_reduce table"
grep -q '^#  *size  *count  *type  *time  *algbw  *busbw  *d2d  *bus/d2d  *#wrong' "$work/out" ||
  fail "no busbw / d2d column header"
# Data rows: size count type time algbw busbw d2d bus/d2d #wrong [vs flat]. Quick sizes are
# 1 KiB .. 1 MiB (6 rows per table, 3 tables); every time and d2d rate must be positive (busbw is printed
# to 3 decimals, so a slow small message may show 0.000), every #wrong 0.
awk '!/^#/ && NF >= 9 {
       rows++
       if ($4 <= 0 || $7 <= 0) { print "FAIL: non-positive time or d2d rate: " $0; bad = 1 }
       if ($9 != 0) { print "FAIL: wrong elements: " $0; bad = 1 }
     }
     END { if (rows < 18) { print "FAIL: " rows + 0 " table rows, expected >= 18"; bad = 1 }
           exit bad }' "$work/out" || exit 1
echo "ran on the GPU: NCCL busbw tables, no wrong element"

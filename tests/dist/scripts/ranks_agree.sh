#!/bin/sh
# Ranks of one job that were given different models, data or flags (issue 45, item 5): moe-infer
# score --ep scored anyway (exit 0, meaningless numbers). Now every rank refuses at start, naming
# what differs and which rank, and the job ends (no hang: each run is under `timeout`). Started as
# MPMD (`mpiexec -n 1 A : -n 1 B`), as a user would start ranks with different flags. The same
# model reached by two paths still scores, as one process does. moe-profile record, which runs in
# one process, refuses a job of several ranks instead of letting each record into the same -o.
# Usage: ranks_agree.sh MPIEXEC MOE_TRAIN MOE_INFER MOE_PROFILE DATA WORKDIR
set -u
mpiexec=$1 train=$2 infer=$3 profile=$4 data=$5 work=$6
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
model="--arch mixtral --layers 2 --d-model 16 --heads 2 --kv-heads 1 --d-ff 32 --seq 16 --experts 4
  --moe-every 1 --batch 4 --steps 2 --eval-batches 1 --threads 1 -q"
"$train" --data "$data" $model --out "$work/a" || fail "training a"
"$train" --data "$data" $model --seed 7 --out "$work/b" || fail "training b"
head -c 20000 "$data" > "$work/other.txt"
score="score --ep 2 -q"
# refused EXPECTED_TEXT -- RANK0_ARGS -- RANK1_ARGS
refused() {
  expected=$1
  shift 2
  first=""
  while [ "$1" != "--" ]; do first="$first $1"; shift; done
  shift
  out=$(timeout 60 "$mpiexec" -n 1 "$infer" $score $first : -n 1 "$infer" $score "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out" | grep 'error' | head -2
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "ranks differing in $expected: exit $rc (124: hung)"
  for rank in 0 1; do
    printf '%s' "$out" | grep -q "moe: rank $rank: moe-infer: error: $expected differs between ranks: rank 1 disagrees with rank 0" ||
      fail "rank $rank did not say that $expected differs"
  done
}
a="--model $work/a/last.h5 --data $data --batch 2 --max-sequences 5"
m="--max-sequences 5"
refused "the model's seed" -- $a -- --model "$work/b/last.h5" --data "$data" --batch 2 $m
refused "moe-infer setting 'batch'" -- $a -- --model "$work/a/last.h5" --data "$data" --batch 3 $m
refused "moe-infer setting 'max_sequences'" -- $a -- --model "$work/a/last.h5" --data "$data" \
  --batch 2 --max-sequences 4
refused "the data to score (its tokens, as its format and tokenizer read them)" -- $a -- \
  --model "$work/a/last.h5" --data "$work/other.txt" --batch 2 $m
refused "the data to score (its tokens, as its format and tokenizer read them)" -- $a -- \
  $a --data-format u16
# One model by two paths (the file, its run directory): the same scores as one process.
"$infer" score --model "$work/a" --data "$data" --batch 2 --max-sequences 5 -q > "$work/one.jsonl" ||
  fail "one process"
timeout 60 "$mpiexec" -n 1 "$infer" $score $a : -n 1 "$infer" $score --model "$work/a" \
  --data "$data" --batch 2 $m > "$work/two.jsonl" || fail "one model by two paths was refused"
[ "$(wc -l < "$work/two.jsonl")" -eq 5 ] || fail "expected 5 scores"
paste -d' ' "$work/one.jsonl" "$work/two.jsonl" | awk -F'[:,} ]+' '
  { d = $6 - $16; if (d < 0) d = -d; if ($2 != $12 || d > 1e-6 * $6) { print "line " NR; bad = 1 } }
  END { exit bad }' || fail "one model by two paths: scores differ from one process"
echo "one model by two paths: the scores of one process"
# moe-profile record is one process's work: a job of 2 ranks is refused on both, nothing written.
out=$(timeout 60 "$mpiexec" -n 2 "$profile" record --model "$work/a/last.h5" --data "$data" \
  --max-tokens 64 -o "$work/trace.h5" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 2 ] || fail "moe-profile record on 2 ranks: exit $rc"
[ "$(printf '%s\n' "$out" | grep -c 'moe-profile: error: moe-profile record runs in one process; this job has 2 ranks')" -eq 2 ] ||
  fail "moe-profile record: not refused on both ranks"
[ ! -e "$work/trace.h5" ] || fail "moe-profile record wrote a trace"
echo "PASS"

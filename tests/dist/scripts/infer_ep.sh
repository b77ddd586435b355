#!/bin/sh
# moe-infer score with the experts spread over 2 and 4 ranks (--ep) gives one process's scores:
# the same sequences in the same order, each NLL equal to float tolerance (an expert's GEMM then
# holds other rows, and BLAS may round a row differently with another row count: 1e-6 relative).
# 13 sequences in rounds of batch x ranks leave some ranks without a sequence in the last round.
# A rank with an unknown flag ends the whole job. Shards placed by a routing trace
# (moe-convert partition --trace) serve under --ep 2 and in one process with the same scores.
# score --incremental under --ep is refused by name.
# Usage: infer_ep.sh MPIEXEC MOE_TRAIN MOE_INFER DATA WORKDIR MOE_PROFILE MOE_CONVERT
set -u
mpiexec=$1 train=$2 infer=$3 data=$4 work=$5 profile=$6 convert=$7
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$train" --data "$data" --arch mixtral --layers 2 --d-model 32 --heads 2 --kv-heads 1 --d-ff 64 \
  --seq 16 --experts 4 --moe-every 1 --batch 4 --steps 5 --eval-batches 1 --threads 1 -q \
  --out "$work/run" || fail "training"
args="score --model $work/run/last.h5 --data $data --batch 2 --max-sequences 13 -q"
"$infer" $args > "$work/one.jsonl" || fail "one process"
[ "$(wc -l < "$work/one.jsonl")" -eq 13 ] || fail "expected 13 lines"
# Keys are sorted: index, logprob_sum, nll_mean, ppl, tokens.
same_scores() {  # FILE LABEL: FILE has one.jsonl's sequences, each nll_mean within 1e-6 relative
  [ "$(wc -l < "$1")" -eq 13 ] || fail "$2: expected 13 lines"
  paste -d' ' "$work/one.jsonl" "$1" | awk -F'[:,} ]+' '
    { if ($2 != $12) { print "line " NR ": index " $2 " vs " $12; bad = 1 }
      d = $6 - $16; if (d < 0) d = -d
      if (d > 1e-6 * $6) { print "line " NR ": nll_mean " $6 " vs " $16; bad = 1 }
      if (d > worst) worst = d }
    END { printf "worst nll_mean difference %.3g\n", worst; exit bad }' ||
    fail "$2 differs from one process"
  echo "$2: 13 sequences, the scores of one process"
}
for n in 2 4; do
  timeout 120 "$mpiexec" -n $n "$infer" $args --ep $n > "$work/ep$n.jsonl" || fail "--ep $n"
  same_scores "$work/ep$n.jsonl" "--ep $n"
done
# Experts placed on ranks by their profiled load: every rank serves the experts its file holds.
"$profile" record -q --model "$work/run/last.h5" --data "$data" --max-tokens 4096 \
  -o "$work/trace.h5" || fail "moe-profile record"
"$convert" partition -q "$work/run/last.h5" --ranks 2 --trace "$work/trace.h5" \
  -o "$work/placed" || fail "moe-convert partition --trace"
placed_args="score --model $work/placed --data $data --batch 2 --max-sequences 13 -q"
timeout 120 "$mpiexec" -n 2 "$infer" $placed_args --ep 2 > "$work/placed2.jsonl" ||
  fail "--ep 2 on the placed shards"
same_scores "$work/placed2.jsonl" "--ep 2, shards placed by the trace"
"$infer" $placed_args > "$work/placed1.jsonl" || fail "one process on the placed shards"
same_scores "$work/placed1.jsonl" "one process, shards placed by the trace"
# The ring streams one checkpoint file: a sharded directory is refused, saying how to merge it.
out=$("$infer" $placed_args --expert-budget 50% 2>&1)
rc=$?
printf '%s\n' "$out" | tail -2
[ "$rc" -eq 1 ] || fail "--expert-budget with a sharded directory: exit $rc"
printf '%s' "$out" | grep -q "moe-convert merge" || fail "no message saying how to merge"
out=$(timeout 60 "$mpiexec" -n 2 "$infer" score --model "$work/run/last.h5" --data "$data" --ep 4 2>&1)
rc=$?
printf '%s\n' "$out" | tail -3
[ "$rc" -eq 2 ] || fail "--ep 4 on 2 ranks should be a usage error (exit $rc)"
printf '%s' "$out" | grep -q "needs 4 ranks" || fail "no clear message for --ep 4 on 2 ranks"
# score --incremental (a token at a time through the KV cache) runs in one process: under --ep it
# is a usage error on every rank, not a hang.
out=$(timeout 60 "$mpiexec" -n 2 "$infer" $args --ep 2 --incremental 2>&1)
rc=$?
printf '%s\n' "$out" | tail -2
[ "$rc" -eq 2 ] || fail "--incremental under --ep 2 should be a usage error (exit $rc)"
printf '%s' "$out" | grep -q "incremental runs in one process" || fail "no message for --incremental"
# A rank whose flags do not parse ends the job (exit 2) instead of leaving its peer waiting.
out=$(timeout 30 "$mpiexec" -n 1 "$infer" $args --ep 2 : -n 1 "$infer" $args --ep 2 --bogus 2>&1)
rc=$?
printf '%s\n' "$out" | tail -3
[ "$rc" -eq 2 ] || fail "a rank with an unknown flag: exit $rc (124: the job hung)"
printf '%s' "$out" | grep -q "moe-infer: error: .*--bogus" || fail "no message naming --bogus"
# ... and so does a rank that stops after --help (issue 45; before: the other rank hung).
out=$(timeout 30 "$mpiexec" -n 1 "$infer" $args --ep 2 : -n 1 "$infer" $args --ep 2 --help 2>&1)
rc=$?
printf '%s\n' "$out" | tail -1
[ "$rc" -eq 2 ] || fail "a rank given --help: exit $rc (124: the job hung)"
printf '%s' "$out" | grep -q "moe-infer: error: .*stopped after --help" || fail "no message for --help"

#!/bin/sh
# moe-infer score with the experts spread over 2 and 4 ranks (--ep) gives one process's scores:
# the same sequences in the same order, each NLL equal to float tolerance (an expert's GEMM then
# holds other rows, and BLAS may round a row differently with another row count: 1e-6 relative).
# 13 sequences in rounds of batch x ranks leave some ranks without a sequence in the last round.
# A rank with an unknown flag ends the whole job.
# Usage: infer_ep.sh MPIEXEC MOE_TRAIN MOE_INFER DATA WORKDIR
set -u
mpiexec=$1 train=$2 infer=$3 data=$4 work=$5
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$train" --data "$data" --arch mixtral --layers 2 --d-model 32 --heads 2 --kv-heads 1 --d-ff 64 \
  --seq 16 --experts 4 --moe-every 1 --batch 4 --steps 5 --eval-batches 1 --threads 1 -q \
  --out "$work/run" || fail "training"
args="score --model $work/run/last.h5 --data $data --batch 2 --max-sequences 13 -q"
"$infer" $args > "$work/one.jsonl" || fail "one process"
[ "$(wc -l < "$work/one.jsonl")" -eq 13 ] || fail "expected 13 lines"
for n in 2 4; do
  timeout 120 "$mpiexec" -n $n "$infer" $args --ep $n > "$work/ep$n.jsonl" || fail "--ep $n"
  [ "$(wc -l < "$work/ep$n.jsonl")" -eq 13 ] || fail "--ep $n: expected 13 lines"
  # Keys are sorted: index, logprob_sum, nll_mean, ppl, tokens.
  paste -d' ' "$work/one.jsonl" "$work/ep$n.jsonl" | awk -F'[:,} ]+' '
    { if ($2 != $12) { print "line " NR ": index " $2 " vs " $12; bad = 1 }
      d = $6 - $16; if (d < 0) d = -d
      if (d > 1e-6 * $6) { print "line " NR ": nll_mean " $6 " vs " $16; bad = 1 }
      if (d > worst) worst = d }
    END { printf "worst nll_mean difference %.3g\n", worst; exit bad }' ||
    fail "--ep $n differs from one process"
  echo "--ep $n: 13 sequences, the scores of one process"
done
out=$(timeout 60 "$mpiexec" -n 2 "$infer" score --model "$work/run/last.h5" --data "$data" --ep 4 2>&1)
rc=$?
printf '%s\n' "$out" | tail -3
[ "$rc" -eq 2 ] || fail "--ep 4 on 2 ranks should be a usage error (exit $rc)"
printf '%s' "$out" | grep -q "needs 4 ranks" || fail "no clear message for --ep 4 on 2 ranks"
# A rank whose flags do not parse ends the job (exit 2) instead of leaving its peer waiting.
out=$(timeout 30 "$mpiexec" -n 1 "$infer" $args --ep 2 : -n 1 "$infer" $args --ep 2 --bogus 2>&1)
rc=$?
printf '%s\n' "$out" | tail -3
[ "$rc" -eq 2 ] || fail "a rank with an unknown flag: exit $rc (124: the job hung)"
printf '%s' "$out" | grep -q "moe-infer: error: .*--bogus" || fail "no message naming --bogus"

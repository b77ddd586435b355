#!/bin/sh
# Resume on another number of ranks (issue 18, "universal" checkpoints), with moe-train as users
# run it. For gpt and mixtral, a run is handed over 4 ranks -> 2 ranks -> 1 process -> 4 ranks,
# two steps each, changing the layout at every handover (--ep, --shard-embedding, --placement,
# --offload; sharded directories and whole files both). Each resumed run writes the state it
# restored before its first step (--checkpoint-at-start), in its own layout:
#  (a) merged into one file (moe-convert merge), its /params, /optim and /state are the resumed
#      checkpoint's bit for bit;
#  (b) the continued losses (and the validation losses, every 2 steps) equal those of a run that
#      kept its first layout for all 8 steps, to 1e-5 relative.
# Why (b) holds and is not bitwise: every run draws the same global batch of 8 sequences per
# step (the data cursor is global) and cuts it into the same 2 micro-batches (--grad-accum 2,
# carried over: micro-batch m is rows [4m, 4m+4) of the batch on any number of ranks, each rank
# training its share), so the objective is the same, aux loss included (the routers sum their
# loads over the ranks). What changes with R is the order of float sums: a weight's gradient is
# one GEMM over 4 rows on one process, two GEMMs of 2 rows added by the all-reduce on 2 ranks,
# and so on (MPICH's order); expert GEMMs run over other row sets; lpt / flexmoe replicas sum in
# another order. A few ulps of a gradient per step; AdamW's division by sqrt(v) amplifies them in
# small-gradient elements. Measured (AMD EPYC, OpenBLAS): at most 1e-7 relative after 1 to 3
# handovers, gpt and mixtral. With micro-batches cut per rank (before issue 18) it was 4e-5: the
# aux loss then saw other tokens on another rank count. A state one step off changes the loss by
# 2% or more.
# Also a sharded directory from 4 ranks on 3 (R' not dividing R): the carried --ep 2 and
# --shard-embedding, which do not fit 3 ranks, are refused by name with what to pass; with
# --ep 1 --shard-embedding=false it resumes, bitwise again.
# Usage: universal_resume.sh MPIEXEC MOE_TRAIN MOE_CONVERT DATA WORKDIR
set -u
mpiexec=$1 train=$2 convert=$3 data=$4 work=$5
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
# run N [flags]: moe-train on N ranks (1: no mpiexec); a constant learning rate, so the runs of
# 2 steps each follow the schedule of the 8-step one; validation every 2 steps.
run() {
  n=$1; shift
  launcher=""
  [ "$n" -gt 1 ] && launcher="$mpiexec -n $n"
  # shellcheck disable=SC2086
  timeout 120 $launcher "$train" --data "$data" --layers 2 --d-model 16 --heads 2 --d-ff 32 \
    --seq 16 --experts 4 --moe-every 1 --batch "${batch:-8}" --eval-batches 1 --threads 1 \
    --lr 0.01 --warmup 0 --min-lr-ratio 1 --log-every 1 --eval-every 2 "$@" 2>&1
}
# merged CKPT OUT: CKPT (a file or a sharded directory) as one file.
merged() {
  rm -f "$2"
  if [ -d "$1" ]; then
    "$convert" merge "$1" -o "$2" -q || fail "moe-convert merge $1"
  else
    cp "$1" "$2"
  fi
}
# same_state A B LABEL: the logical state of checkpoints A and B is the same, bit for bit.
same_state() {
  merged "$1" "$work/x.h5" && merged "$2" "$work/y.h5"
  # The same datasets of the same shapes (h5diff skips, with a warning, what it cannot compare).
  h5ls -r "$work/x.h5" > "$work/x.list" && h5ls -r "$work/y.h5" > "$work/y.list" &&
    cmp -s "$work/x.list" "$work/y.list" ||
    { diff "$work/x.list" "$work/y.list" | head; fail "$3: other datasets or shapes"; }
  for group in /params /optim; do
    h5diff "$work/x.h5" "$work/y.h5" "$group" "$group" || fail "$3: $group differs"
  done
  h5dump -A -g /state "$work/x.h5" | tail -n +2 > "$work/x.state"
  h5dump -A -g /state "$work/y.h5" | tail -n +2 > "$work/y.state"
  cmp -s "$work/x.state" "$work/y.state" ||
    { diff "$work/x.state" "$work/y.state"; fail "$3: /state differs"; }
  echo "$3: the state handed over is the checkpoint's, bitwise"
}
# losses METRICS: "<step> <loss>" per step, and "val<step> <val_loss>" per evaluation.
losses() {
  sed -n 's/.*[{,]"loss":\([-0-9.e+]*\),.*"step":\([0-9]*\).*/\2 \1/p' "$1"
  sed -n 's/.*"step":\([0-9]*\).*"val_loss":\([-0-9.e+]*\).*/val\1 \2/p' "$1"
}
# same_losses REF GOT LABEL: every step of GOT has REF's loss of that step to 1e-5 relative.
same_losses() {
  losses "$1" > "$work/ref.losses" && losses "$2" > "$work/got.losses"
  [ -s "$work/got.losses" ] || fail "$3: no losses in $2"
  awk -v label="$3" 'NR == FNR { ref[$1] = $2; next }
    { if (!($1 in ref)) { print label ": step " $1 " is not in the reference"; bad = 1; next }
      d = $2 - ref[$1]; if (d < 0) d = -d; r = d / ref[$1]
      if (r > worst) worst = r
      if (r > 1e-5) { print label ": step " $1 " loss " $2 ", kept layout " ref[$1]; bad = 1 } }
    END { printf "%s: continued losses within %.2g relative of the kept layout\n", label, worst
          exit bad }' "$work/ref.losses" "$work/got.losses" || fail "$3: losses differ"
}
# stage NAME N CKPT_IN STEPS [flags]: resume CKPT_IN on N ranks up to STEPS; checks (a).
stage() {
  name=$1 n=$2 from=$3 steps=$4; shift 4
  run "$n" --resume "$from" --steps "$steps" --checkpoint-at-start --checkpoint-every 2 \
    --metrics "$work/$name.jsonl" --out "$work/$name" "$@" > "$work/$name.log" ||
    { cat "$work/$name.log"; fail "$name: resumed run on $n ranks"; }
  start=$(sed -n 's/.*resumed from .* at step \([0-9]*\)$/\1/p' "$work/$name.log")
  [ -n "$start" ] || { cat "$work/$name.log"; fail "$name: did not resume"; }
  at=$(ls -d "$work/$name"/step-0000000"$start"* | head -n 1)
  [ -e "$at" ] || { ls "$work/$name"; fail "$name: no checkpoint at its first step boundary"; }
  same_state "$from" "$at" "$name (step $start, $(basename "$from") on $n ranks)"
}

for model in gpt mixtral; do
  case $model in
    # gpt ties its LM head to the token table: --shard-embedding needs mixtral.
    gpt)
      arch="--arch gpt --router-jitter 0.05"
      first="--ep 4" second="--ep 2 --placement lpt" third="--offload host"
      fourth="--ep 4 --placement flexmoe" ;;
    mixtral)
      arch="--arch mixtral --kv-heads 1"
      first="--ep 2 --shard-embedding" second="--ep 2 --placement flexmoe"
      third="--offload host" fourth="--ep 4 --shard-embedding" ;;
  esac
  m=$work/$model
  # The run that keeps its layout: 4 ranks, 8 steps, a checkpoint every 2; 2 micro-batches.
  # shellcheck disable=SC2086
  run 4 $arch $first --grad-accum 2 --steps 8 --checkpoint-every 2 --metrics "$m-kept.jsonl" \
    --out "$m-kept" > "$m-kept.log" || { cat "$m-kept.log"; fail "$model: 8 steps on 4 ranks"; }
  [ -d "$m-kept/step-00000002" ] || { ls "$m-kept"; fail "$model: no sharded step 2"; }
  # shellcheck disable=SC2086
  stage "$model-2" 2 "$m-kept/step-00000002" 4 $second
  # shellcheck disable=SC2086
  stage "$model-1" 1 "$(ls -d "$m-2"/step-00000004* | head -n 1)" 6 $third
  # shellcheck disable=SC2086
  stage "$model-4" 4 "$m-1/step-00000006.h5" 8 --offload none $fourth
  for n in 2 1 4; do
    same_losses "$m-kept.jsonl" "$work/$model-$n.jsonl" "$model on $n ranks"
  done
done

# A sharded directory written by 4 ranks (mixtral, --ep 2 --shard-embedding) on 3 ranks: the
# checkpoint's --ep 2 does not divide 3 and is refused by name; --ep 1 re-shards it.
from=$work/mixtral-kept/step-00000004
batch=12 run 3 --resume "$from" --steps 5 --out "$work/three" > "$work/three.log"
rc=$?
[ "$rc" -eq 2 ] && grep -q "the checkpoint's --ep 2 (it was written by 4 ranks) does not divide \
this run's 3 ranks: pass --ep N with N one of 1, 3" "$work/three.log" ||
  { cat "$work/three.log"; fail "3 ranks with the checkpoint's --ep 2: exit $rc, expected 2"; }
# ... so does its --shard-embedding (d_model 16 over 3 ranks), by name with what to pass.
batch=12 run 3 --resume "$from" --steps 5 --ep 1 --out "$work/three" > "$work/three.log"
rc=$?
[ "$rc" -eq 2 ] && grep -q "over the W = 3 ranks .*--shard-embedding=false" "$work/three.log" ||
  { cat "$work/three.log"; fail "3 ranks, the checkpoint's --shard-embedding: exit $rc"; }
batch=12 run 3 --resume "$from" --steps 4 --ep 1 --shard-embedding=false --checkpoint-at-start \
  --out "$work/three" > "$work/three.log" || { cat "$work/three.log"; fail "3 ranks, --ep 1"; }
[ -f "$work/three/step-00000004.h5" ] || { ls -R "$work/three"; fail "3 ranks: no step 4"; }
same_state "$from" "$work/three/step-00000004.h5" "4 ranks -> 3 ranks (--ep 1)"

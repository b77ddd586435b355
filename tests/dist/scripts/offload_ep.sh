#!/bin/sh
# moe-train --offload host under mpiexec -n 2 as users run it: with --ep 2 (each rank offloads its
# own experts) every rank's shard of the checkpoint holds bitwise the parameters and optimizer
# state of the same run with every expert resident, for gpt and mixtral, clipped (each expert's
# AdamW after backward) and with --clip 0 (AdamW overlapping backward); without --ep (expert
# replicas, their gradients summed by the store) the checkpoint equals the resident run's too; a
# refused setting ends the job on every rank with the reason (exit 2), no hang.
# Usage: offload_ep.sh MPIEXEC MOE_TRAIN DATA WORKDIR_PARENT
set -u
mpiexec=$1 train=$2 data=$3 parent=$4
mkdir -p "$parent" || exit 1
work=$(mktemp -d "$parent/offload-ep.XXXXXX") || exit 1  # unique: runs may overlap
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 120 "$mpiexec" -n 2 "$train" --data "$data" --layers 2 --d-model 16 --heads 2 \
  --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 8 --eval-batches 1 --threads 1 -q \
  --steps 3 "$@"; }

for model in gpt mixtral; do
  case $model in
    gpt) arch="--arch gpt --router-jitter 0.05" ;;
    mixtral) arch="--arch mixtral --kv-heads 1" ;;
  esac
  for clip in 1 0; do
    name="$model-clip$clip"
    # shellcheck disable=SC2086
    run $arch --clip "$clip" --ep 2 --out "$work/$name-resident" || fail "$name: resident run"
    # Two device slots per rank: experts are uploaded again within each pass.
    # shellcheck disable=SC2086
    run $arch --clip "$clip" --ep 2 --offload host --device-budget 12KiB \
      --out "$work/$name-host" || fail "$name: offloaded run"
    for rank in 00000 00001; do
      a="$work/$name-resident/step-00000003/rank-$rank.h5"
      b="$work/$name-host/step-00000003/rank-$rank.h5"
      [ -f "$a" ] && [ -f "$b" ] || fail "$name: rank $rank's shard is missing"
      for group in /params /optim; do
        h5diff "$a" "$b" "$group" "$group" || fail "$name: rank $rank $group differs"
      done
    done
    echo "$name: offloaded equals resident bitwise on both ranks"
  done
done

# Expert replicas (2-way data parallel, no --ep): each expert's gradient is summed over both
# ranks before the updates; the checkpoint equals the resident run's bitwise.
run --arch mixtral --kv-heads 1 --out "$work/replicas-resident" || fail "replicas: resident run"
run --arch mixtral --kv-heads 1 --offload host --out "$work/replicas-host" ||
  fail "replicas: offloaded run"
for group in /params /optim; do
  h5diff "$work/replicas-resident/step-00000003.h5" "$work/replicas-host/step-00000003.h5" \
    "$group" "$group" || fail "replicas: $group differs"
done
echo "replicas: offloaded equals resident bitwise"

# A refused setting ends the job on every rank with the reason (exit 2), no hang.
out=$(run --arch mixtral --kv-heads 1 --offload ssd --out "$work/refused" 2>&1)
rc=$?
printf '%s\nexit code %s\n' "$out" "$rc"
[ "$rc" -ne 124 ] || fail "the job hung until the timeout"
[ "$rc" -eq 2 ] || fail "expected exit 2 (a usage error)"
for rank in 0 1; do
  printf '%s' "$out" | grep -q "rank $rank: moe-train: error: --offload ssd needs --ssd-dir" ||
    fail "rank $rank does not say why"
done
[ ! -e "$work/refused/last.h5" ] && [ ! -e "$work/refused/last" ] || fail "a checkpoint was written"
rm -rf "$work"

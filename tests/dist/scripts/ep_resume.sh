#!/bin/sh
# moe-train as users run it on 4 ranks (2-way data x 2-way expert parallel, sharded embedding,
# priority scheduler): a run stopped at step 3 and resumed from its sharded checkpoint ends with
# the same parameters and optimizer state, bitwise, as the uninterrupted run; a damaged shard on
# one rank ends the whole job with a message naming the file, without a hang.
# Usage: ep_resume.sh MPIEXEC MOE_TRAIN DATA WORKDIR
set -u
mpiexec=$1 train=$2 data=$3 work=$4
rm -rf "$work" && mkdir -p "$work" || exit 1
run() { timeout 120 "$mpiexec" -n 4 "$train" --data "$data" --arch mixtral --layers 2 --d-model 16 \
  --heads 2 --kv-heads 1 --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 8 --eval-batches 1 \
  --threads 1 -q --ep 2 --shard-embedding --comm-scheduler priority --partition-mb 0.01 "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

run --out "$work/straight" --steps 6 || fail "uninterrupted run"
run --out "$work/split" --steps 6 --checkpoint-every 3 || fail "run with checkpoints"
rm -rf "$work/split/step-00000006"
run --out "$work/split" --steps 6 --resume "$work/split/step-00000003" || fail "resumed run"
for f in "$work"/straight/step-00000006/rank-*.h5; do
  name=$(basename "$f")
  for group in /params /optim; do
    h5diff "$f" "$work/split/step-00000006/$name" "$group" "$group" ||
      fail "$name $group differs after resume"
  done
done
echo "resumed run equals the uninterrupted one bitwise ($(ls "$work/straight/step-00000006" | wc -l) shard files)"

# A damaged shard on one rank: rank 3 (expert rank 1) reads rank-00001.h5.
head -c 1000 "$work/split/step-00000003/rank-00001.h5" > "$work/bad.h5"
mv "$work/bad.h5" "$work/split/step-00000003/rank-00001.h5"
start=$(date +%s)
out=$(run --out "$work/split" --steps 6 --resume "$work/split/step-00000003" 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
printf '%s\nexit code %s after %s s\n' "$out" "$rc" "$took"
[ "$rc" -ne 0 ] || fail "a damaged shard was accepted"
[ "$rc" -ne 124 ] || fail "the job hung until the timeout"
printf '%s' "$out" | grep -q "rank-00001.h5" || fail "the message does not name the damaged file"
echo "damaged shard: every rank ended (exit $rc) in ${took} s"

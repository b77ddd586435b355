#!/bin/sh
# moe-train --zero 3 as users run it on 2 ranks (--ep 2, so the checkpoint is a sharded
# directory): it writes the checkpoint --zero 0 writes (bitwise: 2 ranks add each gradient
# element once), a run stopped at step 2 and resumed ends bitwise as the uninterrupted one, and
# the step-2 checkpoint, merged into one file, resumes under --zero 1 on 4 ranks and --zero 0 in
# one process.
# Usage: zero_resume.sh MPIEXEC MOE_TRAIN DATA WORKDIR
set -u
mpiexec=$1 train=$2 data=$3 work=$4
rm -rf "$work" && mkdir -p "$work" || exit 1
run() { n=$1; shift; timeout 120 "$mpiexec" -n "$n" "$train" --data "$data" --arch mixtral \
  --layers 2 --d-model 16 --heads 2 --kv-heads 1 --d-ff 32 --seq 16 --experts 4 --moe-every 1 \
  --batch 8 --eval-batches 1 --threads 1 -q "$@"; }
fail() { echo "FAIL: $*"; exit 1; }
same() {  # two checkpoint directories' tensors, bitwise
  for f in "$1"/rank-*.h5; do
    for group in /params /optim; do
      h5diff "$f" "$2/$(basename "$f")" "$group" "$group" || fail "$3: $(basename "$f") $group"
    done
  done
}

run 2 --ep 2 --zero 3 --out "$work/straight" --steps 4 --checkpoint-every 2 || fail "--zero 3 run"
run 2 --ep 2 --zero 0 --out "$work/plain" --steps 2 || fail "--zero 0 run"
same "$work/plain/step-00000002" "$work/straight/step-00000002" "--zero 3 wrote another file"
echo "--zero 3 writes the checkpoint --zero 0 writes"
run 2 --ep 2 --zero 3 --out "$work/split" --steps 4 --checkpoint-every 2 --resume \
  "$work/straight/step-00000002" || fail "resumed run"
same "$work/straight/step-00000004" "$work/split/step-00000004" "resumed at the same layout"
echo "the resumed --zero 3 run equals the uninterrupted one bitwise"
# Another world size reads a sharded directory merged into one file (moe-convert merge).
"$(dirname "$train")/moe-convert" merge "$work/straight/step-00000002" -o "$work/merged.h5" ||
  fail "moe-convert merge"
run 4 --ep 2 --zero 1 --out "$work/four" --steps 3 --resume "$work/merged.h5" ||
  fail "--zero 1 on 4 ranks did not resume it"
run 1 --zero 0 --out "$work/one" --steps 3 --resume "$work/merged.h5" ||
  fail "one process did not resume it"
[ -e "$work/four/step-00000003" ] && [ -e "$work/one/step-00000003.h5" ] ||
  fail "the resumed runs wrote no step-3 checkpoint"
echo "the --zero 3 checkpoint (merged) resumed under --zero 1 on 4 ranks and in one process"

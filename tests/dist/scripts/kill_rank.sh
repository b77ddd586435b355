#!/bin/sh
# A rank that dies without a word (SIGKILL, as the OOM killer does) ends the whole moe-train job
# with a non-zero exit and a message, within seconds, instead of leaving the others waiting in a
# collective. Further arguments are moe-train flags for the job (e.g. --placement flexmoe with
# --checkpoint-every: the kill may then land amid replans and saves); the run's last checkpoint,
# when it wrote one, must still pass `moe-convert inspect --verify` (moe-convert beside MOE_TRAIN).
# Usage: [EP=2] kill_rank.sh MPIEXEC MOE_TRAIN DATA WORKDIR [MOE_TRAIN_FLAGS...]
set -u
mpiexec=$1 train=$2 data=$3 work=$4
shift 4
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
timeout 120 "$mpiexec" -n 4 "$train" --data "$data" --layers 2 --d-model 32 --heads 2 --d-ff 64 \
  --seq 32 --experts 4 --moe-every 1 --batch 8 --steps 100000 --threads 1 --ep "${EP:-2}" \
  --metrics "$work/metrics.jsonl" --log-every 1 --out "$work/run" "$@" > "$work/out.txt" 2>&1 &
job=$!
# Wait until training runs (a step's metrics line appears), at most 60 s.
i=0
while ! grep -q '"loss"' "$work/metrics.jsonl" 2>/dev/null; do
  i=$((i + 1)); [ $i -le 600 ] || { kill $job; fail "training did not start"; }
  kill -0 $job 2>/dev/null || { cat "$work/out.txt"; fail "the job ended before training"; }
  sleep 0.1
done
# One rank of this job (other tests may run beside it): timeout -> mpiexec -> proxy -> ranks.
launcher=$(pgrep -P "$job" | head -1)
proxy=$(pgrep -P "$launcher" | head -1)
victim=$(pgrep -P "$proxy" | sed -n 2p)
[ -n "$victim" ] || { kill $job; fail "no rank process found"; }
start=$(date +%s)
kill -9 "$victim"
wait $job
rc=$?
took=$(( $(date +%s) - start ))
cat "$work/out.txt"
echo "exit code $rc, $took s after the kill"
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$rc" -ne 124 ] || fail "the job hung until the timeout"
[ "$took" -le 20 ] || fail "the job took $took s to end"
# Hydra names the dead process ("BAD TERMINATION ... EXIT CODE: 9"); which signal its closing
# line reports depends on which rank noticed first (the killed one, or a peer that lost it).
grep -q "BAD TERMINATION" "$work/out.txt" || fail "no message about the dead rank"
echo "a killed rank ended the job (exit $rc) in $took s"
# Checkpoints are written atomically (io::AtomicFile): the newest one stays whole.
if [ -e "$work/run/last.h5" ] || [ -e "$work/run/last" ]; then
  "$(dirname "$train")/moe-convert" inspect --verify "$work/run" > "$work/inspect.txt" 2>&1 ||
    { cat "$work/inspect.txt"; fail "the last checkpoint does not verify"; }
  echo "the last checkpoint ($(readlink "$work/run/last.h5" || readlink "$work/run/last")) verifies"
fi

#!/usr/bin/env bash
# Training and generation on a CPU shared with other work (issue 47): each program's tokens/s on
# a quiet machine and beside one CPU-bound process started in a session of its own (`setsid`, as a
# program started in another terminal is: the kernel's autogroup then gives each session an equal
# share of the CPU, so a 2-core machine leaves the run one core). moe's tools run as shipped
# (idle OpenMP threads spin 1,000 polls: tools/common/omp_wait.h; decode on the task pool:
# backend/cpu/task_pool.h), with a longer spin (GOMP_SPINCOUNT=10000, training only), and with
# GNU OpenMP's own default (GOMP_SPINCOUNT=300000, what the tools ran with before). Both also run
# with the same 1,000 polls on OpenMP loops instead of the task pool (decode's GEMVs, every
# sgemm's tiles): OMP_WAIT_POLICY=active picks the loops, and libgomp lets GOMP_SPINCOUNT decide
# how long its threads spin (the path the tools took before the pool was chosen for short spins). PyTorch eager trains the same
# model (bench/train_torch.py), with the faster of its two OpenMP wait policies. Rounds alternate
# quiet and busy, and within a round the settings take turns, so a drift of the machine's speed
# hits all. Generation's tokens/s is moe-infer's own (decode only: the model's loading is not
# timed). Prints one table; the targets are busy/quiet >= 0.40 (0.5 is the fair share of 2
# cores) and moe/torch >= 1.2 under the neighbour.
#
#   bench/contention.sh [--bin DIR] [--rounds R] [--steps S] [--new N] [--python PY]
#
# The torch rows need python3 with torch (not a project dependency; without it they read -).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin rounds=2 steps=30 warmup=5 new=200 python=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --new) new=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    *) echo "contention.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin/moe-train" ] || { echo "contention.sh: no $bin/moe-train (build first)" >&2; exit 2; }
have_torch=1
"$python" -c 'import torch' 2>/dev/null || have_torch=0
work=$(mktemp -d)
neighbour=""
stop_neighbour() { [ -n "$neighbour" ] && kill "$neighbour" 2>/dev/null; neighbour=""; }
trap 'stop_neighbour; rm -rf "$work"' EXIT
scripts/corpus "$work/corpus.txt" >/dev/null
unset OMP_WAIT_POLICY GOMP_SPINCOUNT  # the tools' own default is what is measured

# moe-train's median tokens/s after the warm-up steps; $1 names the run, the rest is the env.
train_rate() {
  local name=$1; shift
  rm -rf "$work/run" "$work/m.jsonl"
  env "$@" "$bin/moe-train" --data "$work/corpus.txt" --out "$work/run" --steps $((steps + warmup)) \
    --eval-every 0 --eval-batches 1 --log-every 1 --metrics "$work/m.jsonl" --threads 2 -q \
    --router-center-rate 0  # plain routers, as bench/train_torch.py builds them
  "$python" - "$work/m.jsonl" "$warmup" <<'PY'
import json, statistics, sys
r = [j["tokens_per_s"] for j in map(json.loads, open(sys.argv[1])) if j["step"] > int(sys.argv[2])]
print(round(statistics.median(r)))
PY
}
# moe-infer generate's own tokens/s (decode, load excluded) for 8 prompts of $new new tokens;
# the arguments are the environment.
generate_rate() {
  env "$@" "$bin/moe-infer" generate --model "$work/model.h5" --prompts "$work/prompts.txt" \
    --max-new "$new" --threads 2 2>&1 >/dev/null |
    sed -n 's/^moe-infer generate: .*, \([0-9.]*\) tokens\/s$/\1/p' | cut -d. -f1
}
torch_rate() {
  [ $have_torch = 1 ] || { echo -; return; }
  local best=0 r
  for policy in given passive; do
    r=$( (if [ $policy = passive ]; then export OMP_WAIT_POLICY=passive; fi
          OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 "$python" bench/train_torch.py \
            --data "$work/corpus.txt" --threads 2 --steps "$steps" --warmup "$warmup") |
         "$python" -c 'import json,sys; print(round(json.load(sys.stdin)["tokens_per_s"]))')
    best=$("$python" -c "print(max($best, $r))")
  done
  echo "$best"
}
# A small trained model for generation (the demo's shape, 20 steps).
"$bin/moe-train" --data "$work/corpus.txt" --out "$work/gen" --steps 20 --eval-every 0 -q
cp "$work/gen/last.h5" "$work/model.h5"
printf '%s\n' 'The meaning of life is' 'Once upon a time' 'In the beginning' 'A computer is' \
  'The best way to' 'Never trust a' 'Tomorrow we will' 'My favourite program' >"$work/prompts.txt"

declare -A sum count
record() { sum[$1]=$(( ${sum[$1]:-0} + $2 )); count[$1]=$(( ${count[$1]:-0} + 1 )); }
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; demo model, 2 threads"
echo "# neighbour: setsid $python -c 'while True: pass'; torch: $([ $have_torch = 1 ] && "$python" -c 'import torch; print(torch.__version__)' || echo 'not installed')"
for r in $(seq 1 "$rounds"); do
  for state in quiet busy; do
    if [ $state = busy ]; then
      setsid "$python" -c 'while True: pass' &
      neighbour=$!
      sleep 1
    fi
    t_new=$(train_rate new); t_loops=$(train_rate loops GOMP_SPINCOUNT=1000 OMP_WAIT_POLICY=active)
    t_long=$(train_rate long GOMP_SPINCOUNT=10000)
    t_old=$(train_rate old GOMP_SPINCOUNT=300000)
    g_new=$(generate_rate); g_loops=$(generate_rate GOMP_SPINCOUNT=1000 OMP_WAIT_POLICY=active)
    g_old=$(generate_rate GOMP_SPINCOUNT=300000)
    t_torch=$(torch_rate)
    stop_neighbour
    echo "# round $r $state: train $t_new (loops: $t_loops, spin 10000: $t_long, 300000: $t_old)," \
      "torch $t_torch;" \
      "generate $g_new (loops: $g_loops, spin 300000: $g_old)"
    record "train_new_$state" "$t_new"; record "train_loops_$state" "$t_loops"
    record "train_long_$state" "$t_long"
    record "train_old_$state" "$t_old"
    record "gen_new_$state" "$g_new"; record "gen_loops_$state" "$g_loops"
    record "gen_old_$state" "$g_old"
    [ "$t_torch" = - ] || record "torch_$state" "$t_torch"
  done
done
mean() { [ -n "${count[$1]:-}" ] && echo $(( sum[$1] / count[$1] )) || echo -; }
ratio() { [ "$1" = - ] || [ "$2" = - ] && echo - || "$python" -c "print(f'{$1 / $2:.2f}')"; }
printf '\n| %-56s | %8s | %8s | %10s | %12s |\n' "program (tokens/s, mean of $rounds)" quiet busy busy/quiet "busy vs torch"
printf '|%s|%s|%s|%s|%s|\n' ---------------------------------------------------------- ---------: ---------: -----------: -------------:
for row in "moe-train (GEMM tiles on the pool):train_new" \
           "moe-train, OpenMP loops (1,000 polls, active):train_loops" \
           "moe-train, GOMP_SPINCOUNT=10000:train_long" \
           "moe-train, GOMP_SPINCOUNT=300000:train_old" "torch eager:torch" \
           "moe-infer generate ($new new tokens x 8, the pool):gen_new" \
           "moe-infer generate, OpenMP loops (1,000 polls, active):gen_loops" \
           "moe-infer generate, GOMP_SPINCOUNT=300000:gen_old"; do
  label=${row%%:*} key=${row#*:}
  q=$(mean "${key}_quiet") b=$(mean "${key}_busy")
  vs=-
  case $key in train_*) vs=$(ratio "$b" "$(mean torch_busy)") ;; esac
  printf '| %-56s | %8s | %8s | %10s | %12s |\n' "$label" "$q" "$b" "$(ratio "$b" "$q")" "$vs"
done

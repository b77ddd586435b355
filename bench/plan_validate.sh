#!/usr/bin/env bash
# moe-plan against the clock (issue 48): trains real configurations on this machine with
# moe-train, predicts each with `moe-plan predict` from a `moe-plan calibrate` of the same
# machine, and prints a markdown table of predicted against measured step time and peak memory
# with the median and worst error.
#   configurations  two model sizes (S: gpt, 2 MoE layers of 4 experts, d_model 64; L: 4 MoE
#                   layers of 8 experts, d_model 128), 1 and 2 ranks (mpiexec), flat and
#                   hierarchical all-to-all (virtual nodes of one rank), ZeRO 0/1/3, offload
#                   none/host/ssd, placement static/lpt/flexmoe, the priority scheduler on and
#                   off: 16 runs
#   measured time   the median of moe-train's per-step seconds (--metrics step_seconds, rank 0's;
#                   one rank: batch x seq / tokens_per_s) over the steps after the first two
#   measured memory in a second, shorter run of the same configuration (3 steps), each rank's
#                   peak anonymous resident memory (RssAnon of /proc/PID/status, sampled every
#                   0.5 ms by a wrapper around the rank until the last step's metrics line: the
#                   final checkpoint's save is not a step), the largest rank's, less the same of a
#                   minimal moe-train run on as many ranks (MPI, the runtime's own buffers, the
#                   data: what moe-plan does not model); both are printed. Anonymous, not the
#                   whole RSS: ~235 MiB of every process is the shared libraries' pages (CUDA,
#                   BLAS, MPI), of which each run touches a few MiB more or less, as much as a
#                   small model's whole state (the peak RSS differed by 15 MiB between two runs
#                   of the same model); RssAnon repeats within 0.1 MiB
#   predicted       moe-plan predict's step and device need per device (device_kind cpu: one
#                   pool) for the same layout, seq and batch (moe-train's --batch / ranks: its
#                   batch is the step's, moe-plan's one rank's), with the routing trace the 1-rank
#                   run of the same size recorded (--trace), from the run's own checkpoint
#   error           predicted / measured - 1
# Each rank runs one thread (OMP_NUM_THREADS=1, --threads 1), as calibrate measures one.
# Usage: bench/plan_validate.sh [BUILD_DIR] (default build). STEPS=12 (steps per run),
# QUICK=1 (calibrate --quick and 6 steps: the reduced setting), WORK=run/bench-plan-validate,
# ONLY="S-1r L-2r-ep2" (run only these names; the 1-rank run of each size always runs first).
# Needs mpiexec and python3. On a machine shared with other work the measured times are noisy:
# say so beside the numbers.
set -euo pipefail
bin=${1:-build}/bin
work=${WORK:-run/bench-plan-validate}
quick=${QUICK:-}
steps=${STEPS:-$([ -n "$quick" ] && echo 6 || echo 12)}
only=${ONLY:-}
data=/usr/share/games/fortunes/linux
export OMP_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work"

model_S="--layers 2 --d-model 64 --heads 4 --d-ff 256 --experts 4 --seq 32 --batch 8"
model_L="--layers 4 --d-model 128 --heads 4 --d-ff 512 --experts 8 --seq 64 --batch 8"
minimal="--layers 1 --d-model 8 --heads 1 --d-ff 8 --experts 2 --seq 8 --batch 2"
common="--data $data --moe-every 1 --threads 1 --log-every 1 --eval-batches 1 -q"

# name ranks size layout moe-train-flags: the layout in moe-plan's words, the same in moe-train's
configs=(
  "S-1r 1 S ep=1 "
  "S-1r-host 1 S ep=1,offload=host --offload host"
  "S-2r-dp 2 S ep=1,dp=2 --ep 1"
  "S-2r-ep2 2 S ep=2 --ep 2"
  "S-2r-ep2-hier 2 S ep=2,a2a=hierarchical --ep 2 --a2a hierarchical --ranks-per-node 1"
  "S-2r-ep2-zero1 2 S ep=2,zero=1 --ep 2 --zero 1"
  "S-2r-ep2-zero3 2 S ep=2,zero=3 --ep 2 --zero 3"
  "S-2r-ep2-lpt 2 S ep=2,placement=lpt --ep 2 --placement lpt"
  "S-2r-ep2-prio 2 S ep=2,scheduler=priority --ep 2 --comm-scheduler priority"
  "S-2r-ep2-host 2 S ep=2,offload=host --ep 2 --offload host"
  "S-2r-ep2-flexmoe 2 S ep=2,placement=flexmoe --ep 2 --placement flexmoe"
  "S-1r-ssd 1 S ep=1,offload=ssd --offload ssd --ssd-dir WORK/ssd"
  "L-1r 1 L ep=1 "
  "L-1r-host 1 L ep=1,offload=host --offload host"
  "L-2r-ep2 2 L ep=2 --ep 2"
  "L-2r-ep2-zero3-lpt 2 L ep=2,zero=3,placement=lpt --ep 2 --zero 3 --placement lpt"
)

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# moe-plan predict against moe-train on this machine${quick:+ (reduced: QUICK=1)}"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(getconf _NPROCESSORS_ONLN) online" \
  "cores, load $(cut -d' ' -f1-3 /proc/loadavg); $steps steps a run, 1 thread a rank"

echo "calibrating (mpiexec -n 2 moe-plan calibrate${quick:+ --quick})" >&2
mpiexec -n 2 "$bin/moe-plan" calibrate ${quick:+--quick} -o "$work/machine.toml" \
  --scratch "$work" 2> "$work/calibrate.log" || { tail -5 "$work/calibrate.log" >&2; exit 1; }

# What the predictions rest on, beside the table (a loaded machine calibrates differently each time).
calibrated() { sed -n "/^\[$1\]/,/^\[/s/^$2 = \"\([^\"]*\)\".*/\1/p" "$work/machine.toml" | head -1; }
echo "# calibrated: f32 GEMM $(calibrated compute f32), all-to-all $(calibrated bandwidth intra_node)" \
  "and $(calibrated latency intra_node) a message between the 2 ranks; non-GEMM overhead" \
  "$(calibrated overhead per_step) a step, $(calibrated overhead per_layer) a layer," \
  "activations at $(calibrated overhead elementwise)"

# The calibrated spec with `nodes` x `devices_per_node` (one machine: every link is the one
# calibrate measured inside the node).
cluster_for() {
  python3 - "$work/machine.toml" "$1" "$2" > "$work/cluster-$1x$2.toml" <<'EOF'
import re, sys
text, nodes, per = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
text = re.sub(r"(?m)^nodes = \d+", f"nodes = {nodes}", text)
text = re.sub(r"(?m)^devices_per_node = \d+", f"devices_per_node = {per}", text)
for table in ("bandwidth", "latency"):
    block = re.search(rf"(?ms)^\[{table}\]\n(.*?)(?=^\[|\Z)", text)
    intra = re.search(r'(?m)^intra_node = ("[^"]*")', block.group(1)).group(1)
    body = re.sub(r'(?m)^inter_node = "[^"]*"', f"inter_node = {intra}", block.group(1))
    text = text[:block.start(1)] + body + text[block.end(1):]
print(text, end="")
EOF
  echo "$work/cluster-$1x$2.toml"
}

# Runs each rank of a command under mpiexec with its anonymous resident memory sampled until the
# metrics file STOP_FILE holds the line of step STOP_STEP (the final checkpoint's save, which is
# not a training step, comes after it); writes "<peak RssAnon KiB> <VmHWM KiB>" into
# DIR/peak.<rank>.
cat > "$work/anon_peak.py" <<'EOF'
import os, subprocess, sys, time
out_dir, stop_file, stop_step, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
child = subprocess.Popen(cmd, close_fds=False)  # the launcher's PMI descriptor stays open
path, anon, hwm, seen = f"/proc/{child.pid}/status", 0, 0, -1
while child.poll() is None:
    try:
        size = os.path.getsize(stop_file) if os.path.exists(stop_file) else 0
        if size != seen:
            seen = size
            with open(stop_file) as f:
                if f'"step":{stop_step},' in f.read():
                    break
    except OSError:
        pass
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = max(anon, int(line.split()[1]))
                elif line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]))
    except (OSError, ValueError):
        pass
    time.sleep(0.0005)
with open(os.path.join(out_dir, f"peak.{os.environ.get('PMI_RANK', '0')}"), "w") as f:
    f.write(f"{anon} {hwm}\n")
sys.exit(child.wait())
EOF

# The largest rank's peak RssAnon (KiB) of moe-train on `ranks` ranks with the remaining flags;
# `dir` holds its output, log and peaks.
anon_peak() {
  local dir=$1 ranks=$2 steps=$3
  shift 3
  rm -rf "$dir" && mkdir -p "$dir"
  mpiexec -n "$ranks" python3 "$work/anon_peak.py" "$dir" "$dir/metrics.jsonl" "$steps" \
    "$bin/moe-train" $common "$@" --steps "$steps" --metrics "$dir/metrics.jsonl" \
    --out "$dir/out" > /dev/null 2> "$dir/log" || { tail -5 "$dir/log" >&2; exit 1; }
  cat "$dir"/peak.* | sort -n | tail -1 | cut -d' ' -f1
}

# What every run holds besides the model: a minimal run's peak on `ranks` ranks.
baseline() { anon_peak "$work/base-$1" "$1" 2 $minimal; }
base_1=$(baseline 1)
base_2=$(baseline 2)

rows="$work/rows.tsv"
: > "$rows"
for config in "${configs[@]}"; do
  read -r name ranks size layout flags <<< "$config"
  flags=${flags//WORK/$work}
  case $name in ?-1r) ;; *) if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then continue; fi ;; esac
  model_flags=model_$size
  trace_flags=
  [ "$name" = "$size-1r" ] && trace_flags="--trace $work/trace-$size.h5"
  echo "running $name ($ranks ranks: $layout)" >&2
  mpiexec -n "$ranks" "$bin/moe-train" $common \
    ${!model_flags} --steps "$steps" --metrics "$work/$name.jsonl" --out "$work/$name" \
    $trace_flags $flags 2> "$work/$name.log" || { tail -5 "$work/$name.log" >&2; exit 1; }
  # memory: a second run of 3 steps under the sampler (it would slow the timed run)
  mem_flags=${flags//$work/$work/mem-$name}
  peak=$(anon_peak "$work/mem-$name" "$ranks" 3 ${!model_flags} $mem_flags)
  nodes=1 per=$ranks
  case $layout in *hierarchical*) nodes=$ranks per=1 ;; esac
  cluster=$(cluster_for "$nodes" "$per")
  seq=$(echo "${!model_flags}" | sed 's/.*--seq \([0-9]*\).*/\1/')
  # moe-train's --batch is the step's, shared by the ranks; moe-plan's is one rank's
  batch=$(( $(echo "${!model_flags}" | sed 's/.*--batch \([0-9]*\).*/\1/') / ranks ))
  "$bin/moe-plan" predict --model "$work/$size-1r/last.h5" --trace "$work/trace-$size.h5" \
    --cluster "$cluster" --layout "$layout" --batch "$batch" --seq "$seq" --json \
    > "$work/$name.predict.json" 2> "$work/$name.predict.log" ||
    { cat "$work/$name.predict.log" >&2; exit 1; }
  base=$base_1
  [ "$ranks" = 2 ] && base=$base_2
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$layout" "$((batch * seq))" "$peak" \
    "$base" "$ranks" >> "$rows"
done

python3 - "$work" "$rows" <<'EOF'
import json, statistics, sys

work, rows = sys.argv[1], sys.argv[2]

def measured_step(name, tokens):
    steps = [json.loads(line) for line in open(f"{work}/{name}.jsonl") if line.strip()]
    steps = [s for s in steps if "loss" in s and s["step"] > 2]
    if not steps:
        raise SystemExit(f"{name}: no step after the first two in its metrics")
    if "step_seconds" in steps[0]:
        return statistics.median(s["step_seconds"] for s in steps)
    return statistics.median(tokens / s["tokens_per_s"] for s in steps)

print()
print("| run | layout | step predicted (ms) | of it non-GEMM (ms) | measured (ms) | error "
      "| memory predicted (MiB) | peak RssAnon (MiB) | less minimal run (MiB) | error |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
time_errors, memory_errors = [], []
for line in open(rows):
    name, layout, tokens, rss_kib, base_kib, ranks = line.rstrip("\n").split("\t")
    p = json.load(open(f"{work}/{name}.predict.json"))
    predicted_s = p["time"]["step_s"]
    predicted_b = p["tiers"]["device"]["need_bytes"]
    step = measured_step(name, float(tokens))
    rss, net = int(rss_kib) * 1024, (int(rss_kib) - int(base_kib)) * 1024
    t_err = predicted_s / step - 1
    m_err = predicted_b / net - 1 if net > 0 else None  # below the minimal run: noise
    time_errors.append(abs(t_err))
    if net > 0:
        memory_errors.append(abs(m_err))
    mib = 1 << 20
    print(f"| {name} | {layout} | {predicted_s * 1e3:.1f} | {p['time']['non_gemm_s'] * 1e3:.1f} "
          f"| {step * 1e3:.1f} | {t_err:+.0%} "
          f"| {predicted_b / mib:.1f} | {rss / mib:.1f} | {net / mib:.1f} "
          f"| {'-' if m_err is None else f'{m_err:+.0%}'} |")
print()
print(f"step time: median |error| {statistics.median(time_errors):.0%}, worst {max(time_errors):.0%} "
      f"over {len(time_errors)} runs")
if memory_errors:
    print(f"peak memory (less the minimal run): median |error| "
          f"{statistics.median(memory_errors):.0%}, worst {max(memory_errors):.0%}")
EOF

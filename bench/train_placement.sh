#!/usr/bin/env bash
# Expert placement while training (issue 17): trains the same skewed workload (a 4-layer MoE of 8
# experts per layer WITHOUT the aux loss, so routing collapses onto a few experts, as it does in
# many trained MoEs) under `moe-train --placement static|lpt|flexmoe` on 2 and 4 ranks (--ep =
# ranks), and prints a markdown table per rank count from each run's --metrics:
#   balance   median over steps of the step's rank balance ratio (FlexMoE's eq. 6: max/mean over
#             the expert ranks of the rows each computed, averaged over the MoE layers); 1.00 is
#             perfect balance and the machine-independent result
#   worst     the largest such per-step ratio
#   step      median step_seconds (rank 0's) and its ratio to static's, with the medians of
#             a2a_seconds and grad_sync_seconds: indicative only when the ranks share cores
#   replans   replan actions logged (one per MoE layer replanned), the state copies made and their
#             copy time, predicted (state bytes / profiled bandwidth) and measured (rank 0)
# and per flexmoe run a line with the replans' predicted layer step before -> after (the cost
# model's), the balance before -> after, and the measured median step before -> after the
# replan steps (the --replan-every steps on either side).
# Usage: bench/train_placement.sh [BUILD_DIR] (default build); STEPS=100 RANKS="2 4"
# POLICIES="static lpt flexmoe" REPLAN_EVERY=10 override; WORK=run/bench-train-placement. Needs
# mpiexec and python3 (scripts/setup installs it, with python3-h5py).
set -euo pipefail
bin=${1:-build}/bin
work=${WORK:-run/bench-train-placement}
steps=${STEPS:-100} replan_every=${REPLAN_EVERY:-10}
ranks_list=${RANKS:-2 4} policies=${POLICIES:-static lpt flexmoe}
data=/usr/share/games/fortunes/linux
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# moe-train --placement on a skewed workload (--aux-loss-coef 0)"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(getconf _NPROCESSORS_ONLN) online cores, 1 thread per rank"
echo "# model: gpt, 4 layers (all MoE), d_model 128, d_ff 512, 8 experts top-2, seq 64, batch 16;" \
  "$steps steps on $data; flexmoe: --replan-every $replan_every, default threshold and V"
for n in $ranks_list; do
  for p in $policies; do
    echo "running $p on $n ranks" >&2
    mpiexec -n "$n" "$bin/moe-train" --data "$data" --layers 4 --d-model 128 --heads 4 \
      --d-ff 512 --seq 64 --experts 8 --moe-every 1 --batch 16 --steps "$steps" \
      --aux-loss-coef 0 --threads 1 --ep "$n" --placement "$p" --replan-every "$replan_every" \
      --log-every 1 --metrics "$work/$p-$n.jsonl" --out "$work/$p-$n" 2> "$work/$p-$n.log" ||
      { tail -5 "$work/$p-$n.log" >&2; exit 1; }
  done
done

python3 - "$work" "$replan_every" "$ranks_list" "$policies" <<'EOF'
import json, statistics, sys

work, replan_every = sys.argv[1], int(sys.argv[2])
ranks_list, policies = sys.argv[3].split(), sys.argv[4].split()

def load(path):
    steps, replans = {}, []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "replan" in rec:
                replans.append((rec["step"], rec["replan"]))
            elif "rank_load_max_over_mean" in rec:
                steps[rec["step"]] = rec
    return steps, replans

for n in ranks_list:
    runs = {p: load(f"{work}/{p}-{n}.jsonl") for p in policies}
    print()
    print(f"{n} ranks (--ep {n}):")
    print()
    print("| placement | balance (median) | worst step | expert load (median) | step (median, ms) "
          "| vs static | a2a (ms) | grad sync (ms) | replans | copies | adjustment predicted / "
          "measured (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    static_step = None
    if "static" in runs:
        static_step = statistics.median(s["step_seconds"] for s in runs["static"][0].values())
    for p, (steps, replans) in runs.items():
        balance = [statistics.mean(s["rank_load_max_over_mean"]) for s in steps.values()]
        expert = [statistics.mean(s["expert_load_max_over_mean"]) for s in steps.values()]
        step = statistics.median(s["step_seconds"] for s in steps.values())
        vs = f"{step / static_step:.2f}" if static_step else "-"
        a2a = statistics.median(s["a2a_seconds"] for s in steps.values())
        sync = statistics.median(s["grad_sync_seconds"] for s in steps.values())
        adjust = sum(r["adjustment_s"] for _, r in replans) * 1e3
        measured = sum(r.get("measured_adjustment_s", 0) for _, r in replans) * 1e3
        copies = sum(r.get("copies", 0) for _, r in replans)
        print(f"| {p} | {statistics.median(balance):.3f} | {max(balance):.3f} "
              f"| {statistics.median(expert):.2f} | {step * 1e3:.1f} | {vs} | {a2a * 1e3:.1f} "
              f"| {sync * 1e3:.1f} | {len(replans)} | {copies} | {adjust:.3f} / {measured:.3f} |")
    for p, (steps, replans) in runs.items():
        if not replans:
            continue
        before = [r["predicted_before_s"] * 1e3 for _, r in replans]
        after = [r["predicted_after_s"] * 1e3 for _, r in replans]
        bal_before = [r["balance_before"] for _, r in replans]
        bal_after = [r["balance_after"] for _, r in replans]
        # The measured step around each replan step: the --replan-every steps up to it (the plan
        # it replaced) and after it (the new plan).
        measured_before, measured_after = [], []
        for at in sorted({s for s, _ in replans}):
            b = [steps[s]["step_seconds"] for s in range(at - replan_every + 1, at + 1) if s in steps]
            a = [steps[s]["step_seconds"] for s in range(at + 1, at + replan_every + 1) if s in steps]
            if b and a:
                measured_before.append(statistics.median(b) * 1e3)
                measured_after.append(statistics.median(a) * 1e3)
        line = (f"\n{p}, {n} ranks: {len(replans)} replans at steps "
                f"{','.join(str(s) for s in sorted({s for s, _ in replans}))}; predicted layer step "
                f"(median over replans) {statistics.median(before):.2f} -> "
                f"{statistics.median(after):.2f} ms (sum {sum(before):.2f} -> {sum(after):.2f} ms); "
                f"layer balance {statistics.median(bal_before):.2f} -> "
                f"{statistics.median(bal_after):.2f}")
        if measured_before:
            line += (f"; measured step (median of the {replan_every} steps before -> after, over "
                     f"{len(measured_before)} replan steps) {statistics.median(measured_before):.1f}"
                     f" -> {statistics.median(measured_after):.1f} ms")
        print(line)
    # The cost model against the clock: per step and MoE layer, the slowest expert rank's time
    # from dispatch to combine (forward + backward) against the model's estimate for the same
    # tokens and map (the estimate also holds the replica sync, which the measured span does not).
    for p, (steps, _) in runs.items():
        errors = []
        for rec in steps.values():
            for pred, meas in zip(rec.get("moe_predicted_seconds", []), rec.get("moe_seconds", [])):
                if meas > 0:
                    errors.append(abs(pred - meas) / meas)
        if errors:
            errors.sort()
            print(f"{p}, {n} ranks: cost model vs measured MoE layer time over {len(errors)} "
                  f"layer-steps: median error {statistics.median(errors) * 100:.1f}%, "
                  f"90th percentile {errors[int(0.9 * (len(errors) - 1))] * 100:.1f}%, "
                  f"worst {errors[-1] * 100:.1f}%")
EOF

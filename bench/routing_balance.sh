#!/usr/bin/env bash
# Routing balance over training (issue 20): trains the README's demo model (d_model 128, d_ff 512,
# 4 layers, MoE every 2nd, batch 16 x 128 tokens) and a d_model 512 model (d_ff 2048, 4 layers all
# MoE; batch 4 x 32 tokens so that 300 steps fit a 2-core machine) in both flavours, 8 experts
# top-2, default flags otherwise, on the demo corpus, and prints a markdown table per run:
#   load   the worst MoE layer's max/mean expert load (before capacity) at step 1 (the
#          initialisation) and every 25 steps; 4.00 = every token on the same 2 of 8 experts
#   mean   that value averaged over all steps after the first 25; "steps at 3.5+": how many of
#          all the steps had it at 3.5 or more (collapsed or nearly)
#   loss   the last step's training loss and the validation loss at the end
# Usage: bench/routing_balance.sh [BUILD_DIR] (default build); STEPS=300, THREADS=2,
# FLAGS="--aux-loss-coef 0.01" (the previous default, less the router's previous init) and
# CONFIGS="demo-gpt demo-mixtral d512-gpt d512-mixtral" override; WORK=run/bench-routing. Needs
# python3 and the fortunes corpus (scripts/setup installs both).
# Aux-loss-free balancing (issue 21) against the aux loss, the same steps and seed:
#   WORK=run/bench-aux bench/routing_balance.sh
#   WORK=run/bench-free FLAGS="--router sigmoid --balance-bias-rate 0.01 --aux-loss-coef 0" \
#     bench/routing_balance.sh
# Each table's row is labelled with its FLAGS; "mean 26+ (all layers)" averages every MoE layer's
# max/mean (not only the worst one's) over the steps after the first 25.
set -euo pipefail
bin=${1:-build}/bin
work=${WORK:-run/bench-routing}
steps=${STEPS:-300} threads=${THREADS:-2}
configs=${CONFIGS:-demo-gpt demo-mixtral d512-gpt d512-mixtral}
mkdir -p "$work"
"$(dirname "$0")/../scripts/corpus" "$work/corpus.txt" > /dev/null
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# moe-train routing balance, $steps steps, flags: ${FLAGS:-(defaults)}"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $threads thread(s) per run"
for c in $configs; do
  arch=${c#*-}
  case ${c%%-*} in
    demo) shape="--d-model 128 --d-ff 512 --layers 4 --moe-every 2 --batch 16 --seq 128" ;;
    d512) shape="--d-model 512 --d-ff 2048 --layers 4 --moe-every 1 --batch 4 --seq 32" ;;
    *) echo "routing_balance: unknown config $c" >&2; exit 2 ;;
  esac
  echo "running $c" >&2
  # shellcheck disable=SC2086 # shape and FLAGS are word lists
  "$bin/moe-train" --data "$work/corpus.txt" --out "$work/$c" --force --arch "$arch" $shape \
    --experts 8 --top-k 2 --steps "$steps" --log-every 1 --eval-every "$steps" \
    --checkpoint-every 0 --threads "$threads" --metrics "$work/$c.jsonl" ${FLAGS:-} \
    2> "$work/$c.log" || { tail -5 "$work/$c.log" >&2; exit 1; }
done
# shellcheck disable=SC2086 # configs is a word list
python3 - "$work" "${FLAGS:-defaults}" $configs <<'EOF'
import json, sys
work, label, configs = sys.argv[1], sys.argv[2], sys.argv[3:]
for c in configs:
    rows = [json.loads(line) for line in open(f"{work}/{c}.jsonl")]
    steps = [r for r in rows if "expert_load_max_over_mean" in r]
    worst = {r["step"]: max(r["expert_load_max_over_mean"]) for r in steps}
    shown = [s for s in sorted(worst) if s == 1 or s % 25 == 0]
    late = [v for s, v in worst.items() if s > 25]
    layers = [sum(r["expert_load_max_over_mean"]) / len(r["expert_load_max_over_mean"])
              for r in steps if r["step"] > 25]
    high = sum(1 for v in worst.values() if v >= 3.5)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    print(f"\n{c}: worst layer's max/mean load")
    print("| step | " + " | ".join(str(s) for s in shown) +
          " | mean 26+ | mean 26+ (all layers) | steps at 3.5+ | loss | val |")
    print("|---" * (len(shown) + 6) + "|")
    print(f"| {label} | " + " | ".join(f"{worst[s]:.2f}" for s in shown) + " | " +
          (f"{sum(late) / len(late):.2f}" if late else "-") + " | " +
          (f"{sum(layers) / len(layers):.2f}" if layers else "-") + f" | {high} | " +
          f"{steps[-1]['loss']:.3f} | " + (f"{val[-1]:.3f}" if val else "-") + " |")
EOF

#!/bin/sh
# ZeRO for the dense parameters (moe-train --zero): per-rank memory and throughput of --zero 0, 1,
# 2 and 3 at 1, 2 and 4 ranks, one moe-zero-bench run each (its own processes, so getrusage's peak
# RSS is that run's), as a markdown table:
#   peak RSS      the largest ru_maxrss over the ranks (the whole process: program, MPI,
#                 activations, logits, experts)
#   dense state   bytes each rank holds for the dense parameters: values (and compute copies),
#                 gradients, GradSync's fused all-reduce buffer, AdamW masters and moments, and
#                 ZeRO's gradient and value slices (stage 3 holds no whole value between uses);
#                 "ideal" is --zero 0's at one process / R, the ceiling stage 3 approaches; "vs 0"
#                 the ratio to --zero 0 at the same ranks
#   tokens/s      rank 0's over the timed steps, and the ratio to --zero 0 at the same ranks
#                 (measured in this run; noisy when ranks share cores)
#   params        "=" when the final parameters are bitwise --zero 0's at the same ranks
# Usage: bench/zero.sh [--quick] [BIN_DIR] (default build/bin); RANKS="1 2 4" overrides. With
# --quick (ctest): a tiny model, and FAIL: when a run fails or stage 1 (always) or stages 2 and 3
# at 2 ranks (one addition per element) train other bits than --zero 0.
set -u
quick=
if [ "${1:-}" = "--quick" ]; then quick=--quick; shift; fi
bin=${1:-build/bin}
ranks_list=${RANKS:-1 2 4}
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
cpu=$(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1)
echo "# moe-zero-bench${quick:+ $quick}: gpt, every other block MoE (4 experts top-2), 1 thread per rank"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(getconf _NPROCESSORS_ONLN) online cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| ranks | zero | peak RSS MiB | dense state MiB/rank | ideal MiB | vs 0 | tokens/s | vs 0 | params |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"
ideal=
for n in $ranks_list; do
  base_state= base_tps= base_sum=
  for z in 0 1 2 3; do
    line=$(mpiexec -n "$n" "$bin/moe-zero-bench" --zero "$z" $quick 2>&1 | tail -1)
    case $line in ranks=*) ;; *) fail "$n ranks --zero $z: $line" ;; esac
    get() { printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    state=$(get dense_state) tps=$(get tokens_per_s) sum=$(get checksum) rss=$(get peak_rss)
    [ -n "$ideal" ] || ideal=$state
    if [ "$z" = 0 ]; then base_state=$state base_tps=$tps base_sum=$sum; fi
    same="="
    [ "$sum" = "$base_sum" ] || same="differs"
    if [ -n "$quick" ] && [ "$same" != "=" ]; then
      [ "$z" = 1 ] && fail "--zero 1 on $n ranks trained other bits than --zero 0"
      [ "$z" -ge 2 ] && [ "$n" -le 2 ] && fail "--zero $z on $n ranks trained other bits than --zero 0"
    fi
    awk -v n="$n" -v z="$z" -v rss="$rss" -v s="$state" -v i="$ideal" -v bs="$base_state" \
      -v t="$tps" -v bt="$base_tps" -v same="$same" 'BEGIN {
        m = 1048576
        printf "| %d | %d | %.1f | %.2f | %.2f | %.2f | %.0f | %.2f | %s |\n",
          n, z, rss / m, s / m, i / n / m, s / bs, t, t / bt, same }'
  done
done

#!/bin/sh
# MoESys's 2D prefetch (moe-train --zero 3 --zero-prefetch N with --offload ssd): how much of the
# dense all-gathers and of the expert loads compute did not wait for, --zero-prefetch 0 (the
# synchronous gathers) against N > 0, at 2 and 4 ranks, one moe-zero-bench run each, as a
# markdown table (every number rank 0's, summed over the timed steps):
#   gather s / wait s   the dense all-gathers' own seconds (the prefetch thread's when N > 0) and
#                       the seconds compute waited for them; hidden = 1 - wait / gather
#   load s / wait s     the expert store's uploads and SSD reads (loader thread or compute's) and
#                       the seconds compute waited for an upload; hidden = 1 - wait / load
#   tokens/s            rank 0's, and the ratio to --zero-prefetch 0 at the same ranks (this run)
#   params              "=" when the final parameters are bitwise --zero-prefetch 0's
# Usage: bench/zero_prefetch.sh [--quick] [BIN_DIR] (default build/bin); RANKS="2 4" and
# DEPTHS="0 1 2" override. With --quick (ctest): a tiny model, and FAIL: when a run fails or a
# prefetching run trains other bits than the synchronous one (it must not, at any rank count).
set -u
quick=
if [ "${1:-}" = "--quick" ]; then quick=--quick; shift; fi
bin=${1:-build/bin}
ranks_list=${RANKS:-2 4}
depths=${DEPTHS:-0 1 2}
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
ssd=$(mktemp -d "${TMPDIR:-/tmp}/moe-zero-prefetch.XXXXXX") || fail "no scratch directory"
trap 'rm -rf "$ssd"' EXIT
cpu=$(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1)
cores=$(getconf _NPROCESSORS_ONLN)
echo "# moe-zero-bench${quick:+ $quick} --zero 3 --offload ssd: gpt, every other block MoE (4 experts top-2), 1 thread per rank"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $cores online cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# ranks > cores oversubscribe: a rank's threads (compute, all-gather, loader) share its core's time"
echo
echo "| ranks | prefetch | gather s | wait s | hidden | load s | wait s | hidden | tokens/s | vs 0 | params |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"
for n in $ranks_list; do
  base_tps= base_sum=
  for d in $depths; do
    rm -rf "${ssd:?}"/*
    line=$(mpiexec -n "$n" "$bin/moe-zero-bench" --zero 3 --zero-prefetch "$d" --offload ssd \
      --ssd-dir "$ssd" $quick 2>&1 | tail -1)
    case $line in ranks=*) ;; *) fail "$n ranks --zero-prefetch $d: $line" ;; esac
    get() { printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    tps=$(get tokens_per_s) sum=$(get checksum)
    [ -n "$base_tps" ] || base_tps=$tps base_sum=$sum
    same="="
    [ "$sum" = "$base_sum" ] || same="differs"
    [ -n "$quick" ] && [ "$same" != "=" ] &&
      fail "--zero-prefetch $d on $n ranks trained other bits than the first depth"
    awk -v n="$n" -v d="$d" -v g="$(get dense_gather)" -v gw="$(get dense_wait)" \
      -v l="$(get expert_load)" -v lw="$(get expert_wait)" -v t="$tps" -v bt="$base_tps" \
      -v same="$same" 'function hidden(w, x) { h = x > 0 ? 1 - w / x : 0; return h < 0 ? 0 : h }
      BEGIN {
        printf "| %d | %d | %.3f | %.3f | %.0f%% | %.3f | %.3f | %.0f%% | %.0f | %.2f | %s |\n",
          n, d, g, gw, 100 * hidden(gw, g), l, lw, 100 * hidden(lw, l), t, t / bt, same }'
  done
done

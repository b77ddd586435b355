#!/bin/sh
# moe-bench --quick: exit 0; its GEMM kernel table has every product the library runs (expert
# forward NN, dX NT, dW TN, dense NT, attention NT and NN), each kernel's result within fp32
# rounding of the CBLAS kernel's (max |diff| / max |C| under 1e-5: K <= 512 sums of O(1) terms);
# the host kernel is avx512 exactly where /proc/cpuinfo lists AVX-512 F/VL/DQ/BW and FMA;
# MOE_GEMM=blas makes it the CBLAS one; a bad MOE_GEMM is a usage error (exit 2); a --shape
# whose weights cannot fit in this machine's memory is refused before anything runs (exit 1).
# Usage: moe_bench_quick.sh MOE_BENCH
set -u
bench=$1
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

"$bench" --quick --threads 2 > "$work/out" 2> "$work/err" || fail "exit $?: $(cat "$work/err")"
cat "$work/out"
for row in 'expert x W1  NN' 'expert dX    NT' 'expert dW    TN' 'dense x W^T  NT' \
  'attn Q K^T   NT' 'attn P V     NN'; do
  grep -q "^  $row " "$work/out" || fail "no '$row' row"
done
kernel=$(sed -n 's/^# GEMM tile kernel: \([a-z0-9]*\) .*/\1/p' "$work/out")
[ -n "$kernel" ] || fail "no '# GEMM tile kernel' line"
# The default follows the CPU: avx512 exactly where the CPU has what the kernel needs.
want=blas
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
case "$flags" in *" avx512f"*) case "$flags" in *" avx512vl"*) case "$flags" in *" avx512dq"*)
  case "$flags" in *" avx512bw"*) case "$flags" in *" fma"*) want=avx512 ;; esac ;; esac ;; esac ;;
  esac ;; esac
[ -n "$flags" ] && [ "$kernel" != "$want" ] && fail "host kernel $kernel, expected $want for this CPU"
grep '^  [a-z].*  [NT][NT] ' "$work/out" | awk '$NF + 0 > 1e-5 { exit 1 }' ||
  fail "a kernel differs from CBLAS by more than fp32 rounding"

MOE_GEMM=blas "$bench" --quick --threads 1 --min-time 0 > "$work/blas" 2> "$work/err" ||
  fail "MOE_GEMM=blas: exit $?: $(cat "$work/err")"
grep -q '^# GEMM tile kernel: blas ' "$work/blas" || fail "MOE_GEMM=blas: $(grep '^# GEMM' "$work/blas")"

MOE_GEMM=fastest "$bench" --quick > "$work/bad" 2> "$work/err"
rc=$?
[ "$rc" -eq 2 ] || fail "MOE_GEMM=fastest: exit $rc, expected 2"
grep -q 'MOE_GEMM=fastest' "$work/err" || fail "MOE_GEMM=fastest: $(cat "$work/err")"
# D 2^20 with 64 experts: 2 x 64 x 4 x 2^40 fp32 weights, 2 PiB, more than any machine here has.
"$bench" --shape 1048576,64,2,8192 > "$work/huge" 2> "$work/err"
rc=$?
[ "$rc" -eq 1 ] || fail "--shape 1048576,64,2,8192: exit $rc, expected 1: $(cat "$work/err")"
grep -q 'moe-bench row D 1048576, E 64, k 2, N 8192 needs at least .* more than this machine has' \
  "$work/err" || fail "--shape 1048576,64,2,8192: $(cat "$work/err")"
[ -s "$work/huge" ] && fail "--shape 1048576,64,2,8192 printed a table: $(head -3 "$work/huge")"
echo "moe-bench --quick: ok (kernel $kernel)"

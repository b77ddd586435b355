#!/usr/bin/env bash
# Rebuilds the golden files in this directory with llama.cpp's ggml (see README.md), then compares
# moe's quantisers with ggml's on many more random rows (compare_ggml.cpp). Needs pip, cmake, a C
# and C++ compiler, and network access for pip; everything else happens under $WORK.
# ggml is not a dependency of moe: only this script builds it.
set -euo pipefail
VERSION=0.3.36  # llama-cpp-python, whose vendor/llama.cpp holds ggml
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
WORK=${WORK:-${TMPDIR:-/tmp}/moe-quant-golden}
mkdir -p "$WORK"
if [ ! -d "$WORK/llama_cpp_python-$VERSION" ]; then
  pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$WORK"
  tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
GGML=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp/ggml
touch "$GGML/ggml.pc.in"  # the sdist leaves it out; ggml's CMakeLists configures it
# Baseline x86-64, no SIMD: the reference quantisers and the generic (scalar) dot products.
cmake -S "$GGML" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF \
  -DGGML_AVX512=OFF -DGGML_SSE42=OFF -DGGML_BMI2=OFF -DGGML_OPENMP=OFF \
  -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF  # the sdist leaves those directories out
cmake --build "$WORK/build" -j2 --target ggml-base ggml-cpu
LIBS=("$WORK/build/src/libggml-cpu.a" "$WORK/build/src/libggml-base.a" -lm -lpthread)
cc -O2 -I"$GGML/include" "$HERE/make_golden.c" "${LIBS[@]}" -lstdc++ -o "$WORK/make_golden"
"$WORK/make_golden" inputs "$HERE"
"$WORK/make_golden" "$HERE"
c++ -std=c++20 -O2 -I"$ROOT/libmoe/include" -I"$ROOT/libmoe/src" -I"$GGML/include" \
  "$HERE/compare_ggml.cpp" "$ROOT/libmoe/src/backend/cpu/quant_blocks.cpp" "${LIBS[@]}" \
  -o "$WORK/compare_ggml"
"$WORK/compare_ggml"

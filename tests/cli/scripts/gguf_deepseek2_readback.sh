#!/bin/sh
# moe-convert export-gguf of DeepSeek models as llama.cpp's deepseek2, read back by llama.cpp's own
# `gguf` Python package (scripts/setup installs it in /opt/moe-python): a tiny DeepSeek-V3 (q
# latent, grouped sigmoid routing with its correction bias, a multi-token-prediction layer) and a
# V2-Lite-shaped DeepSeek-V2 (plain q_proj, softmax routing), each written as a Hugging Face
# directory by gguf_deepseek2_readback.py, imported, exported as f32 and q8_0, and checked by the
# same script against the directory's tensors (every key, name, shape, type and byte).
# Exits 77 (skipped) where the package is not installed.
# Usage: gguf_deepseek2_readback.sh MOE_CONVERT
set -u
convert=$1
python=${MOE_GGUF_PYTHON:-/opt/moe-python/bin/python}
here=$(dirname "$0")
fail() { echo "FAIL: $*"; exit 1; }
if ! "$python" -c 'import gguf, numpy' 2>/dev/null; then
  echo "skipped: $python cannot import gguf and numpy (scripts/setup installs them)"
  exit 77
fi
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
for variant in v3 v2lite; do
  "$python" "$here/gguf_deepseek2_readback.py" write "$work/$variant" "$variant" ||
    fail "writing the tiny $variant directory"
  "$convert" import-hf "$work/$variant" -o "$work/$variant.h5" -q 2> "$work/err" ||
    fail "import-hf $variant: $(cat "$work/err")"
  for type in f32 q8_0; do
    "$convert" export-gguf "$work/$variant.h5" -o "$work/$variant-$type.gguf" --type "$type" -q \
      2> "$work/err" || fail "export-gguf $variant --type $type: $(cat "$work/err")"
    "$python" "$here/gguf_deepseek2_readback.py" check "$work/$variant" \
      "$work/$variant-$type.gguf" "$type" || fail "read-back of the $variant $type file"
  done
done
echo "ok"

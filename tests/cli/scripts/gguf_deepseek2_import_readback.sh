#!/bin/sh
# moe-convert import-gguf of quantised deepseek2 files, checked by an independent reader: a tiny
# deepseek_v3 (every row a whole number of q4_k's 256-value blocks) trained on a real corpus,
# exported as q8_0, q4_k and q6_k, each file imported back, and the imported checkpoint compared
# by gguf_deepseek2_import_readback.py with what llama.cpp's own `gguf` package reads out of the
# file (scripts/setup installs it in /opt/moe-python): attn.k_b bit for bit its dequantisation of
# attn_k_b, each head transposed; q_b, kv_a and k_rope the file's block rows in our order.
# Exits 77 (skipped) where the package is not installed.
# Usage: gguf_deepseek2_import_readback.sh MOE_TRAIN MOE_CONVERT CORPUS
set -u
train=$1 convert=$2 corpus=$3
python=${MOE_GGUF_PYTHON:-/opt/moe-python/bin/python}
here=$(dirname "$0")
fail() { echo "FAIL: $*"; exit 1; }
if ! "$python" -c 'import gguf, h5py, numpy' 2>/dev/null; then
  echo "skipped: $python cannot import gguf, h5py and numpy (scripts/setup installs them)"
  exit 77
fi
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

"$train" --data "$corpus" --out "$work/run" --arch deepseek_v3 --layers 2 --d-model 256 --heads 2 \
  --d-ff 256 --experts 4 --experts-per-layer 0,4 --shared-expert-ff 256 --router-groups 2 \
  --router-group-topk 1 --q-lora-rank 256 --kv-lora-rank 256 --qk-nope-dim 256 --qk-rope-dim 16 \
  --v-head-dim 128 --seq 16 --batch 1 --steps 1 --eval-every 0 --threads 1 -q > /dev/null \
  2> "$work/train.err" || fail "moe-train: $(cat "$work/train.err")"
for type in q8_0 q4_k q6_k; do
  "$convert" export-gguf "$work/run/last.h5" -o "$work/$type.gguf" --type "$type" -q \
    2> "$work/err" || fail "export-gguf --type $type: $(cat "$work/err")"
  "$convert" import-gguf "$work/$type.gguf" -o "$work/$type.h5" 2> "$work/err" ||
    fail "import-gguf $type: $(cat "$work/err")"
  grep -q "2 attn_k_b tensors ($type) dequantised" "$work/err" ||
    fail "import-gguf $type does not say attn_k_b was dequantised: $(cat "$work/err")"
  "$python" "$here/gguf_deepseek2_import_readback.py" "$work/$type.gguf" "$work/$type.h5" ||
    fail "read-back of $type"
done
echo "ok"

#!/bin/sh
# moe-convert export-gguf, read back by an independent reader: a tiny mixtral model trained on a
# real corpus (and a tiny Qwen2-MoE and GLM-4-MoE imported from Hugging Face directories), exported as f32, f16,
# bf16 and q8_0, each file read by the `gguf` Python package
# (llama.cpp's own reader; scripts/setup installs it in /opt/moe-python) and checked against the
# checkpoint by gguf_readback.py (every key, every tensor's shape, type and bytes). An existing
# output is refused without --force. Exits 77 (skipped) where the package is not installed.
# Usage: gguf_readback.sh MOE_TRAIN MOE_CONVERT CORPUS
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

"$train" --data "$corpus" --out "$work/run" --arch mixtral --layers 2 --moe-every 1 --d-model 64 --heads 4 \
  --kv-heads 2 --d-ff 96 --experts 4 --top-k 2 --batch 2 --seq 32 --steps 3 --eval-every 0 \
  --threads 1 -q > /dev/null 2> "$work/train.err" || fail "moe-train: $(cat "$work/train.err")"
ckpt=$work/run/last.h5
[ -f "$ckpt" ] || fail "no last.h5 under $work/run: $(ls "$work/run")"

for type in f32 f16 bf16 q8_0; do
  "$convert" export-gguf "$ckpt" -o "$work/model-$type.gguf" --type "$type" -q 2> "$work/err" ||
    fail "export-gguf --type $type: $(cat "$work/err")"
  "$python" "$here/gguf_readback.py" "$ckpt" "$work/model-$type.gguf" "$type" || fail "read-back of $type"
done
# The 4-bit block types need rows of 256 values (32 for mxfp4): an 8-layer model 256 wide, so
# that Q4_K_M's choice of q6_k layers (0, 3, 6, 7 of 8) shows.
"$train" --data "$corpus" --out "$work/run256" --arch mixtral --layers 8 --moe-every 1 --d-model 256 \
  --heads 4 --kv-heads 2 --d-ff 256 --experts 2 --top-k 1 --batch 1 --seq 16 --steps 1 \
  --eval-every 0 --threads 1 -q > /dev/null 2> "$work/train.err" || fail "moe-train 256: $(cat "$work/train.err")"
for type in q4_k q6_k mxfp4 q4_k_m; do
  "$convert" export-gguf "$work/run256/last.h5" -o "$work/wide-$type.gguf" --type "$type" -q \
    2> "$work/err" || fail "export-gguf --type $type: $(cat "$work/err")"
  "$python" "$here/gguf_readback.py" "$work/run256/last.h5" "$work/wide-$type.gguf" "$type" ||
    fail "read-back of $type"
done
# The checkpoint's own dtype (f32) is the default type.
"$convert" export-gguf "$ckpt" -o "$work/default.gguf" -q 2> "$work/err" || fail "default: $(cat "$work/err")"
cmp -s "$work/default.gguf" "$work/model-f32.gguf" || fail "the default type is not the checkpoint's f32"
# An existing output is kept unless --force.
"$convert" export-gguf "$ckpt" -o "$work/model-f16.gguf" --type q8_0 -q 2> "$work/err"
rc=$?
[ "$rc" -ne 0 ] || fail "an existing output was overwritten without --force"
grep -q -- "--force" "$work/err" || fail "the refusal does not mention --force: $(cat "$work/err")"
"$python" "$here/gguf_readback.py" "$ckpt" "$work/model-f16.gguf" f16 > /dev/null || fail "the refused export changed the file"
# A type llama.cpp has but we do not write is a usage error (exit 2) naming the flag.
"$convert" export-gguf "$ckpt" -o "$work/q4.gguf" --type q4_0 2> "$work/err"
rc=$?
[ "$rc" -eq 2 ] || fail "--type q4_0: exit $rc, expected 2"
grep -q -- "--type" "$work/err" || fail "--type q4_0: $(cat "$work/err")"
[ ! -e "$work/q4.gguf" ] || fail "--type q4_0 wrote a file"
# An imported model with a tokenizer: its vocabulary, merges and pre-tokenizer go into the file.
tokenizers=$here/../../data/tokenizers
"$train" --data "$corpus" --out "$work/run704" --arch mixtral --layers 1 --moe-every 1 --d-model 64 \
  --heads 4 --kv-heads 2 --d-ff 64 --experts 2 --top-k 1 --batch 2 --seq 32 --steps 1 --vocab 704 \
  --eval-every 0 --threads 1 -q > /dev/null 2> "$work/train.err" || fail "moe-train --vocab 704: $(cat "$work/train.err")"
"$convert" export-hf "$work/run704/last.h5" -o "$work/hf" -q 2> "$work/err" || fail "export-hf: $(cat "$work/err")"
cp "$tokenizers/bpe-qwen/tokenizer.json" "$work/hf/" || fail "copy tokenizer"
"$convert" import-hf "$work/hf" -o "$work/imported.h5" -q 2> "$work/err" || fail "import-hf: $(cat "$work/err")"
"$convert" export-gguf "$work/imported.h5" -o "$work/imported.gguf" --type f16 -q 2> "$work/err" ||
  fail "export-gguf of the imported model: $(cat "$work/err")"
"$python" "$here/gguf_readback.py" "$work/imported.h5" "$work/imported.gguf" f16 \
  "$tokenizers/bpe-qwen/tokenizer.json" || fail "read-back of the imported model"
# A Qwen2-MoE (q/k/v biases, shared expert and its gate) imported from a Hugging Face directory:
# llama.cpp's qwen2moe architecture, its keys and tensors, q/k rows unpermuted (NEOX rope).
"$python" "$here/hf_tiny_qwen2_moe.py" "$work/qwen" || fail "writing the tiny Qwen2-MoE"
"$convert" import-hf "$work/qwen" -o "$work/qwen.h5" -q 2> "$work/err" || fail "import-hf qwen2_moe: $(cat "$work/err")"
for type in f32 q8_0; do
  "$convert" export-gguf "$work/qwen.h5" -o "$work/qwen-$type.gguf" --type "$type" -q 2> "$work/err" ||
    fail "export-gguf qwen2_moe --type $type: $(cat "$work/err")"
  "$python" "$here/gguf_readback.py" "$work/qwen.h5" "$work/qwen-$type.gguf" "$type" ||
    fail "read-back of the qwen2moe $type file"
done
# A GLM-4-MoE (a leading dense layer, q/k/v biases, qk-norm, partial RoPE, grouped sigmoid routing
# with its correction bias, a shared expert) imported from a Hugging Face directory: llama.cpp's
# glm4moe architecture, its keys and tensor names.
"$python" "$here/hf_tiny_glm4_moe.py" "$work/glm" || fail "writing the tiny GLM-4-MoE"
"$convert" import-hf "$work/glm" -o "$work/glm.h5" -q 2> "$work/err" || fail "import-hf glm4_moe: $(cat "$work/err")"
for type in f32 q8_0; do
  "$convert" export-gguf "$work/glm.h5" -o "$work/glm-$type.gguf" --type "$type" -q 2> "$work/err" ||
    fail "export-gguf glm4_moe --type $type: $(cat "$work/err")"
  "$python" "$here/gguf_readback.py" "$work/glm.h5" "$work/glm-$type.gguf" "$type" ||
    fail "read-back of the glm4moe $type file"
done
echo "ok"

#!/bin/sh
# moe-convert export-gguf of gpt_oss models as llama.cpp's gpt-oss, read back by llama.cpp's own
# `gguf` Python package (scripts/setup installs it in /opt/moe-python): a tiny gpt_oss trained a
# few steps by moe-train (so that its biases, sinks and router bias are not zero), 3 layers with
# the window on the even ones, a head width other than D / H, YaRN; exported as f32, f16, bf16,
# q8_0 and mxfp4, each file checked against the checkpoint by gguf_gpt_oss_readback.py (every key,
# tensor name, shape, type and byte). Then what llama.cpp's gpt-oss graph fixes is refused by name
# (exit 1, no file): another SwiGLU alpha or limit (the window's layers: test_gguf_gpt_oss.cpp).
# Last, a tiny gpt-oss directory with MXFP4 experts as released, imported keeping them.
# Exits 77 (skipped) where the package is not installed.
# Usage: gguf_gpt_oss_readback.sh MOE_TRAIN MOE_CONVERT CORPUS
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

# gpt_oss's defaults: the window on the even layers, alpha 1.702, limit 7; plain routers
# (--router-center-rate 0) so that the file's router is the checkpoint's.
model="--arch gpt_oss --layers 3 --d-model 64 --heads 4 --kv-heads 2 --head-dim 32 --d-ff 32
  --experts 4 --top-k 2 --seq 32 --sliding-window 8 --rope-scaling yarn --rope-factor 4
  --original-max-position-embeddings 8 --router-center-rate 0"
train_model() {  # OUT [extra flags]
  out=$1
  shift
  # shellcheck disable=SC2086
  "$train" --data "$corpus" --out "$out" $model "$@" --batch 2 --steps 3 --eval-every 0 \
    --threads 1 -q > /dev/null 2> "$work/train.err" || fail "moe-train $*: $(cat "$work/train.err")"
}
train_model "$work/run"
ckpt=$work/run/last.h5
[ -f "$ckpt" ] || fail "no last.h5 under $work/run: $(ls "$work/run")"
for type in f32 f16 bf16 q8_0 mxfp4; do
  "$convert" export-gguf "$ckpt" -o "$work/oss-$type.gguf" --type "$type" -q 2> "$work/err" ||
    fail "export-gguf --type $type: $(cat "$work/err")"
  "$python" "$here/gguf_gpt_oss_readback.py" "$ckpt" "$work/oss-$type.gguf" "$type" ||
    fail "read-back of the gpt-oss $type file"
done

# Refused by name, no file written.
refused() {  # WHAT EXPECTED-TEXT CHECKPOINT
  "$convert" export-gguf "$3" -o "$work/refused.gguf" -q 2> "$work/err"
  rc=$?
  [ "$rc" -eq 1 ] || fail "$1: exit $rc, expected 1: $(cat "$work/err")"
  grep -q "$2" "$work/err" || fail "$1: the message does not say '$2': $(cat "$work/err")"
  [ ! -e "$work/refused.gguf" ] || fail "$1: a file was written"
}
train_model "$work/alpha" --swiglu-alpha 1.5
refused "swiglu alpha 1.5" "swiglu_alpha 1.5" "$work/alpha/last.h5"
train_model "$work/limit" --swiglu-limit 5
refused "swiglu limit 5" "swiglu_limit 5" "$work/limit/last.h5"
# gpt-oss as released: MXFP4 experts (_blocks/_scales) kept by import-hf --keep-mxfp4 go out
# as llama.cpp's MXFP4 blocks, byte for byte its converter's repacking of the directory's
# (gguf_gpt_oss_mxfp4.py), the rest as the directory's f32 values.
"$python" "$here/gguf_gpt_oss_mxfp4.py" write "$work/hf" || fail "writing the tiny MXFP4 gpt-oss"
"$convert" import-hf "$work/hf" --keep-mxfp4 -o "$work/kept.h5" -q 2> "$work/err" ||
  fail "import-hf --keep-mxfp4: $(cat "$work/err")"
"$convert" export-gguf "$work/kept.h5" -o "$work/kept.gguf" --type f32 -q 2> "$work/err" ||
  fail "export-gguf of the kept MXFP4 experts: $(cat "$work/err")"
"$python" "$here/gguf_gpt_oss_mxfp4.py" check "$work/hf" "$work/kept.gguf" ||
  fail "read-back of the kept MXFP4 experts"
echo "ok"

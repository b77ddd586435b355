#!/usr/bin/env bash
# Remakes the llama.cpp-written GGUF fixture (see make_fixture.py). Needs llama.cpp's source at
# the commit bench/llama_cpp.sh names (its convert_hf_to_gguf.py and gguf-py) and a Python with
# torch, transformers, safetensors, sentencepiece and numpy:
#   python3 -m venv v && v/bin/pip install torch transformers safetensors sentencepiece numpy
#   PYTHON=v/bin/python make_fixture.sh /path/to/llama.cpp
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
llama_cpp=${1:?usage: make_fixture.sh LLAMA_CPP_SOURCE_DIR}
python=${PYTHON:-python3}
rm -rf "$here/hf"
"$python" "$here/make_fixture.py" "$llama_cpp"
for type in f32 q8_0; do
  "$python" "$llama_cpp/convert_hf_to_gguf.py" "$here/hf" --outtype "$type" \
    --outfile "$here/mixtral-$type.gguf"
done
"$python" "$here/make_fixture.py" "$llama_cpp" dequantize

#!/usr/bin/env bash
# YaRN oracle (issue 44): transformers writes, scores and continues a tiny random DeepSeek-V3 with
# rope_type "yarn" (bench/hf_yarn_oracle.py); we import it and do the same. Prints both.
# usage: bench/hf_yarn_oracle.sh PYTHON BUILD_BIN [WORK_DIR]   (PYTHON with torch + transformers)
set -euo pipefail
py=$1; bin=$2; work=${3:-$(mktemp -d /tmp/yarn-oracle.XXXXXX)}
here=$(cd "$(dirname "$0")" && pwd)
"$py" "$here/hf_yarn_oracle.py" "$work" > /dev/null
"$bin/moe-convert" import-hf "$work/hf" -o "$work/ours.h5" --max-seq 96 --force
echo "transformers: $(cat "$work/reference.json" | tr -d '\n ')"
echo "moe score:    $("$bin/moe-infer" score -q --model "$work/ours.h5" --data "$work/data.bin")"
echo "moe generate: $("$bin/moe-infer" generate -q --model "$work/ours.h5" --prompts "$work/prompts.jsonl")"

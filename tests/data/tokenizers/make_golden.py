"""Makes the tokenizer test data once (the files next to this script are its output, committed):
byte-level BPE tokenizers trained with Hugging Face `tokenizers` on a real corpus (Debian's
fortunes), one configured as Qwen2's tokenizer.json is (NFC, its split regex, byte-level without
regex, special tokens), one as GPT-2's / OLMoE's (byte-level with GPT-2's regex); a SentencePiece
BPE model (byte fallback, as Llama's and Mixtral's) trained with `spm_train` from Debian's
sentencepiece package; and golden.json: the token ids each reference implementation gives for
every line of texts.txt (and for the whole file), which tests/unit/test_tokenizer.cpp must match.
Run: python3 -m venv v && v/bin/pip install tokenizers sentencepiece && v/bin/python make_golden.py
(needs `spm_train` on PATH: apt-get install sentencepiece)."""
import json
import os
import subprocess
import sys
import tempfile

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

here = os.path.dirname(os.path.abspath(__file__))
corpus = "/usr/share/games/fortunes/fortunes"
texts = open(os.path.join(here, "texts.txt"), encoding="utf-8").read()
lines = texts.split("\n")

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_bpe(name, qwen):
    tok = Tokenizer(models.BPE())
    if qwen:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIAL if qwen else ["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus], trainer)
    os.makedirs(os.path.join(here, name), exist_ok=True)
    tok.save(os.path.join(here, name, "tokenizer.json"))
    return tok


golden = {}
for name, qwen in (("bpe-qwen", True), ("bpe-gpt2", False)):
    tok = train_bpe(name, qwen)
    golden[name] = {"lines": [tok.encode(line).ids for line in lines],
                    "whole": tok.encode(texts).ids,
                    "special": tok.encode("<|im_start|>user\nHi<|im_end|>").ids if qwen else []}

with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "spm")
    subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={prefix}", "--vocab_size=600",
                    "--model_type=bpe", "--byte_fallback=true", "--character_coverage=0.9995",
                    "--normalization_rule_name=identity", "--split_digits=true",
                    "--remove_extra_whitespaces=false", "--allow_whitespace_only_pieces=true",
                    "--minloglevel=2"], check=True)
    os.makedirs(os.path.join(here, "spm"), exist_ok=True)
    with open(prefix + ".model", "rb") as src, open(os.path.join(here, "spm", "tokenizer.model"), "wb") as dst:
        dst.write(src.read())
sp = spm.SentencePieceProcessor(model_file=os.path.join(here, "spm", "tokenizer.model"))
golden["spm"] = {"lines": [sp.encode(line) for line in lines], "whole": sp.encode(texts),
                 "special": []}

with open(os.path.join(here, "golden.json"), "w") as out:
    json.dump(golden, out, separators=(",", ":"))
    out.write("\n")
print({k: len(v["whole"]) for k, v in golden.items()}, file=sys.stderr)

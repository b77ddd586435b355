// Hugging Face MoE checkpoints (config.json + safetensors) <-> our checkpoints, for the families
// that share our RoPE/RMSNorm/SwiGLU layers: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (our arch is
// the config.json model_type). docs/FORMATS.md ("Hugging Face safetensors import/export") has the
// name mapping table.
//
// Import reads a directory holding config.json and either model.safetensors or the shards that
// model.safetensors.index.json names in its "weight_map". Families (config.json "model_type"):
//   mixtral    per-expert block_sparse_moe.experts.E.{w1,w2,w3}.weight, or the fused form
//              experts.gate_up_proj [E, 2F, D] (gate rows 0..F-1 = w1, up rows F..2F-1 = w3) and
//              experts.down_proj [E, D, F] = w2, under block_sparse_moe. or mlp.
//   olmoe, qwen2_moe, qwen3_moe
//              mlp.gate / mlp.experts.E.{gate,up,down}_proj naming and norm_topk_prob for the
//              router's renormalisation, plus their own tensors: Qwen2-MoE's q/k/v biases and
//              shared expert (mlp.shared_expert.*, shared_expert_intermediate_size wide) with its
//              sigmoid gate mlp.shared_expert_gate [1, D]; Qwen3-MoE's per-head q_norm/k_norm
//              [hd] (and head_dim, which may differ from D / H); OLMoE's full-width q_norm
//              [H*hd] and k_norm [KV*hd]. What we cannot express (dense MLP layers, sliding
//              windows shorter than the context, clip_qkv, o_proj biases, DeepSeek's MLA) is
//              refused by name.
// Every source tensor is mapped (listed in the report), or unmapped (an error unless
// allow_unmapped; then listed), or evidence of an unsupported feature (always an error naming
// the feature, never dropped). Config and tensor shapes must agree exactly.
//
// Numerics: our RoPE is HF's "rotate half" convention, so q/k projection rows are copied as they
// are (no permutation). Tensors keep the checkpoint's storage dtype when all mapped tensors share
// one of F32/BF16/F16 (the model config's dtype becomes it); mixed dtypes are converted to f32
// (exact for all three) and the report says so. All functions throw moe::Error naming the file,
// tensor or config key and the cause.
#pragma once
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/models/config.h"

namespace moe::io {

// The context length given to imported models when config.json's max_position_embeddings is
// larger (Mixtral says 32768): our `seq` sizes the scoring windows and default KV caches.
inline constexpr int64_t kHfDefaultMaxSeq = 4096;

struct HfImportOptions {
  bool allow_unmapped = false;  // tensors we have no place for: listed in the report, not an error
  // Our seq = min(max_position_embeddings, max_seq) (0: no cap). A model our export_hf wrote keeps
  // its recorded config (the safetensors metadata), its seq capped by max_seq the same way.
  int64_t max_seq = kHfDefaultMaxSeq;
  // gpt-oss experts stored MXFP4 (_blocks/_scales) are kept as our mxfp4 blocks, bit-exact (a
  // nibble permutation; model_config "quantization" "mxfp4" and "tensor_formats" name them)
  // instead of dequantised into the storage dtype. Other checkpoints: nothing to keep (a note).
  bool keep_mxfp4 = false;
  // Provenance of the resulting checkpoint; when tool is empty it is filled with
  // "libmoe import_hf", this library's version and git revision, and the current time.
  Provenance provenance;
};

struct HfImportReport {
  std::string family;                    // config.json model_type: "mixtral", "olmoe", ...
  std::vector<std::string> mapped;       // "<hf name> -> <our name>[ expert e][ rows a..b]"
  std::vector<std::string> unmapped;     // source tensors with no counterpart (allow_unmapped)
  std::vector<std::string> unsupported;  // features the model lacks ("shared expert (...)")
  std::vector<std::string> notes;        // decisions taken: seq cap, dtype conversion, layout
};

// Reads the HF directory `dir` into a checkpoint our tools load: model_config as
// moe::to_json(ModelConfig) writes it (arch = the family), parameters under our names with `expert`
// set on expert tensors, provenance set, no optimizer state, train_config null. `report` (may be
// null) is filled as far as the import got, also when it throws. Names, shapes and the config
// are checked now; the values are not read yet: every parameter is deferred (expert tensors
// streamed one expert at a time, moe/io/checkpoint.h), read from the safetensors files, converted
// to the storage dtype and checked finite when the checkpoint is written (or hold_all() reads
// them), so a model of any size imports in the memory of its largest tensor.
Checkpoint import_hf(const std::string& dir, const HfImportOptions& options = {},
                     HfImportReport* report = nullptr);
Checkpoint import_hf(const std::string& dir, bool allow_unmapped, HfImportReport* report);

// The model config import_hf would give the model in `path` (a Hugging Face directory, or its
// config.json), read from config.json alone: no tensor is opened, so the dtype is config.json's
// torch_dtype / dtype (float32, bfloat16, float16; f32 when absent or another) instead of the
// tensors', the tensors' features are not checked, and an exporter's record is not adopted.
// options.max_seq caps seq as for import_hf. Resolved. moe::Error as import_hf's for the config
// (no config.json, an unknown model_type, a missing key, features our flavour lacks, by name).
// For tools that size a model before converting it (moe-plan).
ModelConfig hf_model_config(const std::string& path, const HfImportOptions& options = {});

struct HfExportOptions {
  // Shards of at most this many bytes (a tensor is never split) named by
  // model.safetensors.index.json, as transformers' save_pretrained writes; 0 = one
  // model.safetensors.
  int64_t max_shard_bytes = 0;
  // Replace files of an earlier export in the directory (config.json, the safetensors, the
  // index, the tokenizer); false: an existing one is refused before anything is written.
  bool replace = false;
};

// Writes a checkpoint of the mixtral, qwen2_moe, qwen3_moe or olmoe flavour (every layer MoE with
// the same expert count, softmax routing, whole tensors: not a shard; Mixtral renormalises its
// top-k) as `dir`/config.json with the keys of that family's transformers config class, and the
// tensors under the family's names (per-expert gate/up/down or w1/w2/w3; Qwen2-MoE's shared expert
// even when 0 wide, then empty with a zero gate, as transformers creates it) in their stored
// dtype: one model.safetensors, or shards (options). The directory is created if needed; one
// holding the other form (an index, or model.safetensors) is refused (a loader would prefer it).
// Our model config is also recorded in the safetensors metadata ("moe.model_config"), so
// import_hf(export_hf(x)) gives x back: every parameter bitwise and the same model config.
// Each file is written atomically; one that exists is replaced only with options.replace.
void export_hf(const Checkpoint& ckpt, const std::string& dir, const HfExportOptions& options = {});

}  // namespace moe::io

// Small valid files made by libmoe's own writers (see fixtures.h).
#include "fixtures.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "moe/io/hf_checkpoint.h"
#include "moe/io/safetensors.h"
#include "moe/io/trace.h"
#include "moe/models/transformer.h"
#include "moe/param.h"
#include "moe/profile/record.h"

namespace moe::fuzz {

namespace fs = std::filesystem;

ModelConfig tiny_model_config(Arch arch, int64_t layers) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 32;
  c.layers = layers;
  c.d_model = 8;
  c.heads = 2;
  c.kv_heads = arch == Arch::mixtral ? 1 : 0;
  c.d_ff = 8;
  c.seq = 16;
  c.experts = 4;
  c.moe_every = 1;
  c.top_k = 2;
  c.normalize_topk = arch == Arch::mixtral;
  c.resolve();
  return c;
}

io::Checkpoint tiny_checkpoint(Arch arch, bool with_optim, int64_t layers) {
  const ModelConfig config = tiny_model_config(arch, layers);
  ParamSet params(/*seed=*/11);
  Transformer model(config, params);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(config);
  ckpt.train_config = nlohmann::json{{"steps", 1}, {"lr", 1e-3}};
  ckpt.provenance = {"make_corpus", "0", "fuzz", "make_corpus", "2026-01-01T00:00:00Z"};
  for (const Param* p : params.all()) {
    ckpt.params.push_back({p->name, p->value, p->expert});
    if (with_optim) ckpt.optim.push_back({"m." + p->name, p->value.clone(), p->expert});
  }
  ckpt.state = {3, 96, 6, 1234};
  ckpt.sharding.expert_rank = {0, 0, 0, 0};
  return ckpt;
}

void write_tiny_trace(const std::string& path, int64_t batches) {
  const ModelConfig config = tiny_model_config(Arch::gpt);
  io::Provenance provenance{"make_corpus", "0", "fuzz", "make_corpus", "2026-01-01T00:00:00Z"};
  io::TraceInfo info = profile::trace_info(config, provenance, "record");
  const int64_t N = 16, L = info.layers(), k = info.top_k, E = info.max_experts();
  io::TraceWriter writer(path, info, /*chunk_tokens=*/8);
  for (int64_t b = 0; b < batches; ++b) {
    io::TraceBatch batch;
    batch.loads.assign(static_cast<size_t>(L * E), 0);
    batch.dropped.assign(static_cast<size_t>(L), 0);
    for (int64_t t = 0; t < N; ++t) {
      batch.token_ids.push_back(static_cast<int32_t>((7 * t + b) % config.vocab_size));
      for (int64_t l = 0; l < L; ++l) {
        // Distinct experts per (token, layer), skewed so the loads differ.
        const int64_t first = (t * t + 3 * l + b) % E;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = (first + j * (1 + (t % (E - 1)))) % E;
          batch.experts.push_back(static_cast<int32_t>(e));
          batch.gates.push_back(j == 0 ? 0.75f : 0.25f);
          ++batch.loads[static_cast<size_t>(l * E + e)];
        }
      }
    }
    writer.append(batch);
  }
  writer.close();
}

void write_tiny_hf(const std::string& dir, bool sharded) {
  io::export_hf(tiny_checkpoint(Arch::mixtral), dir);
  if (!sharded) return;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  std::vector<io::NamedTensor> halves[2];
  std::map<std::string, std::string> metadata;
  {
    io::SafetensorsReader reader(single);
    metadata = reader.metadata();
    const auto& entries = reader.tensors();
    for (size_t i = 0; i < entries.size(); ++i)
      halves[2 * i < entries.size() ? 0 : 1].push_back(
          {entries[i].name, reader.read(entries[i].name)});
  }
  fs::remove(single);
  const char* const kShards[2] = {"model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors"};
  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < 2; ++s) {
    io::write_safetensors((fs::path(dir) / kShards[s]).string(), halves[s],
                          s == 0 ? metadata : std::map<std::string, std::string>{});
    for (const io::NamedTensor& t : halves[s]) weight_map[t.name] = kShards[s];
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream((fs::path(dir) / "model.safetensors.index.json").string()) << index.dump(1) << "\n";
}

}  // namespace moe::fuzz

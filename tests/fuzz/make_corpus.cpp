// Writes the seed corpora of the fuzz targets into DIR/<target>/ (tests/fuzz/corpus when run as
// scripts/fuzz --make-corpus does), every file made by libmoe's own writers (or, for prompts and
// token files, the text a user writes), each a few KiB at most.
//   fuzz_make_corpus DIR
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "fixtures.h"
#include "moe-train/options.h"
#include "moe/io/checkpoint.h"
#include "moe/io/dataset.h"
#include "moe/io/trace.h"
#include "moe/profile/paths.h"

namespace fs = std::filesystem;
using namespace moe;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error(str("cannot write '", path.string(), "'"));
  std::cerr << "  " << path.string() << " (" << bytes.size() << " bytes)\n";
}

const char* const kTrainMetrics =
    "{\"activation_peak_bytes\":547840,\"aux_loss\":2.007,\"dropped_fraction\":0.0,"
    "\"expert_load_max_over_mean\":[1.28125,1.46875],\"grad_norm\":1.13,\"loss\":5.51,"
    "\"lr\":0.001,\"step\":10,\"tokens_per_s\":136612.6,\"tokens_seen\":640,\"z_loss\":3.78}\n"
    "{\"dropped_fraction\":0.0625,\"expert_load_max_over_mean\":[1.5,1.78125],\"loss\":5.22,"
    "\"lr\":0.002,\"step\":20,\"tokens_per_s\":138516.4}\n"
    "{\"dropped_fraction\":0.03125,\"expert_load_max_over_mean\":[1.25,2.0],\"loss\":4.9,"
    "\"lr\":0.0015,\"step\":20,\"tokens_per_s\":137000.0,\"val_loss\":4.95}\n";
const char* const kDistillMetrics =
    "{\"ce\":5.4,\"kd\":null,\"kd_weight\":0.5,\"loss\":5.4,\"lr\":0.001,\"step\":1}\r\n"
    "\n"
    "{\"ce\":5.1,\"kd\":0.7,\"kd_weight\":0.5,\"loss\":2.9,\"lr\":0.0009,\"step\":2,"
    "\"val_loss\":3.1}\n";

void make(const fs::path& out, const fs::path& work) {
  // Checkpoints: both flavours (one block, to keep the files small), one with optimizer state,
  // and one holding only a dense and an expert tensor.
  const fs::path ckpt = work / "ckpt.h5";
  io::save_checkpoint(ckpt.string(), fuzz::tiny_checkpoint(Arch::gpt, false, 1));
  write_file(out / "checkpoint" / "gpt.h5", read_file(ckpt));
  io::save_checkpoint(ckpt.string(), fuzz::tiny_checkpoint(Arch::mixtral, true, 1));
  write_file(out / "checkpoint" / "mixtral-optim.h5", read_file(ckpt));
  io::Checkpoint minimal = fuzz::tiny_checkpoint(Arch::gpt, false, 1);
  std::vector<io::NamedTensor> kept;
  for (bool expert : {false, true})
    for (const io::NamedTensor& t : minimal.params)
      if (t.expert == expert && t.tensor.numel() <= 64) {
        kept.push_back(t);
        break;
      }
  minimal.params = kept;
  io::save_checkpoint(ckpt.string(), minimal);
  write_file(out / "checkpoint" / "two-tensors.h5", read_file(ckpt));

  // Traces, and the path tables moe-profile paths makes from them.
  for (int64_t batches : {1, 3}) {
    const fs::path trace = work / str("trace-", batches, ".h5");
    fuzz::write_tiny_trace(trace.string(), batches);
    write_file(out / "trace" / str("batches-", batches, ".h5"), read_file(trace));
    io::TraceReader reader(trace.string());
    for (int64_t length : {1, 2}) {
      const fs::path table = work / "table.json";
      profile::save_paths(profile::build_paths(reader, length), table.string());
      write_file(out / "paths" / str("batches-", batches, "-length-", length, ".json"),
                 read_file(table));
    }
  }

  // Hugging Face directories: config.json, the safetensors files, the index.
  fuzz::write_tiny_hf((work / "hf").string(), false);
  fuzz::write_tiny_hf((work / "hf-sharded").string(), true);
  write_file(out / "hf_config" / "mixtral.json", read_file(work / "hf" / "config.json"));
  write_file(out / "hf_index" / "index.json",
             read_file(work / "hf-sharded" / "model.safetensors.index.json"));
  write_file(out / "safetensors" / "shard-1.safetensors",
             read_file(work / "hf-sharded" / "model-00001-of-00002.safetensors"));
  write_file(out / "safetensors" / "shard-2.safetensors",
             read_file(work / "hf-sharded" / "model-00002-of-00002.safetensors"));

  // Token files: the first byte picks the format (0 text, 1 u16, 2 u32; see fuzz_tokens.cpp).
  const std::string text = "The quick brown fox jumps over the lazy dog.\n";
  const std::vector<int32_t> ids = io::tokenize_bytes(text);
  const char* const kFormats[] = {"text", "u16", "u32"};
  for (int f = 0; f < 3; ++f) {
    const fs::path file = work / str("tokens.", f == 0 ? "txt" : kFormats[f]);
    io::save_tokens(file.string(), ids);
    write_file(out / "tokens" / str(kFormats[f], ".bin"),
               std::string(1, char(f)) + read_file(file));
  }

  // Prompt files: the first byte picks the vocabulary (odd: 256, byte-level; even: 100).
  write_file(out / "prompts" / "text.jsonl", "\x01The kernel\nLinux is\r\n");
  write_file(out / "prompts" / "json.jsonl",
             "\x01{\"prompt\": \"Linux is\", \"max_new\": 20, \"temperature\": 0.8}\n"
             "{\"tokens\": [1, 2, 3], \"top_k\": 5, \"top_p\": 0.9}\n");
  write_file(out / "prompts" / "tokens.jsonl", "\x02{\"tokens\": [7, 8, 99], \"max_new\": 3}\n");

  // Metrics files: lines as moe-train and moe-distill --metrics write them (a validation loss on
  // the last step, a null kd, a step written twice by a resumed run).
  write_file(out / "metrics" / "train.jsonl", kTrainMetrics);
  write_file(out / "metrics" / "distill.jsonl", kDistillMetrics);

  // --config files: moe-train's own flags as CLI11 writes them.
  CLI::App app("moe-train", "moe-train");
  tools::TrainOptions options;
  tools::add_train_options(app, options);
  const char* argv[] = {"moe-train", "--data",    "corpus.txt", "--out", "run",
                        "--arch",    "mixtral",   "--steps",    "20",    "--lr",
                        "0.003",     "--experts", "4"};
  app.parse(static_cast<int>(std::size(argv)), argv);
  write_file(out / "config" / "train.toml", app.config_to_str(/*default_also=*/false, false));
  write_file(out / "config" / "train-defaults.toml", app.config_to_str(true, true));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_corpus DIR\n";
    return 2;
  }
  const fs::path work = fs::temp_directory_path() / str("moe-make-corpus-", ::getpid());
  try {
    fs::create_directories(work);
    make(argv[1], work);
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_corpus: error: " << e.what() << "\n";
    fs::remove_all(work);
    return 1;
  }
  fs::remove_all(work);
  return 0;
}

// moe-convert: describe, convert and re-shard checkpoints. Every subcommand is a thin driver of
// moe/io/convert.h; adding one is a `Subcommand` entry in main() (a setup function that declares
// its flags, and a run function).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "moe/balance/placement.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/train/verify.h"

using namespace moe;

namespace {

struct Options {
  tools::CommonOptions common;
  std::vector<std::string> inputs;  // CKPT (a file or a sharded directory) or SHARD...
  std::string out, to, trace;
  int ranks = 0;
  bool json = false, verify = false, shard_embedding = false, force = false;
  std::string type = "q8_0";    // quantize --type
  bool allow_unmapped = false;  // import-hf
  bool keep_mxfp4 = false;      // import-hf
  int64_t max_seq = io::kHfDefaultMaxSeq;
  std::string gguf_type, gguf_name;  // export-gguf
  int64_t max_shard_mb = 0;          // export-hf
};

// The command line, for the provenance of every file written.
struct Argv {
  int argc;
  char** argv;
};

std::string num(double v) {
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

std::string shape_text(const Shape& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
}

void refuse_stdout(const std::string& out) {
  MOE_USAGE_CHECK(out != "-", "-o -: checkpoints are written to files, not to stdout");
}

// A file output (-o FILE) is checked before any work: never a device, FIFO or link, and an
// existing file only with --force (as partition's output directory).
void check_file_output(const Options& o) {
  refuse_stdout(o.out);
  io::check_output_file(o.out, o.force);
}

// Parameters holding NaN or Inf are refused as every model loader refuses them, so that no
// conversion writes one (change_dtype itself refuses values beyond the target's range). The input
// is opened lazily (io::open_whole): each tensor is checked when the conversion reads it, so the
// model passes through memory once, one tensor at a time.
io::Checkpoint open_checked(const Options& o, bool with_optim, bool* merged) {
  io::Checkpoint in = io::open_whole(o.inputs, with_optim, merged);
  io::check_finite_when_read(str("'", o.inputs.at(0), "'"), in.params);
  return in;
}

// A Q8_0 checkpoint (moe-convert quantize) is for moe-infer only: the other conversions refuse it.
void refuse_quantized(const io::Checkpoint& c, const Options& o, const char* command) {
  io::refuse_quantized(c.model_config, o.inputs.at(0), str("moe-convert ", command));
}

// The file converted outputs take their history from: the input, or rank 0's file of it.
nlohmann::json history_of(const std::vector<std::string>& inputs, const io::Provenance& source) {
  return io::extend_history(io::read_history(io::checkpoint_files(inputs).at(0)), source);
}

// ---- inspect ----------------------------------------------------------------------------------

int run_inspect(Options& o, const Argv&) {
  io::CheckpointInfo info = io::inspect(o.inputs);
  if (o.verify) {  // every chunk checksummed, and every check moe-train --resume makes
    train::verify_checkpoint(o.inputs);
    info.verified = true;
  }
  if (o.json) {
    std::printf("%s\n", io::to_json(info).dump().c_str());
    return tools::finish_stdout("moe-convert");
  }
  for (const io::FileInfo& f : info.files) {
    const io::Provenance& p = f.provenance;
    std::printf("# file\t%s\n", f.path.c_str());
    std::printf("# producer\t%s %s (git %s)\tcreated %s\targv %s\n", p.tool.c_str(),
                p.version.c_str(), p.git.c_str(), p.time.c_str(), p.argv.c_str());
    for (const nlohmann::json& h : f.history)
      std::printf("# converted from\t%s %s (git %s)\tcreated %s\targv %s\n",
                  h.value("tool", "").c_str(), h.value("version", "").c_str(),
                  h.value("git", "").c_str(), h.value("created", "").c_str(),
                  h.value("argv", "").c_str());
    std::printf("# state\tstep %lld\ttokens_seen %lld\tdata_cursor %lld\tseed %llu\n",
                (long long)f.state.step, (long long)f.state.tokens_seen,
                (long long)f.state.data_cursor, (unsigned long long)f.state.seed);
    std::string map;
    for (size_t i = 0; i < f.sharding.expert_rank.size(); ++i) {
      if (i) map += ',';
      map += std::to_string(f.sharding.expert_rank[i]);
    }
    std::printf(
        "# sharding\tworld_size %d\tep_size %d\trank %s\tshard_embedding %d\texpert_rank %s\n",
        f.sharding.world_size, f.sharding.ep_size,
        f.sharding.rank < 0 ? "-" : std::to_string(f.sharding.rank).c_str(),
        f.sharding.shard_embedding ? 1 : 0, map.empty() ? "-" : map.c_str());
  }
  std::printf("# model_config\t%s\n", info.model_config.dump().c_str());
  std::printf("# train_config\t%s\n", info.train_config.dump().c_str());
  std::printf("# tokenizer\t%s\n", info.tokenizer.empty() ? "-" : info.tokenizer.c_str());
  std::printf("# params_total\t%lld\n", (long long)info.params_total);
  std::printf("# params_active_per_token\t%lld\n", (long long)info.params_active_per_token);
  std::printf("# bytes\tparams %lld\toptim %lld\n", (long long)info.param_bytes,
              (long long)info.optim_bytes);
  for (const io::MoELayerInfo& l : info.layers)
    std::printf("# moe_layer %lld\tblock %lld\texperts %lld\trank %s\tstored_bytes %lld\t%s\t%s\n",
                (long long)l.layer, (long long)l.block, (long long)l.experts,
                l.rank < 0 ? "-" : std::to_string(l.rank).c_str(), (long long)l.stored_bytes,
                l.contiguous() ? "one extent" : str("spread over ", l.extent, " bytes").c_str(),
                l.experts_contiguous ? "each expert one run" : "experts split by tensor");
  if (info.verified) std::printf("# verified\tevery tensor read and checksummed\n");
  std::printf("group\tname\tdtype\tshape\tbytes\texpert\trank\tshard\tchunk\tchecksum\n");
  for (const io::TensorInfo& t : info.tensors) {
    std::string shard = "-";
    if (t.shard.defined())
      shard = str("dim ", t.shard.dim, " from ", t.shard.start, " of ", shape_text(t.shard.global));
    std::printf("%s\t%s\t%s\t%s\t%lld\t%d\t%s\t%s\t%s\t%s\n", t.group.c_str(), t.name.c_str(),
                dtype_name(t.dtype), shape_text(t.shape).c_str(), (long long)t.bytes,
                t.expert ? 1 : 0, t.rank < 0 ? "-" : std::to_string(t.rank).c_str(), shard.c_str(),
                t.chunk.empty() ? "contiguous" : shape_text(t.chunk).c_str(),
                t.filtered ? "fletcher32" : "-");
  }
  return tools::finish_stdout("moe-convert");
}

// ---- dtype, freeze, merge ---------------------------------------------------------------------

int run_dtype(Options& o, const Argv& a) {
  check_file_output(o);
  bool merged = false;
  io::Checkpoint in = open_checked(o, true, &merged);
  refuse_quantized(in, o, "dtype");
  const DType to = parse_dtype(o.to);
  io::DTypeReport report;
  io::Checkpoint out = io::change_dtype(in, to, &report);
  out.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::save_converted(o.out, out, history_of(o.inputs, in.provenance));
  MOE_LOG_INFO("dtype ", o.to, ": ", report.tensors_converted, " parameter tensors converted (max ",
               "relative error ", num(report.max_relative_error), ")",
               in.optim.empty() ? std::string(", no optimizer state")
                                : str(", optimizer state fp32: ", report.masters_added,
                                      " fp32 masters added, ", report.masters_used, " used, ",
                                      report.masters_dropped, " became parameters"),
               merged ? ", shards merged" : "", "; wrote ", o.out);
  return 0;
}

int run_freeze(Options& o, const Argv& a) {
  check_file_output(o);
  bool merged = false;
  io::Checkpoint in = open_checked(o, true, &merged);
  refuse_quantized(in, o, "freeze");
  io::Checkpoint out = io::freeze(in);
  out.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::save_streaming(o.out, out, history_of(o.inputs, in.provenance));
  MOE_LOG_INFO("froze ", out.params.size(), " parameter tensors (dropped ", in.optim.size(),
               " optimizer tensors and the training state)", merged ? ", shards merged" : "",
               "; wrote ", o.out);
  return 0;
}

int run_merge(Options& o, const Argv& a) {
  check_file_output(o);
  const std::vector<std::string> files = io::checkpoint_files(o.inputs);
  io::Checkpoint merged = io::open_merged(files);  // read as it is written: bounded memory
  refuse_quantized(merged, o, "merge");
  io::check_finite_when_read(str("'", o.inputs.at(0), "'"), merged.params);
  const io::Provenance source = merged.provenance;
  merged.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::save_converted(o.out, merged, history_of(o.inputs, source));
  MOE_LOG_INFO("merged ", files.size(), " shard files into ", merged.params.size(),
               " parameter and ", merged.optim.size(), " optimizer tensors; wrote ", o.out);
  return 0;
}

int run_quantize(Options& o, const Argv& a) {
  check_file_output(o);
  bool merged = false;
  io::Checkpoint in = open_checked(o, true, &merged);
  io::QuantReport report;
  io::Checkpoint out = io::quantize(in, o.type, &report);
  out.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::save_streaming(o.out, out, history_of(o.inputs, in.provenance));
  std::string per_format, error;
  for (const auto& [format, count] : report.tensors_per_format)
    per_format += str(per_format.empty() ? "" : ", ", count, " ", format);
  if (o.type == "q8_0")
    error = str("max |error| ", num(report.max_error_over_scale), " of a block's scale");
  else
    error = str("RMS error ", num(report.rms_relative_error()), " of the RMS value",
                report.tensors_kept
                    ? str("; ", report.tensors_kept, " kept unquantised: rows not whole blocks")
                    : std::string());
  MOE_LOG_INFO("quantize ", o.type, ": ", report.tensors_quantized, " weight tensors (", per_format,
               "), parameters ", report.bytes_before, " -> ", report.bytes_after, " bytes (", error,
               ")", merged ? ", shards merged" : "", "; wrote ", o.out);
  return 0;
}

// ---- partition --------------------------------------------------------------------------------

int run_partition(Options& o, const Argv& a) {
  refuse_stdout(o.out);
  bool merged = false;
  io::Checkpoint whole = open_checked(o, true, &merged);
  refuse_quantized(whole, o, "partition");
  io::PartitionOptions options;
  options.ranks = o.ranks;
  options.shard_embedding = o.shard_embedding;
  std::vector<io::LayerPlacement> plan;
  if (!o.trace.empty()) {
    io::TraceReader trace(o.trace);
    plan = io::plan_placement(model_config_from_json(whole.model_config), trace, o.ranks);
    for (const io::LayerPlacement& p : plan) options.placement.push_back(p.lpt);
  }
  std::vector<io::Checkpoint> files = io::partition(whole, options);
  const io::Provenance source = whole.provenance;
  for (io::Checkpoint& c : files) c.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::save_sharded(o.out, files, o.force, history_of(o.inputs, source));
  if (!plan.empty()) {
    std::printf(
        "layer\tblock\texperts\tranks\tassignments\tlpt_max_over_mean\tcontiguous_max_over_mean\t"
        "round_robin_max_over_mean\tlpt_expert_rank\n");
    for (const io::LayerPlacement& p : plan) {
      int64_t total = 0;
      for (int64_t l : p.loads) total += l;
      std::string map;
      for (size_t e = 0; e < p.lpt.size(); ++e) {
        if (e) map += ',';
        map += std::to_string(p.lpt[e]);
      }
      std::printf("%lld\t%lld\t%lld\t%d\t%lld\t%s\t%s\t%s\t%s\n", (long long)p.layer,
                  (long long)p.block, (long long)p.experts, o.ranks, (long long)total,
                  num(p.lpt_max_over_mean).c_str(), num(p.contiguous_max_over_mean).c_str(),
                  num(p.round_robin_max_over_mean).c_str(), map.c_str());
    }
  }
  bool contiguous = true;
  for (const io::LayerPlacement& p : plan)
    contiguous &= balance::is_contiguous_placement(p.lpt, o.ranks);
  MOE_LOG_INFO("partitioned into ", o.ranks, " rank files", merged ? " (input shards merged)" : "",
               plan.empty() ? " (contiguous experts)"
               : contiguous ? " (LPT placement is the contiguous one)"
                            : " (LPT placement recorded in /sharding expert_rank; moe-train "
                              "resumes only the contiguous layout)",
               "; wrote ", o.out);
  return plan.empty() ? 0 : tools::finish_stdout("moe-convert");
}

// ---- Hugging Face ---------------------------------------------------------------------------

int run_import_hf(Options& o, const Argv& a) {
  check_file_output(o);
  io::HfImportOptions options;
  options.allow_unmapped = o.allow_unmapped;
  options.keep_mxfp4 = o.keep_mxfp4;
  options.max_seq = o.max_seq;
  options.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::HfImportReport report;
  io::Checkpoint ckpt;
  try {
    ckpt = io::import_hf(o.inputs.at(0), options, &report);
  } catch (const Error&) {
    for (const std::string& u : report.unsupported) MOE_LOG_WARN("unsupported: ", u);
    for (const std::string& u : report.unmapped) MOE_LOG_WARN("unmapped: ", u);
    throw;
  }
  for (const std::string& n : report.notes) MOE_LOG_INFO("note: ", n);
  for (const std::string& u : report.unmapped) MOE_LOG_INFO("unmapped (--allow-unmapped): ", u);
  for (const std::string& m : report.mapped) MOE_LOG_DEBUG("mapped: ", m);
  io::save_checkpoint(o.out, ckpt);
  MOE_LOG_INFO("imported a ", report.family, " checkpoint: ", report.mapped.size(),
               " source tensors mapped, ", report.unmapped.size(), " left out; ",
               ckpt.params.size(), " parameter tensors; wrote ", o.out);
  return 0;
}

int run_export_hf(Options& o, const Argv&) {
  refuse_stdout(o.out);
  bool merged = false;
  io::Checkpoint in = open_checked(o, false, &merged);
  // gpt-oss's kept MXFP4 experts go out as the released checkpoints' _blocks / _scales.
  if (model_config_from_json(in.model_config).arch != Arch::gpt_oss ||
      io::quantization_of(in.model_config) != "mxfp4")
    refuse_quantized(in, o, "export-hf");
  io::HfExportOptions options;
  options.max_shard_bytes = o.max_shard_mb * 1000 * 1000;
  options.replace = o.force;
  io::export_hf(in, o.out, options);
  MOE_LOG_INFO(
      "exported ", in.params.size(), " parameter tensors as a Hugging Face ",
      arch_name(model_config_from_json(in.model_config).arch), " directory (config.json, ",
      options.max_shard_bytes > 0 ? "safetensors shards and their index" : "model.safetensors", ")",
      merged ? ", shards merged" : "", "; wrote ", o.out);
  return 0;
}

int run_export_gguf(Options& o, const Argv&) {
  check_file_output(o);
  bool merged = false;
  io::Checkpoint in = open_checked(o, false, &merged);
  // A block recipe's tensors (q4_k, q6_k, mxfp4, the Q4_K_M mix, GGUF's q8_0 blocks, gpt-oss's
  // released MXFP4 experts) are GGUF's own bytes and go out as they are; the whole-checkpoint
  // q8_0 recipe holds our Q8_0 rows: export the original with --type q8_0 instead.
  if (io::quantization_of(in.model_config) == "q8_0") refuse_quantized(in, o, "export-gguf");
  io::GgufExportOptions options;
  // Default: the checkpoint's own dtype (a bf16 model stays bf16).
  const ModelConfig mc = model_config_from_json(in.model_config);
  options.q4_k_m = o.gguf_type == "q4_k_m";
  options.type = io::parse_gguf_type(o.gguf_type.empty() ? dtype_name(mc.dtype)
                                     : options.q4_k_m    ? "q4_k"
                                                         : o.gguf_type);
  options.name = o.gguf_name;
  const io::GgufExportSummary s = io::export_gguf(in, o.out, options);
  for (const std::string& f : s.fallbacks) MOE_LOG_WARN("export-gguf: ", f);
  for (const std::string& n : s.notes) MOE_LOG_INFO("note: ", n);
  MOE_LOG_INFO("exported ", s.tensors, " tensors (",
               options.q4_k_m ? "q4_k_m" : io::gguf_type_name(options.type), " matrices) and ",
               s.keys, " keys as GGUF v3 for llama.cpp", merged ? ", shards merged" : "",
               "; wrote ", o.out, " (", s.bytes, " bytes)");
  return 0;
}

int run_import_gguf(Options& o, const Argv& a) {
  check_file_output(o);
  io::GgufImportOptions options;
  options.max_seq = o.max_seq;
  options.provenance = io::make_provenance("moe-convert", a.argc, a.argv);
  io::GgufImportReport report;
  const io::Checkpoint ckpt = io::import_gguf(o.inputs.at(0), options, &report);
  for (const std::string& n : report.notes) MOE_LOG_INFO("note: ", n);
  for (const std::string& m : report.mapped) MOE_LOG_DEBUG("mapped: ", m);
  io::save_checkpoint(o.out, ckpt);
  MOE_LOG_INFO("imported a GGUF ", report.architecture, " model as ", report.family,
               report.quantized ? " (" + report.recipe + " weights)" : "", ": ", ckpt.params.size(),
               " parameter tensors; wrote ", o.out);
  return 0;
}

// ---- the subcommand table ---------------------------------------------------------------------

struct Subcommand {
  CLI::App* app;
  int (*run)(Options&, const Argv&);
};

void add_checkpoint_input(CLI::App* sub, Options& o) {
  sub->add_option("checkpoint", o.inputs,
                  "Checkpoint file, sharded checkpoint directory, moe-train output directory, "
                  "or the rank files of a sharded checkpoint")
      ->required();
}

void add_output(CLI::App* sub, Options& o, const char* what, bool file = true) {
  sub->add_option("-o,--out", o.out, what)->required();
  if (file) sub->add_flag("--force", o.force, "Replace an existing output file");
}

// inspect: what a checkpoint holds.
void add_inspect_command(CLI::App& app, Options& o, std::vector<Subcommand>& subs) {
  auto* inspect =
      app.add_subcommand("inspect",
                         "Config, every tensor (dtype, shape, bytes, storage), parameter counts, "
                         "sharding and provenance, as TSV (or --json)");
  add_checkpoint_input(inspect, o);
  inspect->add_flag("--json", o.json, "One JSON object instead of TSV");
  inspect->add_flag(
      "--verify", o.verify,
      "Also read every tensor (checksums), check that shards fit together, and make every "
      "check moe-train --resume makes (tensors, shapes, optimizer state)");
  subs.push_back({inspect, run_inspect});
}

// dtype, freeze, quantize: one checkpoint into another.
void add_conversion_commands(CLI::App& app, Options& o, std::vector<Subcommand>& subs) {
  auto* dtype = app.add_subcommand(
      "dtype", "Convert the parameters to another dtype (optimizer state stays fp32)");
  add_checkpoint_input(dtype, o);
  dtype->add_option("--to", o.to, "Parameter dtype")
      ->required()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  add_output(dtype, o, "Output checkpoint file");
  subs.push_back({dtype, run_dtype});
  auto* freeze = app.add_subcommand(
      "freeze", "An inference checkpoint: no optimizer or training state, experts per layer");
  add_checkpoint_input(freeze, o);
  add_output(freeze, o, "Output checkpoint file");
  subs.push_back({freeze, run_freeze});
  auto* quantize = app.add_subcommand(
      "quantize",
      "An inference checkpoint with the weight matrices quantised (q8_0: blocks of 32, one f16 "
      "scale each, int8 values; q4_k, q6_k, mxfp4, q4_k_m: llama.cpp's block formats): read by "
      "moe-infer only");
  add_checkpoint_input(quantize, o);
  quantize
      ->add_option("--type", o.type,
                   "q8_0, or a llama.cpp block recipe: q4_k, q6_k, mxfp4, q4_k_m (q4_k with "
                   "q6_k for the LM head and some layers' attention v and expert down)")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8_0", "q4_k", "q6_k", "mxfp4", "q4_k_m"}));
  add_output(quantize, o, "Output checkpoint file");
  subs.push_back({quantize, run_quantize});
}

// merge, partition: between one file and expert-parallel shards.
void add_reshard_commands(CLI::App& app, Options& o, std::vector<Subcommand>& subs) {
  auto* merge = app.add_subcommand(
      "merge", "A sharded checkpoint (its directory or every rank file) into one file");
  merge->add_option("shards", o.inputs, "Sharded checkpoint directory, or its rank-*.h5 files")
      ->required();
  add_output(merge, o, "Output checkpoint file");
  subs.push_back({merge, run_merge});
  auto* part = app.add_subcommand(
      "partition", "Shard a checkpoint for N expert-parallel ranks (moe-train's sharded layout)");
  add_checkpoint_input(part, o);
  part->add_option("--ranks", o.ranks, "Expert-parallel ranks N (world size of the shards)")
      ->required()
      ->check(tools::positive());
  part->add_option("--trace", o.trace,
                   "Routing trace (moe-profile record, moe-train --trace): place experts by LPT "
                   "on their profiled load and print the predicted balance per layer");
  part->add_flag("--shard-embedding", o.shard_embedding,
                 "Also split the token table by columns over the ranks (untied head)");
  part->add_flag("--force", o.force, "Replace an existing output directory");
  add_output(part, o, "Output directory (rank-<5 digits>.h5 files)", false);
  subs.push_back({part, run_partition});
}

// import-hf, export-hf: Hugging Face directories.
void add_hf_commands(CLI::App& app, Options& o, std::vector<Subcommand>& subs) {
  auto* import = app.add_subcommand(
      "import-hf",
      "A Hugging Face MoE checkpoint directory (config.json + *.safetensors: Mixtral, "
      "Qwen2-MoE, Qwen3-MoE, OLMoE, GLM-4-MoE, DeepSeek-V2/V3, gpt-oss) into one checkpoint");
  import->add_option("dir", o.inputs, "Hugging Face model directory")->required()->expected(1);
  import->add_flag("--allow-unmapped", o.allow_unmapped,
                   "Leave out source tensors that map to nothing (listed on stderr) instead of "
                   "failing");
  import->add_flag(flag_for(Setting::keep_mxfp4), o.keep_mxfp4,
                   "Keep gpt-oss's MXFP4 experts (_blocks/_scales) as mxfp4 blocks, bit-exact, "
                   "instead of dequantising them");
  import
      ->add_option("--max-seq", o.max_seq,
                   "Cap the context (scoring window, KV cache) at this; 0 = "
                   "max_position_embeddings")
      ->check(tools::non_negative())
      ->capture_default_str();
  add_output(import, o, "Output checkpoint file");
  subs.push_back({import, run_import_hf});
  auto* exporter = app.add_subcommand(
      "export-hf",
      "A mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe or deepseek_v3 checkpoint as a Hugging "
      "Face directory of that family (a softmax-routed deepseek_v3 as deepseek_v2)");
  add_checkpoint_input(exporter, o);
  exporter
      ->add_option("--max-shard-size", o.max_shard_mb,
                   "Write safetensors shards of at most this many MB (10^6 bytes) and "
                   "model.safetensors.index.json, as save_pretrained does (0: one "
                   "model.safetensors)")
      ->check(tools::non_negative())
      ->capture_default_str();
  add_output(exporter, o, "Output directory (config.json, model.safetensors)", false);
  exporter->add_flag("--force", o.force,
                     "Replace the files of an earlier export in the output directory");
  subs.push_back({exporter, run_export_hf});
}

// export-gguf, import-gguf: llama.cpp's files.
void add_gguf_commands(CLI::App& app, Options& o, std::vector<Subcommand>& subs) {
  auto* gguf =
      app.add_subcommand("export-gguf",
                         "A mixtral, qwen2_moe, qwen3_moe, olmoe, glm4_moe, deepseek_v3 or "
                         "gpt_oss checkpoint as a GGUF v3 file for llama.cpp (its llama (with "
                         "experts), qwen2moe, qwen3moe, olmoe, glm4moe, deepseek2 or gpt-oss "
                         "architecture)");
  add_checkpoint_input(gguf, o);
  gguf->add_option("--type", o.gguf_type,
                   "Type of the matrices: f32, f16, bf16, q8_0, q4_k, q6_k, mxfp4 or q4_k_m "
                   "(llama.cpp's mix of q4_k and q6_k) (default: the checkpoint's dtype); norms "
                   "and the router stay f32")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_k", "q6_k", "mxfp4", "q4_k_m"}));
  gguf->add_option("--name", o.gguf_name, "general.name in the file (default: moe)");
  add_output(gguf, o, "Output .gguf file");
  subs.push_back({gguf, run_export_gguf});
  auto* import_gguf = app.add_subcommand(
      "import-gguf",
      "A GGUF v3 file (llama.cpp's llama with experts, qwen2moe, qwen3moe, olmoe, glm4moe, "
      "deepseek2 or gpt-oss; f32, f16, bf16, q8_0, q4_K, q6_K or MXFP4 tensors, deepseek2's latent "
      "attention f32/f16/bf16) into one checkpoint (quantised weights keep their blocks)");
  import_gguf->add_option("file", o.inputs, "GGUF file")->required()->expected(1);
  import_gguf
      ->add_option("--max-seq", o.max_seq,
                   "Cap the context (scoring window, KV cache) at this; 0 = the file's "
                   "context_length")
      ->check(tools::non_negative())
      ->capture_default_str();
  add_output(import_gguf, o, "Output checkpoint file");
  subs.push_back({import_gguf, run_import_gguf});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-convert: inspect, convert (dtype, freeze), re-shard (merge, partition) and "
      "import/export Hugging Face checkpoints.",
      "moe-convert"};
  Options o;
  tools::add_common_options(app, o.common, "moe-convert");
  app.require_subcommand(1);
  app.fallthrough();  // common flags (-q, --threads, ...) also after the subcommand

  std::vector<Subcommand> subs;
  add_inspect_command(app, o, subs);
  add_conversion_commands(app, o, subs);
  add_reshard_commands(app, o, subs);
  add_hf_commands(app, o, subs);
  add_gguf_commands(app, o, subs);

  return tools::run_tool("moe-convert", app, argc, argv, [&]() -> int {
    tools::apply_common_options(o.common);
    const Argv a{argc, argv};
    for (const Subcommand& s : subs)
      if (*s.app) return s.run(o, a);
    throw UsageError("no subcommand given");
  });
}

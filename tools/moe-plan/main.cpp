// moe-plan: size a training run before paying for it. Each subcommand is a thin driver of one
// library call (moe/plan/predict.h, search.h, calibrate.h); adding one is a `Subcommand` entry in
// main() (a setup that declares its flags, and a run function).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "io/files.h"
#include "moe/comm/communicator.h"
#include "moe/io/checkpoint.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/plan/calibrate.h"
#include "moe/plan/plan_svg.h"
#include "moe/plan/predict.h"
#include "moe/plan/search.h"

using namespace moe;

namespace {

struct Options {
  tools::CommonOptions common;
  plan::PredictRequest predict;
  plan::SearchRequest search;
  bool json = false;
  std::string format = "tsv", svg;  // search's output; predict's and search's picture
  int64_t top = 10;
  std::string out, scratch, device = "cpu", argv;  // calibrate
  bool quick = false, force = false;
};

// --svg: a name ending in .svg (usage, exit 2, before any work), replaced only with --force.
void check_svg(const Options& o) {
  if (o.svg.empty()) return;
  if (std::filesystem::path(o.svg).extension() != ".svg")
    throw UsageError(str("--svg ", o.svg, ": the picture is SVG; name the file *.svg"));
  io::check_output_file(o.svg, o.force);
}

void write_svg(const Options& o, const plan::Prediction& p, const std::string& title) {
  if (o.svg.empty()) return;
  io::write_text_atomic(o.svg, plan::prediction_svg(p, title));
  MOE_LOG_INFO("wrote ", o.svg);
}

int run_predict(Options& o) {
  check_svg(o);
  const plan::Prediction p = plan::predict(o.predict);
  write_svg(o, p, "moe-plan predict: " + o.predict.model + " on '" + p.cluster.name + "'");
  if (o.json) {
    std::printf("%s\n", plan::prediction_json(p).dump(2).c_str());
  } else {
    for (const std::string& line : plan::prediction_tsv(p)) std::printf("%s\n", line.c_str());
  }
  return tools::finish_stdout("moe-plan");
}

// Every legal layout, ranked; the top one's picture with --svg.
int run_search(Options& o) {
  check_svg(o);
  const plan::SearchResult r = plan::search(plan::read_search_inputs(o.search));
  MOE_LOG_INFO(r.summary());
  write_svg(o, r.ranked.front().prediction,
            "moe-plan search: the fastest of " + std::to_string(r.ranked.size()) +
                " layouts that fit '" + r.inputs.cluster.name + "'");
  if (o.format == "json") {
    std::printf("%s\n", plan::search_json(r, o.top).dump(2).c_str());
  } else {
    for (const std::string& line : plan::search_tsv(r, o.top)) std::printf("%s\n", line.c_str());
  }
  return tools::finish_stdout("moe-plan");
}

// Measures this machine and writes its cluster spec (rank 0 under mpiexec; every rank measures).
int run_calibrate(Options& o) {
  io::check_output_file(o.out, o.force);
  const std::unique_ptr<comm::Communicator> world = comm::make_world();
  plan::CalibrateOptions c;
  c.quick = o.quick;
  const std::string out_dir = std::filesystem::path(o.out).parent_path().string();
  if (!out_dir.empty() && !std::filesystem::is_directory(out_dir))
    throw Error(str("cannot write '", o.out, "': directory '", out_dir, "' does not exist"));
  c.scratch_dir = !o.scratch.empty() ? o.scratch : out_dir.empty() ? "." : out_dir;
  c.device = Device::parse(o.device);
  c.world = world.get();
  if (world->rank() == 0) c.progress = [](const std::string& line) { MOE_LOG_INFO(line); };
  const plan::Calibration cal = plan::calibrate(c);
  if (world->rank() != 0) return 0;
  for (const std::string& line : cal.unmeasured) MOE_LOG_WARN(line);
  plan::SpecNotes notes = cal.notes;
  notes.header.push_back("command: " + o.argv);
  plan::write_cluster_file(o.out, cal.spec, notes);
  MOE_LOG_INFO("wrote ", o.out);
  return 0;
}

const char* const kModelHelp =
    "Checkpoint (.h5), model config (.json), or a Hugging Face model (its directory or "
    "config.json: read as import-hf reads it, not converted)";

void add_svg_options(CLI::App* sub, Options& o) {
  sub->add_option("--svg", o.svg,
                  "Also draw the step time's terms and the memory per tier as an SVG picture");
  sub->add_flag("--force", o.force, "Replace an existing --svg file");
}

CLI::App* add_search(CLI::App& app, Options& o) {
  auto* s = app.add_subcommand(
      "search",
      "Every legal layout of the model on the cluster, predicted, those that do not fit memory "
      "dropped, the rest ranked by tokens/s and the top few explained");
  auto& r = o.search;
  s->add_option("--model", r.model, kModelHelp)->required();
  s->add_option("--trace", r.trace, "Routing trace (moe-profile record, moe-train --trace)")
      ->required();
  s->add_option("--cluster", r.cluster, "Cluster spec (TOML; see specs/clusters/)")->required();
  s->add_option("--ranks", r.ranks,
                "Use this many of the cluster's devices: part of one node or whole nodes (0: all)")
      ->check(tools::non_negative())
      ->capture_default_str();
  s->add_option("--batch", r.batch, "Sequences per rank and step")
      ->check(tools::positive())
      ->capture_default_str();
  s->add_option("--seq", r.seq, "Tokens per sequence (0: the model's context)")
      ->check(tools::non_negative())
      ->capture_default_str();
  s->add_option("--top", o.top, "Layouts to print, fastest first (0: all that fit)")
      ->check(tools::non_negative())
      ->capture_default_str();
  s->add_option("--format", o.format, "tsv or json")
      ->check(CLI::IsMember({"tsv", "json"}))
      ->capture_default_str();
  add_svg_options(s, o);
  return s;
}

struct Subcommand {
  CLI::App* app;
  int (*run)(Options&);
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-plan: predict the memory per device and the step time of a training layout on a "
      "cluster, from a model and a routing trace.",
      "moe-plan"};
  Options o;
  o.argv = io::join_argv(argc, argv);
  tools::add_common_options(app, o.common, "moe-plan");
  app.require_subcommand(1);
  app.fallthrough();

  std::vector<Subcommand> subs;
  auto* predict = app.add_subcommand(
      "predict",
      "Memory per device by tier (device, host, SSD: what does not fit, by how much) and the "
      "step time term by term, as TSV (or --json)");
  auto& r = o.predict;
  predict->add_option("--model", r.model, kModelHelp)->required();
  predict->add_option("--trace", r.trace, "Routing trace (moe-profile record, moe-train --trace)")
      ->required();
  predict->add_option("--cluster", r.cluster, "Cluster spec (TOML; see specs/clusters/)")
      ->required();
  predict
      ->add_option("--layout", r.layout,
                   "Layout: ep=N,dp=N,zero=0..3,offload=none|host|ssd,placement=static|lpt|"
                   "flexmoe,a2a=flat|hierarchical,scheduler=off|priority (unset keys: defaults)")
      ->capture_default_str();
  predict->add_option("--batch", r.batch, "Sequences per rank and step")
      ->check(tools::positive())
      ->capture_default_str();
  predict->add_option("--seq", r.seq, "Tokens per sequence (0: the model's context)")
      ->check(tools::non_negative())
      ->capture_default_str();
  predict->add_flag("--json", o.json, "One JSON object instead of TSV");
  add_svg_options(predict, o);
  subs.push_back({predict, run_predict});
  subs.push_back({add_search(app, o), run_search});

  auto* calibrate = app.add_subcommand(
      "calibrate",
      "Measure this machine (GEMM, memcpy, host<->device, SSD, AdamW; the links between ranks "
      "under mpiexec) and write its cluster spec");
  calibrate->add_option("-o,--out", o.out, "The cluster spec to write (TOML)")->required();
  calibrate->add_flag("--force", o.force, "Replace an existing output file");
  calibrate->add_flag("--quick", o.quick, "Small sizes and few repetitions (seconds)");
  calibrate->add_option("--scratch", o.scratch,
                        "Directory for the SSD test file (default: the output's directory)");
  calibrate->add_option("--device", o.device, "cpu, or cuda (a GPU of a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  subs.push_back({calibrate, run_calibrate});

  return tools::run_tool("moe-plan", app, argc, argv, [&]() -> int {
    tools::apply_common_options(o.common);
    for (const Subcommand& s : subs)
      if (*s.app) return s.run(o);
    throw UsageError("no subcommand given");
  });
}

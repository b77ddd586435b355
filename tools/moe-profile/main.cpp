// moe-profile: record which experts every token takes (HDF5 routing traces), summarise expert
// popularity, build and check Lina's path-based popularity estimator, plot traces and training
// curves. The work is in libmoe (moe/io/trace.h, moe/profile/{record,summary,paths,plot,curves}.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "io/files.h"
#include "moe/comm/communicator.h"
#include "moe/infer/model.h"
#include "moe/io/dataset.h"
#include "moe/io/model_text.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/models/memory.h"
#include "moe/profile/curves.h"
#include "moe/profile/paths.h"
#include "moe/profile/plot.h"
#include "moe/profile/record.h"
#include "moe/profile/summary.h"

using namespace moe;

namespace {

struct Options {
  tools::CommonOptions common;
  // record
  std::string model, data, data_format = "auto", out, device = "cpu", tokenizer;
  int64_t batch = 8, max_tokens = 0;
  bool read_weights = false, verify_weights = false;
  // summary / paths / accuracy / plot
  std::string trace, table;
  std::vector<std::string> metrics;  // plot-metrics
  bool json = false, per_expert = false;
  bool force = false;  // replace an existing -o FILE
  int64_t path_length = 2;
};

std::string num(double v) {
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// record runs in one process. Under a launcher's N ranks each would record the whole file, with
// whatever model and data its own flags name, into the same -o (the last rename winning): refused
// on every rank alike, before any work.
void check_one_process() {
  const std::unique_ptr<comm::Communicator> world = comm::make_world();
  if (world->size() > 1)
    throw UsageError(str("moe-profile record runs in one process; this job has ", world->size(),
                         " ranks, each of which would record the whole file into the same -o: "
                         "start it without mpiexec"));
}

int record(Options& o, int argc, char** argv) {
  check_one_process();
  io::check_output_stream(o.out, o.force);
  const Device device = tools::resolve_device(o.device);  // before any work
  infer::LoadedModel m =
      infer::load_model(o.model, true, nullptr, {!o.read_weights, o.verify_weights});
  m.params->to(device);  // the routing choices come back to the host for the trace
  // Text through the model's tokenizer (or --tokenizer), as moe-infer score reads it.
  const std::unique_ptr<io::Tokenizer> tokenizer =
      io::open_model_tokenizer(o.model, m.config.vocab_size, o.tokenizer);
  std::vector<int32_t> tokens =
      io::load_model_tokens(o.data, io::parse_token_format(o.data_format), tokenizer.get());
  io::check_tokens_fit(tokens, m.config.vocab_size, o.data);
  io::BatchSampler windows(&tokens, m.config.seq, 0, false, o.data);
  int64_t total = windows.num_windows();
  if (o.max_tokens > 0) total = std::min(total, std::max<int64_t>(1, o.max_tokens / m.config.seq));
  io::TraceInfo info =
      profile::trace_info(m.config, io::make_provenance("moe-profile", argc, argv), "record");
  if (info.moe_blocks.empty()) throw UsageError(str(o.model, ": the model has no MoE layer"));
  check_inference_activations(
      m.config, std::min(o.batch, total),
      str("recording ", std::min(o.batch, total), " windows of ", m.config.seq, " tokens a pass"),
      "a smaller --batch needs less");
  io::TraceWriter writer(o.out, info);
  tools::Progress progress(o.common.quiet);
  tools::Meter meter(progress);  // the trainer's cadence, rate and ETA
  Arena arena;
  EvalOptions eval;
  eval.capture_routing = true;
  for (int64_t done = 0; done < total;) {
    const int64_t b = std::min(o.batch, total - done);
    {
      ArenaScope scope(arena);
      Tensor ids, targets;
      windows.next(b, ids, targets);
      ForwardStats stats = m.model->evaluate(ids.to(device), targets.to(device), eval);
      writer.append(profile::trace_batch(info, stats, ids, -1));
    }
    arena.reset();
    done += b;
    meter.update(str("record ", done, "/", total, " sequences"), done, total, done * m.config.seq);
  }
  writer.close();
  progress.finish();
  MOE_LOG_INFO("recorded ", writer.tokens(), " tokens in ", writer.batches(), " batches, ",
               info.moe_blocks.size(), " MoE layers, top-", info.top_k,
               o.out == "-" ? std::string(" to stdout") : " to " + o.out);
  return 0;
}

int summary(Options& o) {
  io::TraceReader trace(o.trace);
  std::vector<profile::LayerSummary> layers = profile::summarize(trace);
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& s : layers) j.push_back(profile::to_json(s));
    std::printf("%s\n", j.dump().c_str());
  } else if (o.per_expert) {
    std::printf("layer\tblock\texpert\tcount\tshare\n");
    for (const auto& s : layers)
      for (int64_t e = 0; e < s.experts; ++e)
        std::printf(
            "%lld\t%lld\t%lld\t%lld\t%s\n", (long long)s.layer, (long long)s.block, (long long)e,
            (long long)s.counts[static_cast<size_t>(e)],
            num(s.assignments ? double(s.counts[static_cast<size_t>(e)]) / double(s.assignments)
                              : 0)
                .c_str());
  } else {
    std::printf(
        "layer\tblock\texperts\ttokens\tassignments\tmax_over_mean\tmax_over_min\tcv\t"
        "entropy_bits\tentropy_norm\ttop_experts\tdropped_fraction\n");
    for (const auto& s : layers) {
      std::string top;
      for (size_t i = 0; i < std::min<size_t>(3, s.top.size()); ++i)
        top += (i ? "," : "") + std::to_string(s.top[i]);
      std::printf("%lld\t%lld\t%lld\t%lld\t%lld\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", (long long)s.layer,
                  (long long)s.block, (long long)s.experts, (long long)s.tokens,
                  (long long)s.assignments, num(s.max_over_mean).c_str(),
                  num(s.max_over_min).c_str(), num(s.cv).c_str(), num(s.entropy_bits).c_str(),
                  num(s.entropy_norm).c_str(), top.c_str(), num(s.dropped_fraction).c_str());
    }
  }
  return tools::finish_stdout("moe-profile");
}

int paths(Options& o) {
  io::check_output_stream(o.out, o.force);
  io::TraceReader trace(o.trace);
  profile::PathTable table = profile::build_paths(trace, o.path_length);
  profile::save_paths(table, o.out);
  size_t count = 0;
  for (const auto& layer : table.next) count += layer.size();
  MOE_LOG_INFO("path table: ", count, " paths of length <= ", o.path_length, " over ",
               trace.tokens(), " tokens, ", table.next.size(), " predicted layers, to ",
               o.out == "-" ? std::string("stdout") : o.out);
  return 0;
}

int accuracy(Options& o) {
  profile::PathTable table = profile::load_paths(o.table);
  io::TraceReader trace(o.trace);
  // Everything is checked and computed before the first byte of the table: a failure leaves
  // stdout empty, not a header without rows.
  const std::vector<profile::LayerAccuracy> layers = profile::accuracy(table, trace);
  std::printf("layer\tblock\ttokens\taccuracy\tmarginal_accuracy\tunseen_paths\n");
  for (const profile::LayerAccuracy& a : layers)
    std::printf("%lld\t%lld\t%lld\t%s\t%s\t%lld\n", (long long)a.layer,
                (long long)trace.info().moe_blocks.at(static_cast<size_t>(a.layer)),
                (long long)a.tokens, num(a.accuracy()).c_str(), num(a.marginal_accuracy()).c_str(),
                (long long)a.unseen_paths);
  return tools::finish_stdout("moe-profile");
}

void check_svg_name(const std::string& out, const char* subcommand) {
  const std::string ext = std::filesystem::path(out).extension().string();
  if (ext != ".svg" && out != "-")
    throw UsageError(
        str("-o ", out, ": moe-profile ", subcommand, " writes SVG; name the file *.svg"));
}

int plot(Options& o) {
  check_svg_name(o.out, "plot");  // usage errors (exit 2) first
  io::check_output_stream(o.out, o.force);
  io::TraceReader trace(o.trace);
  std::string svg =
      profile::plot_svg(trace, "moe-profile: " + (o.trace == "-" ? "stdin" : o.trace));
  io::write_text_atomic(o.out, svg);  // "-": stdout
  MOE_LOG_INFO("wrote ", o.out == "-" ? std::string("the SVG to stdout") : o.out);
  return 0;
}

int plot_metrics(Options& o) {
  check_svg_name(o.out, "plot-metrics");
  if (std::count(o.metrics.begin(), o.metrics.end(), "-") > 1)
    throw UsageError("plot-metrics: '-' (stdin) can be given once");
  io::check_output_stream(o.out, o.force);
  std::vector<profile::MetricsRun> runs;
  for (const std::string& path : o.metrics) runs.push_back(profile::read_metrics(path));
  const std::string svg = profile::plot_metrics_svg(runs, "moe-profile: training curves");
  io::write_text_atomic(o.out, svg);  // "-": stdout
  MOE_LOG_INFO("wrote ", runs.size() == 1 ? std::string("1 run") : str(runs.size(), " runs"),
               " to ", o.out == "-" ? std::string("stdout") : o.out);
  return 0;
}

// The subcommands with -o: an existing file is replaced only with --force (each checks it after
// its usage checks, before any work).
void add_force(CLI::App* sub, Options& o) {
  sub->add_flag("--force", o.force, "Replace an existing output file");
}

// record: the model, the data and how it runs.
CLI::App* add_record_command(CLI::App& app, Options& o) {
  auto* rec = app.add_subcommand("record", "Run the model over a file and record its routing");
  rec->add_option("--model", o.model,
                  "Checkpoint file, or a moe-train output directory (its last.h5)")
      ->required();
  rec->add_option("--data", o.data, "Text or .u16/.u32 token file")->required();
  rec->add_option("--data-format", o.data_format, "auto, text, u16 or u32")
      ->check(CLI::IsMember({"auto", "text", "u16", "u32"}))
      ->capture_default_str();
  rec->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json or tokenizer.model (or a directory holding one) for text data; "
                  "default: the one stored in the checkpoint, else text is read as bytes");
  rec->add_option("-o,--out", o.out, "Trace file ('-' = stdout, as an HDF5 file image)")
      ->required();
  add_force(rec, o);
  tools::add_device_option(*rec, o.device, "where the model runs");
  tools::add_weight_options(*rec, o.read_weights, o.verify_weights);
  rec->add_option("--batch", o.batch, "Sequences per forward pass")
      ->check(tools::positive())
      ->capture_default_str();
  rec->add_option("--max-tokens", o.max_tokens, "Stop after about this many tokens (0 = the file)")
      ->check(tools::non_negative())
      ->capture_default_str();
  return rec;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-profile: record, summarise and model which experts the tokens take.",
               "moe-profile"};
  Options o;
  tools::add_common_options(app, o.common, "moe-profile");
  app.require_subcommand(1);
  app.fallthrough();  // common flags (-q, --threads, ...) also after the subcommand

  CLI::App* rec = add_record_command(app, o);

  auto* sum = app.add_subcommand("summary", "Per-layer expert popularity as TSV (or JSON)");
  sum->add_option("trace", o.trace, "Trace file ('-' = stdin)")->required();
  sum->add_flag("--json", o.json, "One JSON array instead of TSV");
  sum->add_flag("--per-expert", o.per_expert, "One TSV row per layer and expert");

  auto* pth = app.add_subcommand("paths", "Build Lina's path-based popularity table");
  pth->add_option("trace", o.trace, "Trace file ('-' = stdin)")->required();
  pth->add_option("--path-length", o.path_length, "Experts of the previous layers in a path")
      ->check(tools::positive())
      ->capture_default_str();
  pth->add_option("-o,--out", o.out, "Path table (JSON; '-' = stdout)")->required();
  add_force(pth, o);

  auto* acc =
      app.add_subcommand("accuracy", "How often the table's top-2k set holds a token's experts");
  acc->add_option("table", o.table, "Path table from 'moe-profile paths'")->required();
  acc->add_option("trace", o.trace, "Held-out trace ('-' = stdin)")->required();

  auto* plt = app.add_subcommand("plot", "SVG: layer x expert popularity and imbalance over time");
  plt->add_option("trace", o.trace, "Trace file ('-' = stdin)")->required();
  plt->add_option("-o,--out", o.out, "Output .svg ('-' = stdout)")->required();
  add_force(plt, o);

  auto* pm = app.add_subcommand(
      "plot-metrics", "SVG: training curves of metrics.jsonl files (several runs overlaid)");
  pm->add_option("metrics", o.metrics,
                 "metrics.jsonl of moe-train or moe-distill --metrics ('-' = stdin), one per run")
      ->required();
  pm->add_option("-o,--out", o.out, "Output .svg ('-' = stdout)")->required();
  add_force(pm, o);

  return tools::run_tool("moe-profile", app, argc, argv, [&]() -> int {
    tools::apply_common_options(o.common);
    if (*rec) return record(o, argc, argv);
    if (*sum) return summary(o);
    if (*pth) return paths(o);
    if (*acc) return accuracy(o);
    if (*pm) return plot_metrics(o);
    return plot(o);
  });
}

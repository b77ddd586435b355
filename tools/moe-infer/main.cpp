// moe-infer: batch inference on files. `score` writes each sequence's log-likelihood, `generate`
// continues prompts. --expert-budget streams the experts through a fixed ring of memory
// (MoESys) instead of holding them all. The work is in libmoe (moe/infer/*).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "moe/comm/communicator.h"
#include "moe/cuda.h"
#include "moe/infer/expert_ring.h"
#include "moe/infer/generate.h"
#include "moe/infer/model.h"
#include "moe/infer/placement.h"
#include "moe/infer/prompts.h"
#include "moe/io/dataset.h"
#include "moe/log.h"
#include "moe/parallel/layout.h"
#include "moe/timer.h"

using namespace moe;
using nlohmann::json;

namespace {

struct Options {
  tools::CommonOptions common;
  std::string model, data, data_format = "auto", prompts, out = "-", budget, popularity,
                           device = "cpu";
  int64_t batch = 8, max_sequences = 0, ep = 1;
  infer::SamplingConfig sampling;
};

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);  // completions may cut UTF-8
}

// The model, with its experts resident, streamed through a ring when a budget is given, or spread
// over the MPI ranks with --ep (each rank holds E/R experts of every layer).
struct Engine {
  Device device;
  std::unique_ptr<comm::Communicator> world;
  std::unique_ptr<parallel::Layout> layout;  // --ep: the expert group (NCCL on GPUs)
  nn::Parallel parallel;
  infer::LoadedModel loaded;
  std::unique_ptr<infer::ExpertRing> ring;
  std::unique_ptr<infer::LinaPlacement> placement;  // --popularity
  const BlockHooks* hooks() const { return ring ? &ring->hooks() : nullptr; }
  int ranks() const { return world ? world->size() : 1; }
  int rank() const { return world ? world->rank() : 0; }
};

std::unique_ptr<Engine> open_engine(const Options& o, std::unique_ptr<comm::Communicator> world) {
  auto engine = std::make_unique<Engine>();
  Engine& e = *engine;
  e.device = tools::resolve_device(o.device, world.get());
  if (e.device.kind == Device::cuda)
    MOE_LOG_INFO("device: ", e.device.str(), " (", cuda::device_name(e.device.index), ")");
  if (o.ep > 1) {
    if (world->size() != o.ep)
      throw UsageError(str("--ep ", o.ep, " needs ", o.ep, " ranks (mpiexec -n ", o.ep,
                           "); this run has ", world->size()));
    if (!o.budget.empty()) throw UsageError("--expert-budget and --ep cannot be combined yet");
    if (!o.popularity.empty() && e.device.kind != Device::cpu)
      throw UsageError(
          str("--popularity runs with --device cpu only (the placement reads each "
              "batch's routing on the host); this run has --device ",
              o.device));
    e.world = std::move(world);
    e.layout = parallel::Layout::expert_world(*e.world, e.device);
    e.parallel = nn::Parallel::of(*e.layout);
    if (!o.popularity.empty()) {  // every rank holds every expert; Lina places them per batch
      const ModelConfig mc = model_config_from_json(io::read_model_config(o.model));
      try {
        e.placement =
            std::make_unique<infer::LinaPlacement>(profile::load_paths(o.popularity), mc, *e.world);
      } catch (const Error& ex) {
        throw Error(str("--popularity '", o.popularity, "' does not fit model '", o.model,
                        "': ", ex.what()));
      }
      e.parallel.placement = e.placement.get();
    }
    e.loaded = infer::load_model(o.model, true, &e.parallel);
    e.loaded.params->to(e.device);
    return engine;
  }
  if (!o.popularity.empty())
    throw UsageError(
        "--popularity places experts over expert-parallel ranks: it needs --ep R "
        "under mpiexec -n R (R > 1)");
  if (world && world->size() > 1)
    throw UsageError(str("moe-infer runs on one rank unless --ep ", world->size(),
                         " spreads the experts over the ", world->size(), " ranks"));
  e.loaded = infer::load_model(o.model, o.budget.empty());
  if (!o.budget.empty()) {
    infer::RingConfig rc;
    int64_t total = 0;
    for (const Param* p : std::as_const(*e.loaded.params).all())
      if (p->expert) total += p->value.numel() * 4;  // fp32 in the ring
    rc.budget_bytes = infer::parse_budget(o.budget, total);
    rc.device = e.device;  // slots on the GPU, filled from pinned staging by a copy stream
    e.ring = std::make_unique<infer::ExpertRing>(*e.loaded.model, *e.loaded.params, o.model, rc);
    MOE_LOG_INFO("expert ring: ", e.ring->slots(), " slots for ", e.ring->expert_bytes(),
                 " expert bytes (budget ", rc.budget_bytes, " bytes)");
  }
  e.loaded.params->to(e.device);  // with a ring: the non-expert parameters (the slots are there)
  return engine;
}

// Windows [first, first + count) of the file (window w: tokens w*T .. w*T+T, as training
// evaluation cuts them): ids and targets [count, T].
void windows_of(const std::vector<int32_t>& tokens, int64_t seq, int64_t first, int64_t count,
                Tensor& ids, Tensor& targets) {
  ids = Tensor::empty({count, seq}, DType::i32);
  targets = Tensor::empty({count, seq}, DType::i32);
  for (int64_t w = 0; w < count; ++w) {
    const int32_t* src = tokens.data() + (first + w) * seq;
    std::copy(src, src + seq, ids.data<int32_t>() + w * seq);
    std::copy(src + 1, src + seq + 1, targets.data<int32_t>() + w * seq);
  }
}

// Rank 0: batch latency percentiles and, with --popularity, per-layer rank load with and without
// the placement (stderr).
void report_batches(const Engine& e, std::vector<double> seconds, bool quiet) {
  if (quiet || e.rank() != 0 || seconds.empty()) return;
  std::sort(seconds.begin(), seconds.end());
  auto pct = [&](double q) {  // nearest rank
    const auto i = static_cast<size_t>(std::ceil(q * double(seconds.size()))) - 1;
    return seconds[std::min(i, seconds.size() - 1)] * 1e3;
  };
  std::fprintf(stderr, "moe-infer: %zu batches, latency p50 %.2f ms, p95 %.2f ms\n", seconds.size(),
               pct(0.50), pct(0.95));
  if (!e.placement) return;
  std::fprintf(stderr,
               "moe-infer: placement\tblock\tbatches\treplans\tstatic_max_over_mean\t"
               "estimated_max_over_mean\tplaced_max_over_mean\tmax_replicas\n");
  for (const infer::PlacementLayerStats& s : e.placement->stats())
    std::fprintf(stderr, "moe-infer: placement\t%lld\t%lld\t%lld\t%.3f\t%.3f\t%.3f\t%.2f\n",
                 static_cast<long long>(s.block), static_cast<long long>(s.batches),
                 static_cast<long long>(s.replans), s.static_max_over_mean,
                 s.estimated_max_over_mean, s.placed_max_over_mean, s.mean_max_replicas);
}

void report_ring(const Engine& e) {
  if (!e.ring) return;
  infer::RingStats s = e.ring->stats();
  char line[256];
  std::snprintf(line, sizeof line,
                "expert ring: compute %.3f s, load %.3f s, compute waited %.3f s, overlap %.1f%%, "
                "peak resident expert bytes %lld (%lld slots), %lld layer loads",
                s.compute_seconds, s.load_seconds, s.wait_seconds, s.overlap_percent,
                static_cast<long long>(s.peak_resident_bytes), static_cast<long long>(s.slots),
                static_cast<long long>(s.layers_loaded));
  MOE_LOG_INFO(line);
}

int score(Options& o, std::unique_ptr<comm::Communicator> world) {
  std::unique_ptr<Engine> engine = open_engine(o, std::move(world));
  Engine& e = *engine;
  const ModelConfig& mc = e.loaded.config;
  const int R = e.ranks(), r = e.rank();
  std::vector<int32_t> tokens = io::load_tokens(o.data, io::parse_token_format(o.data_format));
  io::check_tokens_fit(tokens, mc.vocab_size, o.data);
  if (static_cast<int64_t>(tokens.size()) < mc.seq + 1)
    throw Error(str(o.data, ": ", tokens.size(), " tokens, fewer than one sequence of ", mc.seq + 1,
                    " (the model's context + 1)"));
  int64_t total = (static_cast<int64_t>(tokens.size()) - 1) / mc.seq;
  if (o.max_sequences > 0) total = std::min(total, o.max_sequences);
  std::unique_ptr<tools::OutputStream> out;
  if (r == 0) out = std::make_unique<tools::OutputStream>(o.out);
  tools::Progress progress(o.common.quiet || r != 0);
  Arena arena;
  EvalOptions eval;
  eval.hooks = e.hooks();
  double nll_sum = 0;
  int64_t predicted = 0;
  Timer timer;
  // Each round takes batch x R windows; rank r computes its contiguous share (under --ep every
  // rank must run every forward pass, so a rank without windows computes window 0 and drops it).
  std::vector<double> batch_seconds;
  for (int64_t done = 0; done < total;) {
    Timer batch_timer;
    const int64_t round = std::min(o.batch * R, total - done);
    const int64_t per = (round + R - 1) / R;
    const int64_t begin = std::min(round, r * per), mine = std::min(round, (r + 1) * per) - begin;
    std::vector<double> sums(static_cast<size_t>(mine));
    {
      ArenaScope scope(arena);
      Tensor ids, targets, row_nll;
      windows_of(tokens, mc.seq, mine ? done + begin : 0, std::max<int64_t>(mine, 1), ids, targets);
      eval.row_nll = &row_nll;
      e.loaded.model->evaluate(ids.to(e.device), targets.to(e.device), eval);
      row_nll = row_nll.to(Device{});
      const float* nll = row_nll.data<float>();
      for (int64_t s = 0; s < mine; ++s) {
        double sum = 0;
        for (int64_t t = 0; t < mc.seq; ++t) sum += nll[s * mc.seq + t];
        sums[static_cast<size_t>(s)] = sum;
      }
    }
    arena.reset();
    if (R > 1) {  // rank 0 gathers the round's sums (as their bits), in window order
      std::vector<int64_t> counts(static_cast<size_t>(R));
      for (int q = 0; q < R; ++q)
        counts[static_cast<size_t>(q)] = std::min(round, (q + 1) * per) - std::min(round, q * per);
      Tensor send = Tensor::empty({mine}, DType::i64), all = Tensor::empty({round}, DType::i64);
      if (mine > 0) std::memcpy(send.raw(), sums.data(), sums.size() * sizeof(double));
      e.world->all_gatherv(send, all, counts);
      sums.resize(static_cast<size_t>(round));
      std::memcpy(sums.data(), all.raw(), sums.size() * sizeof(double));
    }
    for (size_t s = 0; s < sums.size() && out; ++s) {
      nll_sum += sums[s];
      predicted += mc.seq;
      const double mean = sums[s] / double(mc.seq);
      out->write_line(dump(json{{"index", done + static_cast<int64_t>(s)},
                                {"tokens", mc.seq},
                                {"logprob_sum", -sums[s]},
                                {"nll_mean", mean},
                                {"ppl", std::exp(mean)}}));
    }
    done += round;
    batch_seconds.push_back(batch_timer.seconds());
    progress.live(str("score: ", done, "/", total, " sequences"));
  }
  progress.finish();
  if (!out) return 0;
  out->close();
  const double mean = nll_sum / double(std::max<int64_t>(1, predicted));
  char line[200];
  std::snprintf(line, sizeof line,
                "%lld sequences, %lld predicted tokens: nll_mean %.6f, ppl %.4f, %.0f tokens/s",
                static_cast<long long>(total), static_cast<long long>(predicted), mean,
                std::exp(mean), double(predicted) / std::max(timer.seconds(), 1e-9));
  if (!o.common.quiet) std::fprintf(stderr, "moe-infer score: %s\n", line);
  report_batches(e, batch_seconds, o.common.quiet);
  report_ring(e);
  return 0;
}

using infer::Prompt;

std::vector<Prompt> read_prompts(const Options& o, const ModelConfig& mc) {
  if (o.prompts == "-") return infer::read_prompts(std::cin, o.prompts, o.sampling, mc.vocab_size);
  std::ifstream file(o.prompts);
  if (!file) throw Error(str("prompt file '", o.prompts, "': cannot open"));
  return infer::read_prompts(file, o.prompts, o.sampling, mc.vocab_size);
}

int generate(Options& o, std::unique_ptr<comm::Communicator> world) {
  if (o.ep > 1) throw UsageError("--ep: generate runs on one rank for now (score spreads experts)");
  std::unique_ptr<Engine> engine = open_engine(o, std::move(world));
  Engine& e = *engine;
  const ModelConfig& mc = e.loaded.config;
  std::vector<Prompt> prompts = read_prompts(o, mc);
  // Prompts with the same sampling settings are generated together; outputs keep input order.
  auto key = [](const infer::SamplingConfig& s) {
    return std::make_tuple(s.max_new, s.temperature, s.top_k, s.top_p);
  };
  std::map<decltype(key(o.sampling)), std::vector<size_t>> groups;
  for (size_t i = 0; i < prompts.size(); ++i) groups[key(prompts[i].sampling)].push_back(i);
  std::vector<infer::Generation> results(prompts.size());
  Timer timer;
  int64_t generated = 0;
  for (const auto& [settings, members] : groups) {
    std::vector<std::vector<int32_t>> batch;
    for (size_t i : members) batch.push_back(prompts[i].tokens);
    infer::SamplingConfig s = prompts[members.front()].sampling;
    s.seed = o.common.seed;
    std::vector<infer::Generation> out =
        infer::generate(*e.loaded.model, batch, s, o.batch, e.hooks());
    for (size_t j = 0; j < members.size(); ++j) {
      generated += static_cast<int64_t>(out[j].tokens.size());
      results[members[j]] = std::move(out[j]);
    }
  }
  tools::OutputStream out(o.out);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const infer::Generation& g = results[i];
    json j{{"index", i}, {"tokens", g.tokens.size()}, {"stop", g.stop}};
    if (mc.vocab_size <= io::kByteVocab) {
      j["prompt"] = io::detokenize_bytes(prompts[i].tokens);
      j["completion"] = io::detokenize_bytes(g.tokens);
    } else {
      j["prompt"] = prompts[i].text;
      j["completion"] = "";
    }
    j["completion_ids"] = g.tokens;
    out.write_line(dump(j));
  }
  out.close();
  if (!o.common.quiet)
    std::fprintf(stderr, "moe-infer generate: %zu prompts, %lld new tokens, %.1f tokens/s\n",
                 prompts.size(), static_cast<long long>(generated),
                 double(generated) / std::max(timer.seconds(), 1e-9));
  report_ring(e);
  return 0;
}

void add_engine_options(CLI::App* sub, Options& o) {
  sub->add_option("--model", o.model, "Checkpoint file")->required();
  sub->add_option("--batch", o.batch, "Sequences or prompts per forward pass")
      ->check(tools::positive())
      ->capture_default_str();
  sub->add_option("--expert-budget", o.budget,
                  "Resident expert memory: BYTES (e.g. 512MiB) or PCT% of the model's experts; "
                  "the rest streams from the checkpoint through a ring of slots");
  sub->add_option("-o,--out", o.out, "JSON lines to PATH ('-' = stdout)")->capture_default_str();
  tools::add_device_option(*sub, o.device, "where the model runs");
  sub->add_option("--ep", o.ep,
                  "Under mpiexec -n N: spread every MoE layer's experts over the N ranks (score)")
      ->check(tools::positive())
      ->capture_default_str();
  sub->add_option("--popularity", o.popularity,
                  "With --ep: Lina's popularity-aware expert placement from a path table "
                  "(moe-profile paths); every rank then holds every expert")
      ->check(CLI::ExistingFile);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-infer: batch inference on files with an MoE checkpoint.", "moe-infer"};
  Options o;
  tools::add_common_options(app, o.common, "moe-infer");
  app.require_subcommand(1);
  app.fallthrough();  // common flags (-q, --threads, ...) also after the subcommand

  auto* sc = app.add_subcommand("score", "Log-likelihood and perplexity of every sequence");
  add_engine_options(sc, o);
  sc->add_option("--data", o.data, "Text or .u16/.u32 token file")->required();
  sc->add_option("--data-format", o.data_format, "auto, text, u16 or u32")
      ->check(CLI::IsMember({"auto", "text", "u16", "u32"}))
      ->capture_default_str();
  sc->add_option("--max-sequences", o.max_sequences, "Score at most N sequences (0 = all)")
      ->check(tools::non_negative())
      ->capture_default_str();

  auto* gen = app.add_subcommand("generate", "Continue prompts (one per line, or JSON lines)");
  add_engine_options(gen, o);
  gen->add_option("--prompts", o.prompts, "Prompt file ('-' = stdin)")->required();
  gen->add_option("--max-new", o.sampling.max_new, "New tokens per prompt at most")
      ->check(tools::positive())
      ->capture_default_str();
  gen->add_option("--temperature", o.sampling.temperature, "0 = greedy")
      ->check(tools::non_negative())
      ->capture_default_str();
  gen->add_option("--top-k", o.sampling.top_k, "Sample among the k most likely (0 = off)")
      ->check(tools::non_negative())
      ->capture_default_str();
  gen->add_option("--top-p", o.sampling.top_p, "Nucleus sampling mass (1 = off)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();

  return tools::run_tool(
      "moe-infer", app, argc, argv,
      [&]() -> int {
        tools::apply_common_options(o.common);
        // MPI when started by mpiexec/srun, else one local process.
        std::unique_ptr<comm::Communicator> world = comm::make_world();
        const bool many = world->size() > 1;
        if (many && world->rank() != 0) o.common.quiet = true;
        try {
          return *sc ? score(o, std::move(world)) : generate(o, std::move(world));
        } catch (const std::exception& ex) {
#ifdef MOE_HAVE_MPI
          // One rank failing must end every rank, not leave them waiting in a collective.
          if (many)
            comm::abort_job(str("moe-infer: error: ", ex.what()),
                            dynamic_cast<const UsageError*>(&ex) ? 2 : 1);
#endif
          throw;
        }
      },
      tools::Scope::job);
}

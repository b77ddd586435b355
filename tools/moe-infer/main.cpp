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
#include "common/named_option.h"
#include "common/ranks.h"
#include "moe/comm/communicator.h"
#include "moe/cuda.h"
#include "moe/infer/engine.h"
#include "moe/infer/generate.h"
#include "moe/infer/loglikelihood.h"
#include "moe/infer/prompts.h"
#include "moe/infer/score.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/dataset.h"
#include "moe/io/input.h"
#include "moe/io/model_text.h"
#include "moe/io/output.h"
#include "moe/io/tokenizer.h"
#include "moe/log.h"
#include "moe/timer.h"

using namespace moe;
using nlohmann::json;

namespace {

struct Options {
  tools::CommonOptions common;
  std::string model, data, prompts, out = "-", budget, popularity, device = "cpu", summary,
                                    truncate = "none", tokenizer, requests, expert_cache, pin_from,
                                    prefetch;
  io::TokenFormat data_format = io::TokenFormat::automatic;
  int64_t prefetch_margin = 0;
  std::vector<CLI::Option*> prefetch_flags;  // each subcommand's --prefetch (one was parsed)
  double pin_share = 0.5;
  int64_t batch = 8, max_sequences = 0, ep = 1, top = 0;
  bool incremental = false, per_token = false, rolling = false, force = false;
  bool read_weights = false, verify_weights = false;
  infer::SamplingConfig sampling;
};

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);  // completions may cut UTF-8
}

// The value of a --prefetch given ("" when bare: the trace's estimate, as before it took a value).
infer::EngineOptions::Prefetch parse_prefetch(const std::string& value) {
  using Prefetch = infer::EngineOptions::Prefetch;
  if (value == "off") return Prefetch::off;
  if (value.empty() || value == "trace") return Prefetch::trace;
  if (value == "router") return Prefetch::router;
  if (value == "router-output") return Prefetch::router_output;
  throw UsageError(str("--prefetch ", value, ": must be trace, router, router-output or off"));
}

// The device first: a machine without a usable GPU is told so before any work.
std::unique_ptr<infer::Engine> open_engine(const Options& o,
                                           std::unique_ptr<comm::Communicator> world) {
  infer::EngineOptions options;
  options.device = tools::resolve_device(o.device, world.get());
  if (options.device.kind == Device::cuda)
    MOE_LOG_INFO("device: ", options.device.str(), " (", cuda::device_name(options.device.index),
                 ")");
  options.device_flag = o.device;
  options.model = o.model;
  options.budget = o.budget;
  options.weights = {!o.read_weights, o.verify_weights};
  if (!o.expert_cache.empty()) options.expert_cache = offload::parse_cache_policy(o.expert_cache);
  options.pin_from = o.pin_from;
  options.pin_share = o.pin_share;
  const bool prefetch = std::any_of(o.prefetch_flags.begin(), o.prefetch_flags.end(),
                                    [](const CLI::Option* f) { return f->count() > 0; });
  options.prefetch = prefetch ? parse_prefetch(o.prefetch) : infer::EngineOptions::Prefetch::off;
  options.prefetch_margin = o.prefetch_margin;
  options.ep = o.ep;
  options.popularity = o.popularity;
  return infer::Engine::open(options, std::move(world));
}

// --tokenizer PATH, else the one stored in the checkpoint (import-hf keeps it), else none (a
// byte-level model reads text as bytes). One with more tokens than the model is refused.
std::unique_ptr<io::Tokenizer> open_tokenizer(const Options& o, const ModelConfig& mc) {
  return io::open_model_tokenizer(o.model, mc.vocab_size, o.tokenizer);
}

// Rank 0: batch latency percentiles and, with --popularity, per-layer rank load with and without
// the placement (stderr).
void report_batches(const infer::Engine& e, std::vector<double> seconds, bool quiet) {
  if (quiet || e.rank() != 0 || seconds.empty()) return;
  std::sort(seconds.begin(), seconds.end());
  auto pct = [&](double q) {  // nearest rank
    const auto i = static_cast<size_t>(std::ceil(q * double(seconds.size()))) - 1;
    return seconds[std::min(i, seconds.size() - 1)] * 1e3;
  };
  std::fprintf(stderr, "moe-infer: %zu batches, latency p50 %.2f ms, p95 %.2f ms\n", seconds.size(),
               pct(0.50), pct(0.95));
  if (!e.placement()) return;
  std::fprintf(stderr,
               "moe-infer: placement\tblock\tbatches\treplans\tstatic_max_over_mean\t"
               "estimated_max_over_mean\tplaced_max_over_mean\tmax_replicas\n");
  for (const infer::PlacementLayerStats& s : e.placement()->stats())
    std::fprintf(stderr, "moe-infer: placement\t%lld\t%lld\t%lld\t%.3f\t%.3f\t%.3f\t%.2f\n",
                 static_cast<long long>(s.block), static_cast<long long>(s.batches),
                 static_cast<long long>(s.replans), s.static_max_over_mean,
                 s.estimated_max_over_mean, s.placed_max_over_mean, s.mean_max_replicas);
}

// The expert cache's summary: hit rate beside Belady's on the same accesses (the offline ceiling),
// reads, and the next-layer estimate's hit rate (the trace's or the router's) with the prefetches
// issued, used and wasted (displaced before any use).
void report_expert_cache(const offload::ServingCache& cache) {
  const offload::ServingCacheStats s = cache.stats();
  char line[400];
  std::snprintf(line, sizeof line,
                "expert cache: %lld accesses, hit rate %.1f%% (%lld pinned, %lld cached), Belady "
                "%.1f%% (ratio %.3f), %lld experts read (%lld bytes), %lld slots + %lld pinned "
                "of %lld bytes",
                static_cast<long long>(s.accesses), 100.0 * s.hit_rate(),
                static_cast<long long>(s.pinned_hits), static_cast<long long>(s.cache.hits),
                100.0 * s.belady_rate(), s.belady_rate() > 0 ? s.hit_rate() / s.belady_rate() : 1.0,
                static_cast<long long>(s.experts_read), static_cast<long long>(s.bytes_read),
                static_cast<long long>(s.slots), static_cast<long long>(s.pinned),
                static_cast<long long>(s.expert_bytes));
  MOE_LOG_INFO(line);
  if (s.estimate_routed == 0 && s.prefetches == 0) return;
  MOE_LOG_INFO("expert cache: next-layer estimate held ", s.estimate_hits, " of ",
               s.estimate_routed, " routed experts (", 100.0 * s.estimate_rate(), "%); ",
               s.prefetches, " prefetched, ", s.prefetch_hits, " of them used, ", s.prefetch_wasted,
               " displaced unused");
}

void report_ring(const infer::Engine& e) {
  if (e.expert_cache()) report_expert_cache(*e.expert_cache());
  if (!e.ring()) return;
  offload::RingStats s = e.ring()->stats();
  char line[320];
  std::snprintf(line, sizeof line,
                "expert ring: compute %.3f s, load %.3f s, compute waited %.3f s, overlap %.1f%%, "
                "peak resident expert bytes %lld (%lld slots), %lld layer loads (%lld bytes read)",
                s.compute_seconds, s.load_seconds, s.wait_seconds, s.overlap_percent,
                static_cast<long long>(s.peak_resident_bytes), static_cast<long long>(s.slots),
                static_cast<long long>(s.layers_loaded), static_cast<long long>(s.bytes_read));
  MOE_LOG_INFO(line);
}

// run(), and when it meets a non-finite output, the weight that explains it (mapped weights are
// not scanned when the model opens): then the error names the file and the tensor.
template <typename Run>
auto blaming_weights(const infer::Engine& e, Run run) {
  try {
    return run();
  } catch (const infer::NonFiniteOutput&) {
    e.check_weights_finite();
    throw;
  }
}

json score_json(const infer::SequenceScore& s) {
  const double mean = s.nll_sum / double(s.tokens);
  return json{{"index", s.index},
              {"tokens", s.tokens},
              {"logprob_sum", -s.nll_sum},
              {"nll_mean", mean},
              {"ppl", std::exp(mean)}};
}

// --per-token: parallel arrays, one entry per predicted token (and --top's lists per token).
void add_per_token(json& j, const std::vector<infer::TokenLogprob>& tokens, bool top) {
  json ids = json::array(), logprobs = json::array(), ranks = json::array();
  json top_ids = json::array(), top_logprobs = json::array();
  for (const infer::TokenLogprob& t : tokens) {
    ids.push_back(t.id);
    logprobs.push_back(t.logprob);
    ranks.push_back(t.rank);
    top_ids.push_back(t.top_ids);
    top_logprobs.push_back(t.top_logprobs);
  }
  j["token_ids"] = ids;
  j["token_logprobs"] = logprobs;
  j["token_ranks"] = ranks;
  if (!top) return;
  j["top_ids"] = top_ids;
  j["top_logprobs"] = top_logprobs;
}

// Under --ep every rank must score the same thing: the flags that shape the result agree here (the
// model and the tokens are compared where they are read: Engine::open, infer::score). Outputs,
// logging and threads may differ; a path may too where it names the same file (popularity tables
// by their bytes).
void check_score_ranks_agree(const Options& o, comm::Communicator& world) {
  if (world.size() == 1) return;
  std::string popularity;
  if (!o.popularity.empty()) {
    const io::FileFingerprint f = io::fingerprint_file(o.popularity);
    popularity = str(f.bytes, " bytes, CRC-32C ", f.crc32c_hex());
  }
  tools::check_ranks_agree(
      world, "moe-infer",
      json{{"ep", o.ep},
           {"batch", o.batch},
           {"max_sequences", o.max_sequences},
           {"expert_budget", o.budget},
           {"device", Device::parse(o.device).kind == Device::cpu ? "cpu" : "cuda"},
           {"popularity", popularity},
           {"per_token", o.per_token},
           {"top", o.top},
           {"incremental", o.incremental}});
}

int score(Options& o, std::unique_ptr<comm::Communicator> world) {
  tools::check_one_stdout({{"-o", o.out}, {"--summary", o.summary}});
  check_score_ranks_agree(o, *world);
  std::unique_ptr<infer::Engine> engine = open_engine(o, std::move(world));
  const infer::Engine& e = *engine;
  std::unique_ptr<tools::OutputStream> out;
  tools::Progress progress(o.common.quiet || e.rank() != 0);
  tools::Meter meter(progress);
  const int64_t seq = e.config().seq;
  infer::ScoreCallbacks callbacks;
  callbacks.start = [&](int64_t) {
    if (e.rank() == 0) out = std::make_unique<tools::OutputStream>(o.out);
  };
  callbacks.sequence = [&](const infer::SequenceScore& s) { out->write_line(dump(score_json(s))); };
  if (o.per_token)
    callbacks.sequence = [&](const infer::SequenceScore& s) {
      json j = score_json(s);
      add_per_token(j, s.per_token, o.top > 0);
      out->write_line(dump(j));
    };
  callbacks.progress = [&](int64_t done, int64_t total) {
    meter.update(str("score ", done, "/", total, " sequences"), done, total, done * seq);
  };
  const std::unique_ptr<io::Tokenizer> tokenizer = open_tokenizer(o, e.config());
  infer::ScoreOptions options{o.data, o.data_format, o.batch, o.max_sequences, tokenizer.get()};
  options.incremental = o.incremental;
  options.per_token = o.per_token;
  options.top = o.top;
  const infer::ScoreSummary summary =
      blaming_weights(e, [&] { return infer::score(e, options, callbacks); });
  progress.finish();
  if (!out) return 0;
  out->close();
  const double mean = summary.nll_sum / double(std::max<int64_t>(1, summary.predicted));
  char line[200];
  std::snprintf(line, sizeof line,
                "%lld sequences, %lld predicted tokens: nll_mean %.6f, ppl %.4f, %.0f tokens/s",
                static_cast<long long>(summary.sequences),
                static_cast<long long>(summary.predicted), mean, std::exp(mean),
                double(summary.predicted) / std::max(summary.seconds, 1e-9));
  if (!o.common.quiet) std::fprintf(stderr, "moe-infer score: %s\n", line);
  if (!o.summary.empty()) {  // what the stderr line says, for scripts (and under -q)
    tools::OutputStream summary_out(o.summary);
    summary_out.write_line(
        dump(json{{"model", o.model},
                  {"data", o.data},
                  {"sequences", summary.sequences},
                  {"predicted_tokens", summary.predicted},
                  {"logprob_sum", -summary.nll_sum},
                  {"nll_mean", mean},
                  {"ppl", std::exp(mean)},
                  {"seconds", summary.seconds},
                  {"tokens_per_s", double(summary.predicted) / std::max(summary.seconds, 1e-9)}}));
    summary_out.close();
  }
  report_batches(e, summary.batch_seconds, o.common.quiet);
  report_ring(e);
  return 0;
}

using infer::Prompt;

std::vector<Prompt> read_prompts(const Options& o, const ModelConfig& mc,
                                 const io::Tokenizer* tokenizer) {
  if (o.prompts == "-")
    return infer::read_prompts(std::cin, o.prompts, o.sampling, mc.vocab_size, tokenizer);
  io::check_input_file(o.prompts, "prompt file");  // a directory, device or FIFO: by name
  std::ifstream file(o.prompts);
  if (!file) throw Error(str("prompt file '", o.prompts, "': cannot open"));
  return infer::read_prompts(file, o.prompts, o.sampling, mc.vocab_size, tokenizer);
}

// --stop's escapes, as llama.cpp's: \n \r \t \\ \" \' (a stop at a newline is the common case,
// and a shell passes "\n" as two characters). Any other backslash stays as it is.
std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i], next = i + 1 < text.size() ? text[i + 1] : '\0';
    const char* known = "nrt\\\"'";
    if (c != '\\' || next == '\0' || !std::strchr(known, next)) {
      out += c;
      continue;
    }
    out += next == 'n' ? '\n' : next == 'r' ? '\r' : next == 't' ? '\t' : next;
    ++i;
  }
  return out;
}

// --truncate: with "left" cuts every prompt that leaves less than its max_new tokens of context to
// its last context - max_new tokens and says so once; with "none" refuses one that does not fit at
// all (as generate() would), naming its line and the flag.
void fit_prompts(std::vector<Prompt>& prompts, const Options& o, int64_t seq) {
  int64_t cut = 0;
  std::string first;
  for (Prompt& p : prompts) {
    const int64_t n = static_cast<int64_t>(p.tokens.size());
    if (o.truncate == "left") {
      if (const int64_t dropped = infer::truncate_left(p.tokens, seq, p.sampling.max_new)) {
        p.truncated = dropped;
        if (cut++ == 0)
          first = str(o.prompts, ":", p.line, ", ", n, " -> ", p.tokens.size(), " tokens");
      }
    } else if (n >= seq) {
      throw UsageError(str(
          o.prompts, ":", p.line, ": the prompt has ", n, " tokens; the model's context is ", seq,
          ": shorten it, or pass --truncate left to keep its last ",
          std::max<int64_t>(1, seq - p.sampling.max_new), " tokens (the context minus --max-new)"));
    }
  }
  if (cut > 0)
    MOE_LOG_WARN("--truncate left: ", cut, " prompt", cut == 1 ? "" : "s",
                 " longer than the context (", seq,
                 " tokens) minus the new tokens lost their first tokens (first: ", first, ")");
}

int generate(Options& o, std::unique_ptr<comm::Communicator> world) {
  std::unique_ptr<infer::Engine> engine = open_engine(o, std::move(world));
  const infer::Engine& e = *engine;
  const ModelConfig& mc = e.config();
  for (std::string& stop : o.sampling.stop) stop = unescape(stop);  // the prompts' defaults
  const std::unique_ptr<io::Tokenizer> tokenizer = open_tokenizer(o, mc);
  o.sampling.tokenizer = tokenizer.get();
  std::vector<Prompt> prompts = read_prompts(o, mc, tokenizer.get());
  fit_prompts(prompts, o, mc.seq);
  // Prompts with the same sampling settings are generated together; outputs keep input order.
  auto key = [](const infer::SamplingConfig& s) {
    return std::make_tuple(s.max_new, s.temperature, s.top_k, s.top_p, s.repeat_penalty,
                           s.repeat_last_n, s.stop);
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
        blaming_weights(e, [&] { return infer::generate(e.model(), batch, s, o.batch); });
    for (size_t j = 0; j < members.size(); ++j) {
      generated += static_cast<int64_t>(out[j].tokens.size());
      results[members[j]] = std::move(out[j]);
    }
  }
  tools::OutputStream out(o.out);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const infer::Generation& g = results[i];
    json j{{"index", i},
           {"tokens", g.tokens.size()},
           {"stop", g.stop},
           {"finish_reason", g.finish_reason()}};
    if (g.stop == "stop") j["stop_string"] = g.stop_text;
    if (o.truncate == "left") j["prompt_tokens_dropped"] = prompts[i].truncated;
    if (tokenizer) {
      j["prompt"] = tokenizer->decode(prompts[i].tokens);
      j["completion"] = g.text;
    } else if (mc.vocab_size <= io::kByteVocab) {
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

// Under --ep every rank reads the same request file and scores it with the same flags (the
// requests' token ids are compared in infer::loglikelihood); rank 0 writes the results.
void check_loglikelihood_ranks_agree(const Options& o, comm::Communicator& world) {
  if (world.size() == 1) return;
  if (o.requests == "-")
    throw UsageError(str("moe-infer loglikelihood --requests -: under mpiexec (", world.size(),
                         " ranks) every rank reads the requests: give a file"));
  tools::check_ranks_agree(
      world, "moe-infer",
      json{{"ep", o.ep},
           {"batch", o.batch},
           {"rolling", o.rolling},
           {"expert_budget", o.budget},
           {"device", Device::parse(o.device).kind == Device::cpu ? "cpu" : "cuda"}});
}

// lm-evaluation-harness's loglikelihood (and, with --rolling, loglikelihood_rolling) requests.
int loglikelihood(Options& o, std::unique_ptr<comm::Communicator> world) {
  check_loglikelihood_ranks_agree(o, *world);
  std::unique_ptr<infer::Engine> engine = open_engine(o, std::move(world));
  const infer::Engine& e = *engine;
  const ModelConfig& mc = e.config();
  const std::unique_ptr<io::Tokenizer> tokenizer = open_tokenizer(o, mc);
  std::vector<infer::LoglikelihoodRequest> requests;
  if (o.requests == "-") {
    requests = infer::read_loglikelihood_requests(std::cin, o.requests, o.rolling, tokenizer.get(),
                                                  mc.vocab_size, mc.seq);
  } else {
    io::check_input_file(o.requests, "request file");
    std::ifstream file(o.requests);
    if (!file) throw Error(str("request file '", o.requests, "': cannot open"));
    requests = infer::read_loglikelihood_requests(file, o.requests, o.rolling, tokenizer.get(),
                                                  mc.vocab_size, mc.seq);
  }
  tools::Progress progress(o.common.quiet);
  tools::Meter meter(progress);
  Timer timer;
  const std::vector<infer::LoglikelihoodResult> results = blaming_weights(e, [&] {
    return infer::loglikelihood(
        e.model(), requests, o.batch,
        [&](int64_t done, int64_t total, int64_t tokens) {
          meter.update(str("loglikelihood ", done, "/", total, " rows"), done, total, tokens);
        },
        e.world());
  });
  progress.finish();
  if (e.rank() != 0) return 0;  // every rank holds the results; rank 0 writes them
  tools::OutputStream out(o.out);
  int64_t tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const infer::LoglikelihoodResult& r = results[i];
    json j{{"index", i}, {"line", requests[i].line}, {"logprob", r.logprob}, {"tokens", r.tokens}};
    if (o.rolling) {
      j["windows"] = r.windows;
    } else {
      j["greedy"] = r.greedy;
      j["context_tokens_dropped"] = r.context_dropped;
    }
    out.write_line(dump(j));
    tokens += r.tokens;
  }
  out.close();
  if (!o.common.quiet)
    std::fprintf(stderr, "moe-infer loglikelihood: %zu requests, %lld scored tokens, %.2f s\n",
                 results.size(), static_cast<long long>(tokens), timer.seconds());
  report_ring(e);
  return 0;
}

void add_engine_options(CLI::App* sub, Options& o) {
  sub->add_option("--model", o.model,
                  "Checkpoint file, or a moe-train output directory (its last.h5)")
      ->required();
  sub->add_option("--batch", o.batch, "Sequences or prompts per forward pass")
      ->check(tools::positive())
      ->capture_default_str();
  sub->add_option("--expert-budget", o.budget,
                  "Resident expert memory: BYTES (e.g. 512MiB) or PCT% of the model's experts; "
                  "the rest streams from the checkpoint through a ring of slots (or the "
                  "--expert-cache)");
  sub->add_option("--expert-cache", o.expert_cache,
                  "With --expert-budget: a cache of single experts kept across tokens and "
                  "batches, lru or lfu (MoESys), the budget counted as the experts are held "
                  "(bf16 stays bf16); default: the ring of whole layers")
      ->check(CLI::IsMember({"lru", "lfu"}));
  auto* pin_from = sub->add_option(
      "--pin-from", o.pin_from,
      "With --expert-cache: a routing trace (moe-profile record) whose most popular "
      "experts stay pinned, up to --pin-share of the budget");
  // --prefetch alone keeps its first meaning (the trace's estimate); its checks are the engine's.
  o.prefetch_flags.push_back(
      sub->add_option(
             "--prefetch", o.prefetch,
             "With --expert-cache: read the next layer's likely experts on a loader thread "
             "while a layer computes: trace (the default value; needs --pin-from) estimates "
             "them from the trace's layer-to-layer transitions, router applies the next "
             "layer's router to the hidden state before this layer's MoE block, "
             "router-output to the block's output (later, but closer); without it "
             "--pin-from only counts what the trace's estimate would catch")
          ->expected(0, 1));
  sub->add_option("--prefetch-margin", o.prefetch_margin,
                  "With --prefetch router: experts a token read beyond the next layer's top-k")
      ->capture_default_str();
  sub->add_option("--pin-share", o.pin_share, "Share of --expert-budget pinned by --pin-from")
      ->needs(pin_from)
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("-o,--out", o.out, "JSON lines to PATH ('-' = stdout)")->capture_default_str();
  sub->add_flag("--force", o.force, "Replace an existing output file");
  tools::add_device_option(*sub, o.device, "where the model runs");
  tools::add_weight_options(*sub, o.read_weights, o.verify_weights);
  sub->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json or tokenizer.model (or a model directory holding one) for text "
                  "data and prompts; default: the one stored in the checkpoint (import-hf keeps "
                  "it), else text is read as bytes (byte-level models)");
}

// score: its flags (the engine's, the data, --per-token, --ep).
CLI::App* add_score_command(CLI::App& app, Options& o) {
  auto* sc = app.add_subcommand("score", "Log-likelihood and perplexity of every sequence");
  add_engine_options(sc, o);
  sc->add_option("--data", o.data, "Text or .u16/.u32 token file")->required();
  tools::add_named(*sc, "--data-format", o.data_format, "auto, text, u16 or u32",
                   {"auto", "text", "u16", "u32"}, io::parse_token_format, io::token_format_name);
  sc->add_option("--summary", o.summary,
                 "The perplexity summary as one JSON object to PATH ('-' = stdout, then -o must "
                 "name a file): sequences, predicted_tokens, logprob_sum, nll_mean, ppl, "
                 "tokens_per_s; written under -q too")
      ->capture_default_str();
  sc->add_option("--max-sequences", o.max_sequences, "Score at most N sequences (0 = all)")
      ->check(tools::non_negative())
      ->capture_default_str();
  auto* per_token = sc->add_flag(
      "--per-token", o.per_token,
      "Each window's predicted tokens in its line: token_ids, token_logprobs, token_ranks "
      "(1 = the most likely); also under --ep");
  sc->add_option("--top", o.top,
                 "With --per-token: also the N most likely tokens at each position (top_ids, "
                 "top_logprobs)")
      ->needs(per_token)
      ->check(tools::non_negative())
      ->capture_default_str();
  sc->add_flag("--incremental", o.incremental,
               "Score through the decode path: each window a token at a time through the KV "
               "cache, --batch windows per step (what generation computes; Q8_0 weights then "
               "multiply 8-bit inputs); one process");
  // Scoring only: generation runs on one rank.
  sc->add_option("--ep", o.ep,
                 "Under mpiexec -n N: spread every MoE layer's experts over the N ranks")
      ->check(tools::positive())
      ->capture_default_str();
  sc->add_option("--popularity", o.popularity,
                 "With --ep: Lina's popularity-aware expert placement from a path table "
                 "(moe-profile paths); every rank then holds every expert")
      ->check(CLI::ExistingFile);

  return sc;
}

// generate: its flags (the engine's, the prompts, sampling).
void add_generate_command(CLI::App& app, Options& o) {
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
  gen->add_option("--repeat-penalty", o.sampling.repeat_penalty,
                  "Divide the logits of the tokens seen in the last --repeat-last-n by P when "
                  "positive, multiply when negative (llama.cpp's; 1 = off)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  gen->add_option(
         "--repeat-last-n", o.sampling.repeat_last_n,
         "Tokens of the sequence (prompt included) the penalty looks at (0 = off, -1 = all)")
      ->check(CLI::Range(int64_t{-1}, int64_t{INT32_MAX}))
      ->capture_default_str();
  gen->add_option("--stop", o.sampling.stop,
                  "Stop string, repeatable: generation ends when the output contains one, which "
                  "is left out (escapes \\n \\t \\r \\\\; a JSON prompt's \"stop\" replaces these)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  gen->add_option("--truncate", o.truncate,
                  "A prompt too long for the context: none (refuse) or left (keep its last "
                  "context - max-new tokens, and say so)")
      ->check(CLI::IsMember({"none", "left"}))
      ->capture_default_str();
}

// loglikelihood: its flags (the engine's, the requests).
CLI::App* add_loglikelihood_command(CLI::App& app, Options& o) {
  auto* ll = app.add_subcommand(
      "loglikelihood",
      "lm-evaluation-harness requests: the log-probability of each continuation given its "
      "context, and whether it is the greedy one");
  add_engine_options(ll, o);
  ll->add_option("--requests", o.requests,
                 "JSON lines {\"context\": ..., \"continuation\": ...} ('-' = stdin); with "
                 "--rolling {\"text\": ...}")
      ->required();
  ll->add_flag("--rolling", o.rolling,
               "loglikelihood_rolling: each text's whole log-likelihood, in windows of the "
               "model's context");
  ll->add_option("--ep", o.ep,
                 "Under mpiexec -n N: spread every MoE layer's experts over the N ranks (each "
                 "reads the --requests file; rank 0 writes the results)")
      ->check(tools::positive())
      ->capture_default_str();
  return ll;
}

// The chosen subcommand, on one process or every rank of an mpiexec job.
int run(Options& o, const CLI::App& sc, const CLI::App& ll) {
  tools::apply_common_options(o.common);
  // MPI when started by mpiexec/srun, else one local process.
  std::unique_ptr<comm::Communicator> world = comm::make_world();
  const bool many = world->size() > 1;
  if (many && world->rank() != 0) o.common.quiet = true;
  try {
    if (world->rank() == 0) {  // rank 0 writes: an existing file only with --force
      io::check_output_stream(o.out, o.force);
      io::check_output_stream(o.summary, o.force);
    }
    // Only score and loglikelihood spread experts over ranks (--ep): generate would be told to
    // give an --ep it does not have.
    if (many && !sc && !ll)
      throw UsageError(str("moe-infer generate runs in one process (this job has ", world->size(),
                           " ranks): start it without mpiexec; --ep (experts over ranks) is "
                           "score's and loglikelihood's"));
    if (ll) return loglikelihood(o, std::move(world));
    return sc ? score(o, std::move(world)) : generate(o, std::move(world));
  } catch (const std::exception& ex) {
#ifdef MOE_HAVE_MPI
    // One rank failing must end every rank, not leave them waiting in a collective.
    if (many)
      comm::abort_job(str("moe-infer: error: ", ex.what()),
                      dynamic_cast<const UsageError*>(&ex) ? 2 : 1);
#endif
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-infer: batch inference on files with an MoE checkpoint.", "moe-infer"};
  Options o;
  tools::add_common_options(app, o.common, "moe-infer");
  app.require_subcommand(1);
  app.fallthrough();  // common flags (-q, --threads, ...) also after the subcommand
  CLI::App* sc = add_score_command(app, o);
  add_generate_command(app, o);
  CLI::App* ll = add_loglikelihood_command(app, o);
  return tools::run_tool(
      "moe-infer", app, argc, argv, [&]() -> int { return run(o, *sc, *ll); }, tools::Scope::job);
}

// moe-train's flags. Model flags fill a ModelConfig, training flags a TrainConfig, the run's own
// (output, cadence) TrainOptions.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "common/cli.h"
#include "moe/models/config.h"
#include "moe/train/session.h"
#include "moe/train/trainer.h"

namespace moe::tools {

struct TrainOptions {
  CommonOptions common;
  std::string out, resume, init, metrics, trace, arch = "gpt", dtype = "f32";
  int64_t trace_every = 1;
  std::string normalize_topk = "auto";
  std::string router = "auto";
  ModelConfig model;
  train::TrainConfig train;
  std::string device = "cpu";    // cpu | cuda | cuda:N
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t eval_every = 50;
  int64_t log_every = 10;
  bool force = false;  // write into a directory that holds another run's checkpoints
  // Also before the first step (a resumed run: the state it restored, in this run's layout).
  bool checkpoint_at_start = false;
  bool breakdown_sync = false;            // -v on a GPU: synchronise at every part boundary
  std::vector<CLI::Option*> model_flags;  // flags that a resumed run must not contradict
  std::vector<CLI::Option*> train_flags;  // flags that override a resumed run's training config
  std::vector<CLI::Option*> rope_flags;   // --rope-scaling and YaRN's (model flags too)
};

// Registers every flag of moe-train (tools/moe-train/options.cpp: one function per group).
void add_train_options(CLI::App& app, TrainOptions& o);
// The outputs: at most one on stdout; rank 0's (`lead`) checked before any work (an existing file
// only with --force; a resume appends to its metrics); the other ranks write none and log warnings
// and errors only (every rank trains, rank 0 reports).
void check_outputs(TrainOptions& o, bool lead);
// Flag combinations that cannot be run (UsageError), before any work.
void check_flags(const TrainOptions& o, CLI::App& app);
// The run the parsed flags ask for: configs as given (arch, router, dtype, normalize_topk parsed),
// the flags given explicitly, paths and cadence. Provenance and the callbacks are the caller's.
train::SessionRequest session_request(const TrainOptions& o, CLI::App& app);

}  // namespace moe::tools

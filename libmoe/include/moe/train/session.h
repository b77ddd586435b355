// A training run opened in one call, as infer::Engine::open opens a model: the checkpoint it
// resumes or starts from read for its configs, the flags reconciled with them (moe/train/resume.h),
// the run directory checked, every rank checked to agree, the Trainer built, restored or
// initialised and moved to its device, the routing trace opened. A program that trains (moe-train)
// parses its flags into a SessionRequest, opens a Session and runs a RunLoop over its trainer.
//
// Opening order (each step may refuse, before any work that a later one would waste):
//   1. the --resume / --init checkpoint's configs, position and tokenizer (its tensors stay in the
//      file: Trainer::restore reads them from this opening in step 5, the offloaded experts one
//      at a time; initialize reads the --init file's)
//   2. the configs reconciled, the layout fitted to the world, the data file's identity checked
//   3. the run directory (one run per directory), its stale temporaries removed (rank 0)
//   4. every rank's settings compared (the tool's check), the offload device, the device resolved
//   5. the Trainer: built, its output directory prepared, restored or initialised, moved
//   6. the run described in the log; the trace writer (rank 0) opened
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/comm/communicator.h"
#include "moe/io/trace.h"
#include "moe/train/resume.h"
#include "moe/train/trainer.h"

namespace moe::train {

struct SessionRequest {
  ModelConfig model;        // as the flags say (arch, dtype and normalize_topk parsed)
  TrainConfig train;        // as the flags say (seed included)
  GivenFlags given;         // the flags given explicitly (a resumed run reconciles them)
  bool data_given = false;  // the data file was named now (a resumed run records it again)
  // The MoE layers were listed one by one (no warning for a model without any).
  bool experts_listed = false;
  std::string out;               // the run's directory
  std::string resume, init;      // the checkpoint continued from / started from ("": none)
  bool force = false;            // the run directory may hold another run's checkpoints
  int64_t checkpoint_every = 0;  // compared between ranks with the configs
  std::string device = "cpu";    // as given: cpu, cuda, cuda:N
  io::Provenance provenance;     // of every file the run writes
  std::string trace;             // routing trace path ("": none; rank 0 writes it)
  int64_t trace_every = 1;       // steps between recorded steps
  // The tool's parts, which name its flags in their messages: compare the settings between ranks
  // (only called with several ranks), resolve and select the device, prepare the output directory.
  std::function<void(const nlohmann::json& settings)> check_ranks_agree;
  std::function<Device(const std::string& device)> resolve_device;
  std::function<void(const std::string& dir)> prepare_out;
};

class Session {
 public:
  // Opens the run (the steps above). Collective over `world`, which must outlive the session.
  // Throws UsageError for settings that contradict each other or the checkpoint, moe::Error for
  // files and devices that cannot be used.
  static Session open(SessionRequest request, comm::Communicator& world);

  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  ~Session();

  Trainer& trainer() { return *trainer_; }
  const Trainer& trainer() const { return *trainer_; }
  const RunConfig& config() const { return config_; }
  bool resumed() const { return !request_.resume.empty(); }

  // One optimizer step; on the trace's steps (every rank alike) its routing is captured and rank 0
  // appends it to the trace.
  StepStats step();
  // Closes the trace (throws when its data did not all reach the file); no-op without one.
  void close_trace();

 private:
  Session() = default;
  SessionRequest request_;
  RunConfig config_;
  std::unique_ptr<Trainer> trainer_;
  io::TraceInfo trace_info_;
  std::unique_ptr<io::TraceWriter> trace_;
};

}  // namespace moe::train

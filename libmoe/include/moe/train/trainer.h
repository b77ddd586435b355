// One training step at a time as a library: data, model, optimizer, evaluation, checkpoints. The
// run around it (its cadence of steps, evaluations, checkpoints and logs) is train::RunLoop.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "moe/arena.h"
#include "moe/balance/cost_profile.h"
#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/comm/scheduler.h"
#include "moe/io/checkpoint.h"
#include "moe/io/dataset.h"
#include "moe/models/transformer.h"
#include "moe/nn/recompute.h"
#include "moe/offload/store_settings.h"
#include "moe/offload/tier.h"
#include "moe/offload/tiered_store.h"
#include "moe/optim/adamw.h"
#include "moe/parallel/grad_sync.h"
#include "moe/parallel/layout.h"
#include "moe/parallel/zero.h"
#include "moe/parallel/zero_prefetch.h"
#include "moe/step_breakdown.h"
#include "moe/train/placement.h"
#include "moe/train/tasks.h"

namespace moe::train {

struct TrainConfig {
  std::string data, val;
  io::TokenFormat data_format = io::TokenFormat::automatic;
  // Not flags: the identity of the file at `data` when the run started (or was last resumed with
  // --data), checked when it resumes (train::check_data_file). -1 / "": not recorded (a
  // checkpoint of an earlier build).
  int64_t data_bytes = -1;
  std::string data_crc32c;  // 8 lower-case hex digits
  int64_t batch = 16;
  int64_t steps = 600;  // total optimizer steps of the run (the schedule's length)
  // Peak learning rate; 0 = the size-aware default (default_lr), resolved when the Trainer is made
  // and saved with its checkpoints.
  double lr = 0, min_lr_ratio = 0.1;
  int64_t warmup = 30;
  double weight_decay = 0.1, clip = 1.0;
  double val_fraction = 0.1;  // held-out tail of --data when there is no --val
  int64_t eval_batches = 8;
  uint64_t seed = 1234;
  // Layout over MPI ranks (ignored by one process). ep: expert-parallel ranks (divides the world
  // and every layer's expert count; world = DP x EP). shard_embedding: split the token table by
  // columns over the world (MoESys). a2a: flat | hierarchical expert all-to-all; ranks_per_node:
  // virtual nodes of that many ranks for it (0: the real nodes). comm_scheduler: off (gradient
  // all-reduce after backward) | priority (Lina: micro-ops of partition_mb overlapping backward,
  // all-to-all first).
  int64_t ep = 1;
  bool shard_embedding = false;
  comm::A2AAlgorithm a2a = comm::A2AAlgorithm::flat;
  int64_t ranks_per_node = 0;
  comm::SchedulerMode comm_scheduler = comm::SchedulerMode::off;
  double partition_mb = 16.0;
  // Expert placement while training (moe/train/placement.h): static | lpt | flexmoe, and
  // flexmoe's vExpert slots, balance threshold and replanning period. lpt and flexmoe need
  // --ep > 1 and hold every expert on every rank; they change which rank computes a row, never
  // its value. The flexmoe maps are saved with each checkpoint (train config, placement_state).
  PlacementRule placement = PlacementRule::fixed;
  int64_t vexperts_per_rank = 0;
  double balance_threshold = 1.1;
  int64_t replan_every = 10;
  // Expert state off the compute device (ES-MoE, MoESys; moe/offload/store_settings.h): the tier
  // (none: every expert resident | host | ssd | auto: offload::plan picks), the budgets, the
  // store's pinning, prefetch, optimizer overlap and SSD cache. The expert store holds the same
  // struct (offload::StoreConfig::settings). None of these change the numbers a run computes.
  offload::StoreSettings offload;
  // Memory. grad_accum: each optimizer step runs N forward/backward passes over N equal
  // micro-batches of its batch (split after the data-parallel split: batch divides by N x the
  // world), accumulates their gradients and steps once; the step's tokens do not depend on N.
  // recompute: none | moe | block (nn::Recompute; bitwise the same parameters as none). A resumed
  // run may change either (neither is part of the model or of the optimizer's state).
  int64_t grad_accum = 1;
  nn::Recompute recompute = nn::Recompute::none;
  // Multi-task training (moe/train/tasks.h): the tasks file (replaces data; batch becomes the
  // tasks' total), and the steps between reallocations of ranks to tasks by measured time (0:
  // the allocation by tokens stays).
  // task_allocation: workload (the rule of moe/train/tasks.h) | equal (the baseline: R / T each).
  std::string tasks;
  int64_t task_replan_every = 0;
  AllocationRule task_allocation = AllocationRule::workload;
  // ZeRO for the dense parameters over the ranks that sum their gradients (moe/parallel/zero.h):
  // 0 off, 1 AdamW state sharded, 2 and gradients reduce-scattered. One process: no effect.
  // Neither changes the checkpoint (state is gathered on save), so a resume may change it.
  int64_t zero = 0;
  // --zero 3: the dense all-gathers run this many blocks ahead of compute on a thread of their
  // own (moe/parallel/zero_prefetch.h; at most N + 1 blocks gathered at once); 0: synchronous.
  int64_t zero_prefetch = 1;
};
// Training refuses data from stdin (data or val "-"): every rank reads the data, and a resumed run
// reads it again. UsageError saying so, before any work (the Trainer and the Distiller call it).
void check_data_not_stdin(const TrainConfig& train);

// The default peak learning rate for a model: 3e-3 up to d_model 128, then 3e-3 x 128 / d_model
// (an Adam step moves every weight by about lr, and a wider matrix sums more of those moves). At
// d_model 512 a fixed 3e-3 collapsed the routing more often and trained to a worse loss
// (docs/PERFORMANCE.md, "Routing balance over training").
double default_lr(const ModelConfig& model);

nlohmann::json to_json(const TrainConfig& config);
// Fields present in j override those of `base`.
TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig base = {});

struct StepStats {
  int64_t step = 0;  // steps completed after this one
  ForwardStats forward;
  double lr = 0, grad_norm = 0, seconds = 0;
  int64_t tokens = 0;
  // Per MoE layer: max / mean of the tokens routed to each expert (before capacity).
  std::vector<double> load_max_over_mean;
  // Per MoE layer, with expert parallelism: max / mean over the expert-parallel ranks of the rows
  // each computed (the balance ratio of FlexMoE's eq. 6; this rank's expert group).
  std::vector<double> rank_load_max_over_mean;
  // Per MoE layer, with expert parallelism: the slowest expert rank's seconds from dispatch to
  // combine (forward + backward), and --placement flexmoe's cost-model prediction of it.
  std::vector<double> moe_seconds, moe_predicted_seconds;
  // What --placement flexmoe changed after this step (empty otherwise).
  std::vector<Replan> replans;
  double dropped_fraction = 0;
  // Distributed runs: time this rank was blocked in expert all-to-all (counts included) and in
  // finishing the gradient reduction after backward; the all-to-all exchanges of the step.
  double a2a_seconds = 0, grad_sync_seconds = 0;
  int64_t a2a_calls = 0;
  // The most bytes of activations this rank held at once during the step (the activation
  // arena's high-water mark, recomputation's scratch included; host memory: CPU training).
  int64_t activation_peak_bytes = 0;
  // Overlap of the step's transfers with compute (fraction hidden = 1 - wait / transfer):
  // --zero 3: seconds compute waited for dense all-gathers, and the all-gathers' own seconds
  // (on the prefetch thread with --zero-prefetch N > 0); --offload: seconds compute waited for
  // expert uploads, and the uploads' own seconds (loader thread or compute's).
  double dense_wait_seconds = 0, dense_gather_seconds = 0;
  double expert_wait_seconds = 0, expert_load_seconds = 0;
  // --tasks: every task's loss and samples this step; a reallocation made after it ("" if none).
  std::vector<TaskStepStats> tasks;
  std::string task_replan;
  // step(true) only: this rank's token ids of the step ([B/W * T]); forward.moe[i].choices/gates
  // hold their routing (routing traces).
  std::vector<int32_t> token_ids;
  // With record_breakdown(true): the step's wall time by kind of work (moe/step_breakdown.h),
  // summing to `seconds` up to the clock reads around it; all zero otherwise.
  StepBreakdown breakdown;
};

// The wait a step's breakdown recording calls at each part boundary (StepRecording): the
// device's synchronize when asked to wait (moe-train --breakdown-sync) and the parameters live
// on a GPU; null otherwise (host times; on the CPU there is nothing to wait for).
using DeviceWait = void (*)(int);
DeviceWait breakdown_wait(Device device, bool wait_for_device);

// Trainer::step's parts (libmoe/src/train/step_hooks.h: the step's data, and the hooks of the
// optional features around its phases).
struct StepBatch;
struct StepContext;
class StepHook;

class Trainer {
 public:
  // A fresh run. `model.vocab_size` must cover every token id of the data (0: sized from the data).
  // With a communicator of size W > 1 the run is distributed: every rank draws the same global
  // batch and computes on its B/W sequences (its contiguous share). Dense gradients are averaged
  // over the W ranks; with train.ep = P > 1 the world splits into W/P expert-parallel groups of P
  // consecutive ranks, rank p of each holding experts [p E/P, (p+1) E/P) of every MoE layer, and
  // expert gradients are averaged over their W/P replicas (the ranks with the same p). All
  // collectives of a step are agreed in order on every rank. `world` must outlive the trainer.
  // `device` CUDA with W > 1: the rank groups are built over NCCL (parallel::Layout), bootstrapped
  // over `world` (the launcher's MPI world); call to_device(device) after restore.
  // `tokenizer` (may be null or empty): the model's (that of the checkpoint the run resumes or
  // starts from); text data is read through it instead of as bytes.
  Trainer(const ModelConfig& model, const TrainConfig& train, io::Provenance provenance,
          comm::Communicator* world = nullptr, Device device = {},
          const io::StoredTokenizer* tokenizer = nullptr);
  ~Trainer();

  // Continue from a checkpoint: parameters, optimizer moments, step, data cursor. An unsharded
  // checkpoint (one file: every logical tensor whole) restores any layout: a sharded run (--ep,
  // --shard-embedding with --ep = W) takes its slices of it. An offloaded
  // run's store is refilled expert by expert (streamed tensors are read one expert at a time);
  // a damaged or non-finite expert found then fails the restore part-way: do not train on.
  // `source` names the file the checkpoint came from in errors about its placement state.
  void restore(const io::Checkpoint& checkpoint, const std::string& source = {});
  // The same from a path: a checkpoint file, or a sharded checkpoint directory written by save()
  // of a run with the same world size, --ep and --shard-embedding (collective; each rank reads
  // the files holding its parameters).
  void restore(const std::string& path);
  // The same, with `head` the checkpoint at `path` (a directory's rank-00000.h5) already opened
  // by the caller for its configs (io::open_checkpoint_lazy: nothing read yet), as
  // train::Session::open does: its tensors are read from it, the file is not opened again.
  void restore(const std::string& path, io::Checkpoint head);
  // Start from a checkpoint's weights instead (fine-tuning: moe-train --init): its parameters
  // and tokenizer, fresh optimizer moments, fp32 masters of the same values, step 0 and the
  // data from the start. `weights` holds every parameter of this model, whole (a sharded run
  // takes its slices); its optimizer state and position are ignored.
  void initialize(io::Checkpoint weights);
  // The same from a path: a checkpoint file or a sharded checkpoint directory (merged in memory).
  void initialize(const std::string& path);

  // Moves the parameters, the optimizer state and the fused gradient buffers to `device` (call
  // after restore); batches are uploaded there each step. With W > 1 ranks on CUDA each rank
  // passes its own GPU, and the trainer's communicator should be NCCL (comm::make_nccl over the
  // MPI world; another backend is refused): the gradient and expert collectives then run on
  // device buffers. --shard-embedding stays on the CPU (refused with a message).
  void to_device(Device device);
  Device device() const { return params_->device(); }

  // One optimizer step: --grad-accum micro-batches, then one clip and update. StepStats then
  // describe the whole step: the losses are the means over its micro-batches (each a mean over
  // its tokens, so the step's loss is the mean over its tokens), the expert loads, drops and
  // routing the sums / concatenation of the micro-batches'. capture_routing: also record every
  // token's experts (moe-train --trace).
  StepStats step(bool capture_routing = false);
  // Time each step by kind of work into StepStats::breakdown (moe-train -v). Off by default; the
  // scopes then cost a thread-local load and a branch per op. On a GPU the parts are host times
  // (a part that waits on the device holds the work queued before it) unless wait_for_device,
  // which synchronises the device at every part boundary: each part then holds its own GPU
  // time, and the step is slower by the waits (moe-train --breakdown-sync). No effect on the CPU.
  void record_breakdown(bool on, bool wait_for_device = false) {
    record_breakdown_ = on;
    breakdown_waits_ = wait_for_device;
  }
  double evaluate();  // mean validation cross-entropy over up to eval_batches batches
  // The same for another model over the same validation batches (a distillation teacher); its
  // vocabulary must cover the data and its context be at least the run's sequence length.
  double evaluate(const Transformer& model);

  // Extension points for runs built on this loop (distillation, moe/train/distill.h).
  // step() trains on `loss` instead of the cross-entropy (empty: the cross-entropy again).
  void set_logits_loss(LogitsLoss loss) { logits_loss_ = std::move(loss); }
  // Keys merged into the training config of every checkpoint written from now on (how the
  // model was made); the keys of TrainConfig itself are refused.
  void set_train_config_notes(nlohmann::json notes);

  // Every tensor of the run, whole: an offloaded run's experts are gathered from its store (all
  // of them at once: for tests and small models; save() streams them instead).
  io::Checkpoint snapshot() const;
  // Writes dir/step-<8 digits>.h5 atomically and points dir/last.h5 at it; returns the path.
  // An offloaded run's expert tensors (values, AdamW moments, fp32 masters) are written one
  // expert at a time from whatever tier holds them, each slice checked finite as it goes: the
  // file is the one a resident run writes, and no whole expert tensor is ever held.
  // Collective under data parallelism: rank 0 writes (parameters are identical on every rank).
  // A sharded run (sharded()) writes dir/step-<8 digits>/rank-<5 digits>.h5, one file per rank
  // that owns parameters (docs/FORMATS.md), then points dir/last at the directory once every rank
  // has written; returns the directory.
  std::string save(const std::string& dir) const;
  // Ranks hold different parameters (expert parallelism or a sharded embedding).
  bool sharded() const;
  // The rank groups of the run; world() is the communicator its collectives use.
  const parallel::Layout& layout() const { return *layout_; }
  int world_size() const { return world_ ? world_->size() : 1; }
  int rank() const { return world_ ? world_->rank() : 0; }

  int64_t steps_done() const { return step_; }
  int64_t tokens_seen() const { return tokens_seen_; }
  const TrainConfig& config() const { return train_; }
  const ModelConfig& model_config() const { return model_->config(); }
  const Transformer& model() const { return *model_; }
  ParamSet& params() { return *params_; }
  const optim::AdamW& optimizer() const { return *optimizer_; }
  // --zero 1|2 with more than one rank: the dense state's shards, else null.
  const parallel::DenseShards* dense_shards() const { return zero_.get(); }
  // The store holding the experts of an offloaded run (--offload), else null.
  const offload::TieredStore* expert_store() const { return store_.get(); }
  // The --placement policy (null: static); tests set its cost model.
  TrainingPlacement* placement() { return placement_.get(); }
  // --placement flexmoe: each logical expert tensor ([E, ...]: values and their optimizer
  // tensors, by name) gathered from the ranks' vExpert slots, on `root` (-1: every rank); empty
  // otherwise. Collective over the expert group.
  std::map<std::string, Tensor> logical_experts(int root) const;
  // --placement flexmoe: the start-up profile of the expert group (its model drives the replans
  // unless a resumed checkpoint brought the one its run measured).
  const balance::CostProfile& placement_profile() const { return placement_profile_; }
  int64_t train_tokens() const {
    return tasks_ ? tasks_->train_tokens() : static_cast<int64_t>(train_tokens_.size());
  }
  // --tasks: the run's tasks and their allocation (null otherwise).
  const TaskSet* tasks() const { return tasks_.get(); }
  int64_t val_tokens() const { return static_cast<int64_t>(val_tokens_.size()); }

 private:
  TrainConfig train_;
  io::Provenance provenance_;
  io::StoredTokenizer tokenizer_;  // of the checkpoint resumed from (import-hf keeps one)
  std::vector<int32_t> train_tokens_, val_tokens_;
  std::unique_ptr<ParamSet> params_;
  std::unique_ptr<offload::TieredStore> store_;  // --offload: declared before the model
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::AdamWConfig adamw_config() const;
  offload::StoreConfig store_config(Device device) const;
  void plan_offload(const ModelConfig& config, Device device);
  offload::Tier offload_tier_ = offload::Tier::none;  // the tier in use (auto: the plan's)
  int64_t auto_host_budget_ = 0;                // --offload auto with ssd: the plan's host cache
  int64_t auto_device_budget_ = 0;              // --offload auto: the plan's device slots
  comm::Communicator* expert_replicas() const;  // ranks holding the same experts (or null)
  double learning_rate() const;                 // this step's (the schedule at step_)
  // Expert e of offloaded parameter p's `what` ("value", "adam.m", ...) read from the store.
  std::shared_ptr<const io::ExpertSource> offloaded_source(const Param& p,
                                                           const std::string& what) const;
  struct StateTensor {
    io::NamedTensor tensor;
    const Param* param = nullptr;
  };
  // Every parameter's optimizer tensors, offloaded ones streamed from the store.
  std::vector<StateTensor> optimizer_state() const;
  // Optimizer tensor name ("adam.m.<param>", ...) -> its parameter.
  std::map<std::string, const Param*> params_of_optimizer_tensors() const;
  // snapshot() with the offloaded tensors streamed (`stream`) or gathered.
  io::Checkpoint checkpoint(bool stream) const;
  // Names of the offloaded parameters and of their optimizer tensors (what a resume streams).
  io::StreamFilter offloaded_filter() const;
  std::unique_ptr<io::BatchSampler> sampler_;  // null under --tasks (each task has its own)
  std::unique_ptr<TaskSet> tasks_;
  void setup_tasks(const ModelConfig& model, io::TokenFormat format);
  void setup_parallel(const ModelConfig& config, Device device);
  // --placement flexmoe (moe/train/placement.h): the maps (null otherwise), the holders told to
  // the gradient sync, a replan's state copies (collective over the expert group), and the
  // placement state of a checkpoint taken (then the holders again).
  const std::map<int64_t, balance::VExpertMap>* vexpert_maps() const;
  void sync_holders();
  void apply_replans(std::vector<Replan>& replans);  // fills their copies and measured time
  void restore_placement(const io::Checkpoint& checkpoint, const std::string& source);
  // Logical expert tensors checkpoint() writes instead of the slots (flexmoe; set by save() and
  // snapshot() for the call).
  mutable std::map<std::string, Tensor> logical_;
  void gather_dense_state() const;  // --zero: the dense optimizer tensors into logical_
  void reduce_stats(StepStats& s);
  // step()'s phases (trainer_step.cpp): the batch drawn and the gradients zeroed; the hooks of
  // this run's optional features (rebuilt every step: they hold the step's settings); one
  // forward/backward pass; the losses and gradients reduced over the ranks; clip and update;
  // the parameters checked finite after it.
  StepBatch draw_batch(bool capture_routing, StepStats& s);
  std::vector<std::unique_ptr<StepHook>> step_hooks();
  void run_pass(int64_t m, bool capture_routing,
                const std::vector<std::unique_ptr<StepHook>>& hooks, StepContext& ctx);
  void reduce_step(const StepBatch& batch, StepStats& s);
  void update(StepStats& s);
  void check_parameters() const;
  // Sums over the ranks, in place (f32 over the wire: each rank's sums are already float sums).
  void all_reduce_sums(std::vector<double>& sums) const;
  // An evaluation pass of `model` (with ZeRO-3's gathers when it is this run's model).
  ForwardStats forward_only(const Transformer& model, const Tensor& ids, const Tensor& targets,
                            EvalOptions options);
  // The first step of a fresh run with centred routers: each center starts as the mean of its
  // router's input over the step's global batch (this rank's micro-batches `parts`: ids, targets).
  void calibrate_router_centers(const std::vector<std::pair<Tensor, Tensor>>& parts);
  bool centers_given_ = false;  // parameters came from a checkpoint (resume or --init)
  // After the optimizer step: each center moves toward the step's mean router input.
  void update_router_centers(const ForwardStats& f);
  std::string save_sharded(const std::string& dir) const;
  void load_tensors(const io::Checkpoint& checkpoint);  // parameters, optimizer, position
  void restore_sharded(io::Checkpoint head, const std::string& where,
                       const std::function<io::Checkpoint(int)>& load);
  bool owns(const Param& p) const;        // this rank writes p in a sharded checkpoint
  io::Checkpoint snapshot_owned() const;  // this rank's file of a sharded checkpoint (streamed)
  comm::Communicator* world_ = nullptr;   // the layout's world (NCCL on GPUs)
  std::unique_ptr<parallel::Layout> layout_;
  nn::Parallel parallel_;                          // the model's view of layout_
  std::unique_ptr<parallel::GradSync> grad_sync_;  // W > 1
  std::unique_ptr<parallel::DenseShards> zero_;    // --zero >= 1, W > 1
  optim::AdamW::Filter optimizer_holds() const;    // the parameters AdamW keeps state for
  std::unique_ptr<TrainingPlacement> placement_;   // --placement lpt | flexmoe
  balance::CostProfile placement_profile_;         // flexmoe: measured at start-up
  // --zero 3: its all-gathers, ahead of compute or not (destroyed before zero_)
  std::unique_ptr<parallel::ZeroPrefetch> zero_prefetch_;
  Arena arena_;
  int64_t step_ = 0, tokens_seen_ = 0;
  bool record_breakdown_ = false, breakdown_waits_ = false;
  LogitsLoss logits_loss_;
  nlohmann::json train_config_notes_ = nlohmann::json::object();
};

// The largest token id + 1 of a token file's contents (to size the vocabulary of pre-tokenized
// data).
int64_t vocab_needed(const std::vector<int32_t>& tokens);

}  // namespace moe::train

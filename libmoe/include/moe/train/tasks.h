// Elastic multi-task training (MoESys §IV-A): one model trained on several tasks at once, each
// with its own data file, batch (sequences per step) and loss weight. Ranks are given to tasks by
// workload; each task's batch is split over its ranks. Shape letters: T tasks, R ranks, B_t the
// batch of task t, S the model's sequence length.
//
// The objective of a step (docs/FORMATS.md "Tasks file", README "Multi-task training"):
//   L = sum_t lambda_t sum_{s in B_t} loss_s / sum_t B_t
// with loss_s the mean cross-entropy of sequence s over its S tokens and lambda_t the task's
// weight. Each rank scales its local gradient so that the one dense all-reduce (an average over the
// R ranks) is the gradient of L; the router's aux and z losses are weighted by the rank's share of
// the step's sequences, so they are those of the whole step's batch as in one process.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/io/dataset.h"
#include "moe/models/transformer.h"
#include "moe/tensor.h"

namespace moe::train {

struct TaskSpec {
  std::string name;
  std::string data;  // a token/text file as --data takes (relative paths: from the tasks file)
  int64_t batch = 0;
  double weight = 1.0;  // lambda_t
};

// Reads a tasks file (TOML, one [[task]] table per task: name, data, batch, weight). Errors name
// the file, the task and the key (UsageError: the file is the user's input).
std::vector<TaskSpec> read_tasks_file(const std::string& path);
// The same from text; `source` names it in errors and relative data paths resolve from `dir`.
std::vector<TaskSpec> parse_tasks(std::string_view text, const std::string& source,
                                  const std::string& dir = "");
nlohmann::json to_json(const std::vector<TaskSpec>& tasks);

// Ranks per task by workload (T <= R): n_t = max(1, round(R w_t / sum w)), then fixed up so that
// sum n_t == R: while the sum is too large, take a rank from the task with n_t > 1 whose n_t
// exceeds its share R w_t / sum w the most; while too small, give one to the task whose share
// exceeds n_t the most; ties go to the lower task index. 512/256/128/128 on 8 ranks: 4/2/1/1.
std::vector<int64_t> workload_ranks(std::span<const double> work, int ranks);

// Rows [first_row, first_row + rows) of task `task`'s batch.
struct TaskSegment {
  int64_t task = 0, first_row = 0, rows = 0;
};

// Which rows of which tasks every rank computes.
struct TaskAllocation {
  std::vector<int64_t> ranks_of_task;  // [T] n_t
  // [R] this rank's segments, in task order. T <= R: one segment each (task t on n_t consecutive
  // ranks, its batch split evenly in rank order). T > R: each task whole on one rank, the tasks
  // packed by Graham's LPT (heaviest first onto the least-loaded rank, ties to the lower rank).
  std::vector<std::vector<TaskSegment>> segments;
  int ranks() const { return static_cast<int>(segments.size()); }
};

// The allocation for `work` [T] (any positive per-step cost) over `ranks`. A task whose batch
// does not split evenly over its n_t ranks is refused (UsageError naming it and its ranks).
TaskAllocation allocate_tasks(const std::vector<TaskSpec>& tasks, std::span<const double> work,
                              int ranks);
// Work = tokens per step (batch x seq); the allocation a run starts with.
TaskAllocation allocate_by_tokens(const std::vector<TaskSpec>& tasks, int64_t seq, int ranks);
// The baseline the workload rule is measured against (--task-allocation equal): R / T ranks per
// task, one more for each of the first R mod T tasks (T <= R), batches split as above.
TaskAllocation allocate_equally(const std::vector<TaskSpec>& tasks, int ranks);
// How a run gives ranks to tasks (the task_allocation setting): workload (allocate_by_tokens,
// then by measured time with task_replan_every) or equal (allocate_equally).
enum class AllocationRule { workload, equal };
const char* allocation_rule_name(AllocationRule rule);  // "workload" | "equal"
// Throws UsageError naming the setting's flag and listing its values for any other name.
AllocationRule parse_allocation_rule(std::string_view name);
nlohmann::json to_json(const TaskAllocation& allocation);
TaskAllocation task_allocation_from_json(const nlohmann::json& j);
// "a:4 b:2 c:1 d:1" (ranks per task) or, with shared ranks, "rank 0: a b | rank 1: c".
std::string describe(const TaskAllocation& allocation, const std::vector<TaskSpec>& tasks);

// One task's numbers for a step (the same on every rank).
struct TaskStepStats {
  std::string name;
  double loss = 0;      // mean loss_s over the task's batch
  int64_t samples = 0;  // B_t
  double seconds = 0;   // compute time its ranks spent on its rows (summed over ranks)
};

// This rank's part of one step.
struct TaskBatch {
  Tensor ids, targets;      // [b_r, S]: this rank's segments, concatenated in task order
  float loss_scale = 1.0f;  // TrainPass::loss_scale: R b_r / sum_t B_t
  int64_t first_token = 0;  // the first row's token index in the step's whole batch
};

// The tasks of a run: their data, samplers (one per task, cursors saved in checkpoints), the
// allocation and the step's loss.
class TaskSet {
 public:
  // Loads every task's data (its held-out tail, val_fraction, is the task's validation part).
  TaskSet(std::vector<TaskSpec> tasks, io::TokenFormat format, int64_t seq, uint64_t seed,
          double val_fraction, int ranks, int rank,
          AllocationRule allocation = AllocationRule::workload);

  const std::vector<TaskSpec>& tasks() const { return tasks_; }
  const TaskAllocation& allocation() const { return allocation_; }
  int64_t total_batch() const;  // sum_t B_t
  int64_t vocab_needed() const;
  int64_t train_tokens() const;
  // Every task's validation tail, concatenated in task order.
  std::vector<int32_t> validation_tokens() const;
  // Every task's data file's sampler advances by its batch (so every rank keeps every cursor);
  // returns this rank's rows.
  TaskBatch next();
  // The LogitsLoss of this rank's pass: the objective's share (see the top of this file) divided
  // by loss_scale; it records the per-task loss sums.
  LogitsLoss loss();
  // This rank's seconds in the step's passes (split over its tasks by rows).
  void add_seconds(double seconds) { seconds_ += seconds; }
  // The step's per-task statistics (collective when world is not null: an all-gather).
  std::vector<TaskStepStats> finish_step(comm::Communicator* world);
  // --task-replan-every: a new allocation from the per-sample seconds measured since the last
  // one (work = seconds per sample x B_t). Returns what changed ("" when the allocation stays).
  std::string replan();

  // Checkpoint state: the tasks, the allocation, every task's cursor and data file identity.
  nlohmann::json state() const;
  // Continues from state(): the cursors, and the allocation when the world size is the same
  // (another world size starts from the token allocation). Refuses a tasks file that changed
  // (UsageError) and a task's data file whose size or CRC-32C changed (Error naming the task).
  void load_state(const nlohmann::json& state);

 private:
  std::vector<TaskSpec> tasks_;
  int64_t seq_;
  int ranks_, rank_;
  std::vector<std::vector<int32_t>> train_, val_;
  std::vector<io::BatchSampler> samplers_;
  std::vector<io::FileFingerprint> fingerprints_;  // [T] each data file as loaded (resume check)
  TaskAllocation allocation_;
  int64_t rank_rows_ = 0;
  std::vector<double> loss_sums_;  // [T] this rank's sum of loss_s this step
  double seconds_ = 0;             // this rank's, this step
  std::vector<double> measured_seconds_, measured_samples_;  // [T] since the last replan
};

}  // namespace moe::train

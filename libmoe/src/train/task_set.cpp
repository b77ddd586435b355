// The tasks of a multi-task run while it trains: every task's data and sampler, this rank's rows
// of each step, the loss that weights them (the objective in moe/train/tasks.h), per-task
// statistics and replanning. Shape letters: T tasks, R ranks, S sequence length, V vocabulary.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "moe/error.h"
#include "moe/nn/loss.h"
#include "moe/settings.h"
#include "moe/train/tasks.h"

namespace moe::train {

TaskSet::TaskSet(std::vector<TaskSpec> tasks, io::TokenFormat format, int64_t seq, uint64_t seed,
                 double val_fraction, int ranks, int rank, AllocationRule allocation)
    : tasks_(std::move(tasks)), seq_(seq), ranks_(ranks), rank_(rank) {
  train_.reserve(tasks_.size());  // the samplers point into these vectors
  for (const TaskSpec& t : tasks_) {
    try {
      auto split = io::split_tail(io::load_tokens(t.data, format), val_fraction, seq, t.data);
      train_.push_back(std::move(split.first));
      val_.push_back(std::move(split.second));
      fingerprints_.push_back(io::fingerprint_file(t.data));
    } catch (const Error& e) {
      throw Error(str("task '", t.name, "': ", e.what()));
    }
  }
  // Each task's stream is keyed by (seed + its index): tasks over the same file draw different
  // orders, and a task's stream does not depend on the others.
  for (size_t t = 0; t < tasks_.size(); ++t)
    samplers_.emplace_back(&train_[t], seq, seed + t, true);
  allocation_ = allocation == AllocationRule::equal ? allocate_equally(tasks_, ranks)
                                                    : allocate_by_tokens(tasks_, seq, ranks);
  measured_seconds_.assign(tasks_.size(), 0.0);
  measured_samples_.assign(tasks_.size(), 0.0);
  loss_sums_.assign(tasks_.size(), 0.0);
}

int64_t TaskSet::total_batch() const {
  int64_t b = 0;
  for (const TaskSpec& t : tasks_) b += t.batch;
  return b;
}

int64_t TaskSet::vocab_needed() const {
  int32_t max_id = 0;
  for (const auto* part : {&train_, &val_})
    for (const auto& tokens : *part)
      for (int32_t id : tokens) max_id = std::max(max_id, id);
  return static_cast<int64_t>(max_id) + 1;
}

int64_t TaskSet::train_tokens() const {
  int64_t n = 0;
  for (const auto& tokens : train_) n += static_cast<int64_t>(tokens.size());
  return n;
}

std::vector<int32_t> TaskSet::validation_tokens() const {
  std::vector<int32_t> all;
  for (const auto& tokens : val_) all.insert(all.end(), tokens.begin(), tokens.end());
  return all;
}

TaskBatch TaskSet::next() {
  // Every rank draws every task's batch: the cursors stay the same everywhere, so a checkpoint
  // (written by rank 0) and a new allocation need no exchange.
  std::vector<Tensor> ids(tasks_.size()), targets(tasks_.size());
  for (size_t t = 0; t < tasks_.size(); ++t) samplers_[t].next(tasks_[t].batch, ids[t], targets[t]);
  const std::vector<TaskSegment>& mine = allocation_.segments.at(static_cast<size_t>(rank_));
  rank_rows_ = 0;
  for (const TaskSegment& s : mine) rank_rows_ += s.rows;
  TaskBatch b;
  b.ids = Tensor::empty({rank_rows_, seq_}, DType::i32);
  b.targets = Tensor::empty({rank_rows_, seq_}, DType::i32);
  int64_t row = 0;
  for (const TaskSegment& s : mine) {
    const auto t = static_cast<size_t>(s.task);
    b.ids.rows(row, row + s.rows).copy_from(ids[t].rows(s.first_row, s.first_row + s.rows));
    b.targets.rows(row, row + s.rows).copy_from(targets[t].rows(s.first_row, s.first_row + s.rows));
    row += s.rows;
  }
  // The step's whole batch is the tasks' batches in task order (router jitter is keyed by it).
  int64_t before = 0;
  for (int64_t t = 0; t < mine.front().task; ++t) before += tasks_[static_cast<size_t>(t)].batch;
  b.first_token = (before + mine.front().first_row) * seq_;
  b.loss_scale = static_cast<float>(static_cast<double>(ranks_) * static_cast<double>(rank_rows_) /
                                    static_cast<double>(total_batch()));
  std::fill(loss_sums_.begin(), loss_sums_.end(), 0.0);
  seconds_ = 0;
  return b;
}

LogitsLoss TaskSet::loss() {
  return [this](const Tensor&, const Tensor& targets, const Tensor& logits, Tensor& dlogits) {
    // The pass computes this rank's rows; their share of R x L is
    //   sum over segments of R lambda_t n mean_s / sum_t B_t
    // (mean_s: the segment's mean loss per token = its mean loss_s, every row having S tokens).
    // The model multiplies dlogits by loss_scale = R b_r / sum_t B_t, so each segment's gradient
    // is written with lambda_t n / b_r.
    const double total = static_cast<double>(total_batch());
    double value = 0;
    int64_t row = 0;
    for (const TaskSegment& s : allocation_.segments.at(static_cast<size_t>(rank_))) {
      const TaskSpec& task = tasks_[static_cast<size_t>(s.task)];
      const int64_t a = row * seq_, b = (row + s.rows) * seq_;
      Tensor d = dlogits.rows(a, b);
      const double n = static_cast<double>(s.rows);
      const double mean =
          nn::cross_entropy(logits.rows(a, b), targets.rows(a, b), &d,
                            static_cast<float>(task.weight * n / static_cast<double>(rank_rows_)));
      loss_sums_[static_cast<size_t>(s.task)] += mean * n;
      value += static_cast<double>(ranks_) * task.weight * n * mean / total;
      row += s.rows;
    }
    return value;
  };
}

std::vector<TaskStepStats> TaskSet::finish_step(comm::Communicator* world) {
  const size_t T = tasks_.size();
  // Per task: this rank's loss sum, and its seconds split by rows.
  std::vector<double> mine(2 * T, 0.0);
  for (const TaskSegment& s : allocation_.segments.at(static_cast<size_t>(rank_))) {
    const auto t = static_cast<size_t>(s.task);
    mine[t] = loss_sums_[t];
    mine[T + t] += seconds_ * static_cast<double>(s.rows) / static_cast<double>(rank_rows_);
  }
  std::vector<double> sum(2 * T, 0.0);
  if (world && world->size() > 1) {
    // Doubles as bits through an i64 all-gather, summed in rank order: the same sums everywhere.
    const int R = world->size();
    Tensor send = Tensor::empty({static_cast<int64_t>(2 * T)}, DType::i64);
    Tensor all = Tensor::empty({static_cast<int64_t>(2 * T) * R}, DType::i64);
    std::memcpy(send.data<int64_t>(), mine.data(), 2 * T * sizeof(double));
    world->all_gather(send, all);
    for (int r = 0; r < R; ++r)
      for (size_t i = 0; i < 2 * T; ++i) {
        double v;
        std::memcpy(&v, all.data<int64_t>() + static_cast<size_t>(r) * 2 * T + i, sizeof v);
        sum[i] += v;
      }
  } else {
    sum = mine;
  }
  std::vector<TaskStepStats> out;
  for (size_t t = 0; t < T; ++t) {
    TaskStepStats s;
    s.name = tasks_[t].name;
    s.samples = tasks_[t].batch;
    s.loss = sum[t] / static_cast<double>(s.samples);
    s.seconds = sum[T + t];
    measured_seconds_[t] += s.seconds;
    measured_samples_[t] += static_cast<double>(s.samples);
    out.push_back(s);
  }
  return out;
}

std::string TaskSet::replan() {
  std::vector<double> work;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    if (measured_samples_[t] <= 0 || measured_seconds_[t] <= 0) return "";
    work.push_back(measured_seconds_[t] / measured_samples_[t] *
                   static_cast<double>(tasks_[t].batch));
  }
  std::fill(measured_seconds_.begin(), measured_seconds_.end(), 0.0);
  std::fill(measured_samples_.begin(), measured_samples_.end(), 0.0);
  TaskAllocation next;
  try {
    next = allocate_tasks(tasks_, work, ranks_);
  } catch (const UsageError& e) {  // a batch that would not split: keep the allocation
    return str("task replan kept ", describe(allocation_, tasks_), " (", e.what(), ")");
  }
  if (to_json(next) == to_json(allocation_)) return "";
  const std::string was = describe(allocation_, tasks_);
  allocation_ = std::move(next);
  return str("task replan: ", was, " -> ", describe(allocation_, tasks_));
}

nlohmann::json TaskSet::state() const {
  std::vector<int64_t> cursors;
  for (const io::BatchSampler& s : samplers_) cursors.push_back(s.cursor());
  std::vector<int64_t> bytes;
  std::vector<std::string> crcs;
  for (const io::FileFingerprint& f : fingerprints_) {
    bytes.push_back(f.bytes);
    crcs.push_back(f.crc32c_hex());
  }
  return {{"tasks", to_json(tasks_)}, {"world_size", ranks_}, {"allocation", to_json(allocation_)},
          {"cursors", cursors},       {"data_bytes", bytes},  {"data_crc32c", crcs}};
}

void TaskSet::load_state(const nlohmann::json& state) {
  MOE_USAGE_CHECK(state.is_object() && state.contains("tasks"), flag_for(Setting::tasks),
                  ": the checkpoint was not written by a multi-task run (it has no "
                  "tasks_state); resume it without ",
                  flag_for(Setting::tasks));
  const nlohmann::json was = state.at("tasks"), now = to_json(tasks_);
  MOE_USAGE_CHECK(was.size() == now.size(), flag_for(Setting::tasks), ": the checkpoint trained ",
                  was.size(), " tasks, the tasks file now has ", now.size(),
                  " (resume with the run's tasks file)");
  for (size_t t = 0; t < now.size(); ++t)
    for (const char* key : {"name", "data", "batch", "weight"})
      MOE_USAGE_CHECK(was[t].at(key) == now[t].at(key), flag_for(Setting::tasks), ": task ", t + 1,
                      " ('", now[t].at("name").get<std::string>(), "'): ", key, " was ",
                      was[t].at(key).dump(), " in the checkpoint, the tasks file now says ",
                      now[t].at(key).dump(), " (resume with the run's tasks file)");
  // Each task's data file as the checkpoint trained on it (absent: written before this was
  // recorded): another file would not continue the task's token stream.
  if (state.contains("data_bytes") && state.contains("data_crc32c")) {
    const auto bytes = state.at("data_bytes").get<std::vector<int64_t>>();
    const auto crcs = state.at("data_crc32c").get<std::vector<std::string>>();
    MOE_CHECK(bytes.size() == tasks_.size() && crcs.size() == tasks_.size(),
              "tasks_state: ", bytes.size(), " data sizes and ", crcs.size(), " checksums for ",
              tasks_.size(), " tasks");
    for (size_t t = 0; t < tasks_.size(); ++t) {
      const std::string now = fingerprints_[t].crc32c_hex();
      if (bytes[t] != fingerprints_[t].bytes || crcs[t] != now)
        throw Error(str(flag_for(Setting::tasks), ": task '", tasks_[t].name, "' trained on '",
                        tasks_[t].data, "' as it was then (", bytes[t], " bytes, CRC-32C ", crcs[t],
                        "); the file there now is another (", fingerprints_[t].bytes,
                        " bytes, CRC-32C ", now,
                        "), so the task's token stream would not continue: restore the file, "
                        "or start a new run on it"));
    }
  }
  const auto cursors = state.at("cursors").get<std::vector<int64_t>>();
  MOE_CHECK(cursors.size() == samplers_.size(), "tasks_state: ", cursors.size(), " cursors for ",
            samplers_.size(), " tasks");
  for (size_t t = 0; t < samplers_.size(); ++t) samplers_[t].set_cursor(cursors[t]);
  // The same world continues with the allocation it had (bitwise); another starts from tokens.
  if (state.value("world_size", 0) == ranks_)
    allocation_ = task_allocation_from_json(state.at("allocation"));
}

}  // namespace moe::train

// Multi-task training's inputs: the tasks file (TOML, read with toml++) and the allocation of
// ranks to tasks by workload (pure functions). Shape letters: T tasks, R ranks.
#include "moe/train/tasks.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/json_text.h"
#include "moe/error.h"
#include "moe/io/input.h"
#include "moe/settings.h"

namespace moe::train {

namespace {

std::string where(const std::string& source, const toml::source_region& at) {
  return str(source, ":", at.begin.line);
}

// A name shows up in logs, metrics keys and checkpoints: keep it to a plain word.
bool plain_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

TaskSpec parse_task(const toml::table& t, size_t index, const std::string& source,
                    const std::string& dir) {
  TaskSpec spec;
  // The task's name for messages: its name once known, else its position.
  std::string label = str("task ", index + 1);
  if (const toml::node* n = t.get("name")) {
    MOE_USAGE_CHECK(n->is_string(), where(source, n->source()), ": ", label,
                    ": 'name' must be a string");
    spec.name = n->as_string()->get();
    MOE_USAGE_CHECK(plain_name(spec.name), where(source, n->source()), ": ", label, ": name '",
                    spec.name, "' must be letters, digits, '_', '-' or '.'");
    label = str("task '", spec.name, "'");
  }
  for (auto&& [key, node] : t) {
    const std::string k(key.str());
    const std::string at = where(source, node.source());
    if (k == "name") continue;
    if (k == "data") {
      MOE_USAGE_CHECK(node.is_string() && !node.as_string()->get().empty(), at, ": ", label,
                      ": 'data' must be a non-empty string (a token or text file)");
      spec.data = node.as_string()->get();
    } else if (k == "batch") {
      MOE_USAGE_CHECK(node.is_integer() && node.as_integer()->get() >= 1, at, ": ", label,
                      ": 'batch' must be an integer >= 1 (sequences per step)");
      spec.batch = node.as_integer()->get();
    } else if (k == "weight") {
      const std::optional<double> w = node.value<double>();  // an integer converts too
      MOE_USAGE_CHECK(
          (node.is_floating_point() || node.is_integer()) && w && std::isfinite(*w) && *w > 0, at,
          ": ", label, ": 'weight' must be a finite number > 0 (the loss weight)");
      spec.weight = *w;
    } else {
      throw UsageError(str(at, ": ", label, ": unknown key '", k,
                           "' (a task has name, data, batch and weight)"));
    }
  }
  const std::string at = where(source, t.source());
  MOE_USAGE_CHECK(!spec.name.empty(), at, ": ", label, ": missing key 'name'");
  MOE_USAGE_CHECK(!spec.data.empty(), at, ": ", label, ": missing key 'data'");
  MOE_USAGE_CHECK(spec.batch >= 1, at, ": ", label, ": missing key 'batch'");
  namespace fs = std::filesystem;
  if (fs::path(spec.data).is_relative() && !dir.empty())
    spec.data = (fs::path(dir) / spec.data).lexically_normal().string();
  MOE_USAGE_CHECK(fs::is_regular_file(spec.data), at, ": ", label, ": data file '", spec.data,
                  "' does not exist (relative paths are read from the tasks file's directory)");
  return spec;
}

}  // namespace

std::vector<TaskSpec> parse_tasks(std::string_view text, const std::string& source,
                                  const std::string& dir) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw UsageError(str(source, ":", e.source().begin.line, ":", e.source().begin.column,
                         ": not valid TOML: ", e.description()));
  }
  std::vector<TaskSpec> tasks;
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    MOE_USAGE_CHECK(k == "task", where(source, node.source()), ": unknown key '", k,
                    "' (a tasks file holds [[task]] tables only)");
    MOE_USAGE_CHECK(node.is_array_of_tables(), where(source, node.source()),
                    ": 'task' must be an array of tables: write each task as [[task]]");
    const toml::array& array = *node.as_array();
    for (size_t i = 0; i < array.size(); ++i)
      tasks.push_back(parse_task(*array[i].as_table(), i, source, dir));
  }
  MOE_USAGE_CHECK(!tasks.empty(), source,
                  ": no task (write one [[task]] table per task: name, data, batch, weight)");
  std::set<std::string> names;
  for (const TaskSpec& t : tasks)
    MOE_USAGE_CHECK(names.insert(t.name).second, source, ": task '", t.name,
                    "' is defined twice (task names must be unique)");
  return tasks;
}

std::vector<TaskSpec> read_tasks_file(const std::string& path) {
  io::check_input_file(path, "tasks file");  // a directory, device or FIFO: refused by name
  std::ifstream in(path, std::ios::binary);
  MOE_USAGE_CHECK(in.good(), flag_for(Setting::tasks), " ", path, ": cannot open the tasks file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_tasks(text.str(), path, std::filesystem::path(path).parent_path().string());
}

nlohmann::json to_json(const std::vector<TaskSpec>& tasks) {
  nlohmann::json j = nlohmann::json::array();
  for (const TaskSpec& t : tasks)
    j.push_back({{"name", t.name}, {"data", t.data}, {"batch", t.batch}, {"weight", t.weight}});
  return j;
}

// ---- allocation -------------------------------------------------------------------------------

std::vector<int64_t> workload_ranks(std::span<const double> work, int ranks) {
  const auto T = static_cast<int64_t>(work.size());
  MOE_CHECK(T >= 1 && T <= ranks, "workload_ranks: ", T, " tasks on ", ranks,
            " ranks (needs 1 <= tasks <= ranks)");
  double sum = 0;
  for (double w : work) {
    MOE_CHECK(w > 0 && std::isfinite(w), "workload_ranks: a task's work is ", w,
              " (must be finite and > 0)");
    sum += w;
  }
  std::vector<double> share(work.size());
  std::vector<int64_t> n(work.size());
  int64_t total = 0;
  for (size_t t = 0; t < work.size(); ++t) {
    share[t] = static_cast<double>(ranks) * work[t] / sum;
    n[t] = std::max<int64_t>(1, std::llround(share[t]));
    total += n[t];
  }
  // Each fix-up moves one rank, from the most over-served task or to the most under-served one;
  // the strict > keeps the lowest index on ties (deterministic on every rank).
  while (total > ranks) {
    size_t pick = work.size();
    for (size_t t = 0; t < work.size(); ++t)
      if (n[t] > 1 && (pick == work.size() || n[t] - share[t] > n[pick] - share[pick])) pick = t;
    --n[pick];
    --total;
  }
  while (total < ranks) {
    size_t pick = 0;
    for (size_t t = 1; t < work.size(); ++t)
      if (share[t] - n[t] > share[pick] - n[pick]) pick = t;
    ++n[pick];
    ++total;
  }
  return n;
}

// Task t on n_t consecutive ranks (in task order), its batch split evenly in rank order.
static void split_batches(TaskAllocation& a, const std::vector<TaskSpec>& tasks) {
  const int ranks = a.ranks();
  int rank = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const TaskSpec& task = tasks[t];
    const int64_t n = a.ranks_of_task[t];
    MOE_USAGE_CHECK(task.batch % n == 0, "task '", task.name, "': batch ", task.batch,
                    " does not split evenly over the ", n, " ranks it is given (of ", ranks,
                    "): use a batch that is a multiple of ", n);
    const int64_t rows = task.batch / n;
    for (int64_t j = 0; j < n; ++j)
      a.segments[static_cast<size_t>(rank++)].push_back({static_cast<int64_t>(t), j * rows, rows});
  }
}

TaskAllocation allocate_tasks(const std::vector<TaskSpec>& tasks, std::span<const double> work,
                              int ranks) {
  MOE_CHECK(work.size() == tasks.size(), "allocate_tasks: ", work.size(), " workloads for ",
            tasks.size(), " tasks");
  MOE_CHECK(ranks >= 1, "allocate_tasks: ", ranks, " ranks");
  TaskAllocation a;
  a.segments.resize(static_cast<size_t>(ranks));
  const auto T = static_cast<int>(tasks.size());
  if (T <= ranks) {
    a.ranks_of_task = workload_ranks(work, ranks);
    split_batches(a, tasks);
    return a;
  }
  // More tasks than ranks: light tasks share ranks. LPT over the workloads.
  a.ranks_of_task.assign(tasks.size(), 1);
  std::vector<int> order(tasks.size());
  for (int t = 0; t < T; ++t) order[static_cast<size_t>(t)] = t;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return work[static_cast<size_t>(x)] > work[static_cast<size_t>(y)];
  });
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  for (int t : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += work[static_cast<size_t>(t)];
    a.segments[r].push_back({t, 0, tasks[static_cast<size_t>(t)].batch});
  }
  for (auto& segments : a.segments)
    std::sort(segments.begin(), segments.end(),
              [](const TaskSegment& x, const TaskSegment& y) { return x.task < y.task; });
  return a;
}

TaskAllocation allocate_by_tokens(const std::vector<TaskSpec>& tasks, int64_t seq, int ranks) {
  std::vector<double> work;
  for (const TaskSpec& t : tasks) work.push_back(static_cast<double>(t.batch * seq));
  return allocate_tasks(tasks, work, ranks);
}

TaskAllocation allocate_equally(const std::vector<TaskSpec>& tasks, int ranks) {
  const auto T = static_cast<int64_t>(tasks.size());
  MOE_USAGE_CHECK(T <= ranks, flag_for(Setting::task_allocation), " equal: ", T, " tasks on ",
                  ranks, " ranks (it gives every task its own ranks)");
  TaskAllocation a;
  a.segments.resize(static_cast<size_t>(ranks));
  for (int64_t t = 0; t < T; ++t) a.ranks_of_task.push_back(ranks / T + (t < ranks % T ? 1 : 0));
  split_batches(a, tasks);
  return a;
}

nlohmann::json to_json(const TaskAllocation& a) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& segments : a.segments) {
    nlohmann::json r = nlohmann::json::array();
    for (const TaskSegment& s : segments) r.push_back({s.task, s.first_row, s.rows});
    ranks.push_back(r);
  }
  return {{"ranks_of_task", a.ranks_of_task}, {"segments", ranks}};
}

const char* allocation_rule_name(AllocationRule rule) {
  return rule == AllocationRule::equal ? "equal" : "workload";
}

AllocationRule parse_allocation_rule(std::string_view name) {
  for (AllocationRule rule : {AllocationRule::workload, AllocationRule::equal})
    if (name == allocation_rule_name(rule)) return rule;
  throw UsageError(
      str(flag_for(Setting::task_allocation), " must be workload or equal (got '", name, "')"));
}

TaskAllocation task_allocation_from_json(const nlohmann::json& j) {
  TaskAllocation a;
  try {
    a.ranks_of_task = j.at("ranks_of_task").get<std::vector<int64_t>>();
    for (const auto& r : j.at("segments")) {
      a.segments.emplace_back();
      for (const auto& s : r)
        a.segments.back().push_back(
            {s.at(0).get<int64_t>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("task allocation: ", json_error_words(e)));
  }
  return a;
}

std::string describe(const TaskAllocation& a, const std::vector<TaskSpec>& tasks) {
  std::string text;
  if (tasks.size() <= a.segments.size()) {
    for (size_t t = 0; t < tasks.size(); ++t)
      text += str(t ? " " : "", tasks[t].name, ":", a.ranks_of_task.at(t));
    return text + " ranks";
  }
  for (size_t r = 0; r < a.segments.size(); ++r) {
    text += str(r ? " | " : "", "rank ", r, ":");
    for (const TaskSegment& s : a.segments[r])
      text += " " + tasks.at(static_cast<size_t>(s.task)).name;
  }
  return text;
}

}  // namespace moe::train

// moe-train --tasks as a user runs it: the per-task step line and metrics, exact resume of a
// multi-task run, and clear errors for bad tasks files.
#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "support/run.h"
#include "support/state.h"

using namespace moe;
using test::run_command;

namespace {

const std::string kTiny =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4 --moe-every 1"
    " --eval-batches 2 --threads 2";

std::string train(const std::string& args) { return test::tool_path("moe-train") + " " + args; }

std::string task(const std::string& name, const std::string& corpus, int batch, double weight) {
  return str("[[task]]\nname = \"", name, "\"\ndata = \"", test::fortunes_path(corpus),
             "\"\nbatch = ", batch, "\nweight = ", weight, "\n\n");
}

std::string three_tasks() {
  return task("computers", "computers", 4, 1.0) + task("linux", "linux", 2, 0.5) +
         task("art", "art", 2, 2.0);
}

}  // namespace

TEST_CASE("cli: moe-train --tasks logs and meters every task, and resumes exactly", "[cli]") {
  test::ScratchDir a("cli-tasks-a"), b("cli-tasks-b");
  test::write_file(a / "tasks.toml", three_tasks());
  auto r1 = run_command(train("--tasks " + a / "tasks.toml" + " --out " + a.path() + kTiny +
                              " --steps 4 --checkpoint-every 2 --log-every 1 --metrics " +
                              a / "m.jsonl"));
  INFO(r1.err);
  REQUIRE(r1.exit_code == 0);
  CHECK(r1.err.find("allocation rank 0: computers linux art") != std::string::npos);
  CHECK(r1.err.find(" | computers ") != std::string::npos);
  int lines = 0;
  for (const std::string& line : test::lines_of(test::read_file(a / "m.jsonl"))) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++lines;
    REQUIRE(j.contains("tasks"));
    double objective = 0;
    for (const auto& [name, weight] : std::vector<std::pair<std::string, double>>{
             {"computers", 1.0}, {"linux", 0.5}, {"art", 2.0}}) {
      const nlohmann::json& t = j["tasks"][name];
      CHECK(t["samples_per_s"].get<double>() > 0);
      objective += weight * t["loss"].get<double>() * t["samples"].get<double>();
    }
    CHECK(j["loss"].get<double>() == Approx(objective / 8).epsilon(1e-6));
  }
  CHECK(lines == 4);
  // From step 2 in another directory: the same bits at step 4 (task cursors restored).
  auto r2 = run_command(train("--resume " + a / "step-00000002.h5" + " --out " + b.path() +
                              " --steps 4 --threads 2"));
  INFO(r2.err);
  REQUIRE(r2.exit_code == 0);
  io::Checkpoint x = io::load_checkpoint(a / "step-00000004.h5");
  io::Checkpoint y = io::load_checkpoint(b / "step-00000004.h5");
  CHECK(test::first_difference(x, y) == "");
  CHECK(x.train_config["tasks_state"]["cursors"] == nlohmann::json{16, 8, 8});
  // The tasks file changed under the checkpoint: refused, naming the task and the key.
  test::write_file(a / "tasks.toml", task("computers", "computers", 8, 1.0) +
                                         task("linux", "linux", 2, 0.5) +
                                         task("art", "art", 2, 2.0));
  auto r3 = run_command(train("--resume " + a / "step-00000002.h5" + " --out " + b.path() +
                              " --steps 4 --threads 2 --force"));
  CHECK(r3.exit_code == 2);
  CHECK(r3.err.find("task 1 ('computers'): batch was 4 in the checkpoint, the tasks file now "
                    "says 8") != std::string::npos);
}

TEST_CASE("cli: a task's data file that changed since the checkpoint is refused, naming the task",
          "[cli]") {
  test::ScratchDir a("cli-tasks-data");
  // The tasks train on copies, so one can change under the checkpoint.
  const std::string art = a / "art.txt", linux = a / "linux.txt";
  test::write_file(art, test::read_file(test::fortunes_path("art")));
  test::write_file(linux, test::read_file(test::fortunes_path("linux")));
  const std::string toml =
      str("[[task]]\nname = \"art\"\ndata = \"", art,
          "\"\nbatch = 2\n\n[[task]]\nname = \"linux\"\ndata = \"", linux, "\"\nbatch = 2\n");
  test::write_file(a / "tasks.toml", toml);
  auto r1 = run_command(train("--tasks " + a / "tasks.toml" + " --out " + a / "run" + kTiny +
                              " --steps 2 --checkpoint-every 1"));
  INFO(r1.err);
  REQUIRE(r1.exit_code == 0);
  const io::Checkpoint c = io::load_checkpoint(a / "run/step-00000001.h5");
  CHECK(c.train_config["tasks_state"]["data_crc32c"].size() == 2);
  // Untouched: it resumes.
  auto resume = [&] {
    return run_command(train("--resume " + a / "run/step-00000001.h5" + " --out " + a / "again" +
                             " --steps 2 --force"));
  };
  auto r2 = resume();
  INFO(r2.err);
  CHECK(r2.exit_code == 0);
  // One byte of the second task's file changed (the same size): refused, naming it.
  std::string text = test::read_file(linux);
  text[text.size() / 2] = text[text.size() / 2] == 'x' ? 'y' : 'x';
  test::write_file(linux, text);
  auto r3 = resume();
  INFO(r3.err);
  CHECK(r3.exit_code == 1);
  CHECK(r3.err.find("task 'linux' trained on '" + linux + "' as it was then") != std::string::npos);
  CHECK(r3.err.find("restore the file") != std::string::npos);
}

TEST_CASE("cli: bad tasks files and combinations give clear errors", "[cli]") {
  test::ScratchDir dir("cli-tasks-bad");
  auto run = [&](const std::string& toml, const std::string& flags = "") {
    test::write_file(dir / "tasks.toml", toml);
    return run_command(train("--tasks " + dir / "tasks.toml" + " --out " + dir / "out" + kTiny +
                             " --steps 1" + flags));
  };
  const std::string path = dir / "tasks.toml";
  struct Case {
    std::string toml, flags, message;
  };
  const std::vector<Case> cases{
      {three_tasks() + "[[task]]\nname = \"x\"\nbatch = 2\ndata = \"/nonexistent.txt\"\n", "",
       "task 'x': data file '/nonexistent.txt' does not exist"},
      {task("a", "art", 2, 1.0) + "epochs = 3\n", "", path + ":7: task 'a': unknown key 'epochs'"},
      {"[[task]]\nname = \"a\"\nbatch = 2\n", "", path + ":1: task 'a': missing key 'data'"},
      {task("a", "art", 2, 1.0) + task("a", "linux", 2, 1.0), "", "task 'a' is defined twice"},
      {task("a", "art", 2, 1.0) + "[[task]]\nname = \"b\"\nbatch = 0\n", "",
       path + ":9: task 'b': 'batch' must be an integer >= 1"},
      {"[[task]\n", "", path + ":1:"},
      {three_tasks(), " --data " + test::fortunes_path("art"), "replaces --data"},
      {three_tasks(), " --grad-accum 2", "--tasks does not combine with --grad-accum 2"},
      {three_tasks(), " --batch 8", "--batch does not apply with --tasks"},
      {three_tasks(), " --comm-scheduler priority",
       "--tasks does not combine with --comm-scheduler priority"},
  };
  for (const Case& c : cases) {
    auto r = run(c.toml, c.flags);
    INFO(c.toml << c.flags << "\n" << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("moe-train: error: ") != std::string::npos);
    CHECK(r.err.find(c.message) != std::string::npos);
  }
  auto missing = run_command(
      train("--tasks " + dir / "none.toml" + " --out " + dir / "out" + kTiny + " --steps 1"));
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("none.toml: cannot open the tasks file") != std::string::npos);
}

// A moe-train output directory is a checkpoint wherever one is read, and resuming never loses what
// the run wrote before: the tools as a user chains them (issue "The tools as people use them").
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "support/run.h"

using namespace moe;
using test::lines_of;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

TEST_CASE("cli: every tool that reads a checkpoint accepts a run directory", "[cli][rundir]") {
  test::ScratchDir dir("cli-rundir");
  const std::string run = dir / "run";
  test::train_on_fortunes(run, test::kTinyMixtral + " --steps 3");
  const std::string data = test::fortunes_path("linux");
  struct Case {
    std::string what, command;
  };
  const Case cases[] = {
      {"moe-infer score",
       tool("moe-infer", "score --model " + run + " --data " + data + " --max-sequences 2 -q")},
      {"moe-infer generate",
       "printf 'abc\\n' | " +
           tool("moe-infer", "generate --model " + run + " --prompts - --max-new 2 -q")},
      {"moe-profile record", tool("moe-profile", "record --model " + run + " --data " + data +
                                                     " --max-tokens 256 -o " + (dir / "t.h5"))},
      {"moe-distill",
       tool("moe-distill", "--teacher " + run + " --data " + data + " --out " + (dir / "student") +
                               " --student-layers 1 --steps 1 --threads 1 -q")},
      {"moe-convert inspect", tool("moe-convert", "inspect " + run)},
      {"moe-train --resume",
       tool("moe-train", "--resume " + run + " --out " + run + " --steps 4 --threads 1 -q")},
  };
  for (const Case& c : cases) {
    INFO(c.what << ": " << c.command);
    const test::RunResult r = run_command(c.command);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  // The resumed run continued the directory's own run, from its newest checkpoint.
  REQUIRE(fs::exists(dir / "run/step-00000004.h5"));
  REQUIRE(fs::read_symlink(dir / "run/last.h5") == "step-00000004.h5");
  // A directory without checkpoints is named, with what was looked for.
  const std::string empty = dir / "empty";
  fs::create_directories(empty);
  const test::RunResult none =
      run_command(tool("moe-infer", "score --model " + empty + " --data " + data));
  REQUIRE(none.exit_code == 1);
  const std::string named = std::string("'") + empty + "' holds no checkpoint";
  REQUIRE(none.err.find(named) != std::string::npos);
}

TEST_CASE("cli: a resumed run appends to its metrics file", "[cli][rundir]") {
  test::ScratchDir dir("cli-rundir-metrics");
  const std::string run = dir / "run", metrics = dir / "metrics.jsonl";
  test::train_on_fortunes(run,
                          test::kTinyMixtral + " --steps 4 --log-every 1 --metrics " + metrics);
  const std::vector<std::string> before = lines_of(test::read_file(metrics));
  REQUIRE(before.size() == 4);
  const test::RunResult r = run_command(
      tool("moe-train", "--resume " + run + " --out " + run +
                            " --steps 6 --log-every 1 --metrics " + metrics + " --threads 1 -q"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<std::string> after = lines_of(test::read_file(metrics));
  REQUIRE(after.size() == 6);
  for (size_t i = 0; i < before.size(); ++i) REQUIRE(after[i] == before[i]);
  REQUIRE(after[4].find("\"step\":5") != std::string::npos);
  REQUIRE(after[5].find("\"step\":6") != std::string::npos);
}

TEST_CASE("cli: a sharded checkpoint resumes on another rank count, re-sharded on load",
          "[cli][rundir]") {
  if (run_command("command -v mpiexec").exit_code != 0) {
    WARN("mpiexec not found: no sharded checkpoint can be written here");
    return;
  }
  test::ScratchDir dir("cli-rundir-ep");
  const std::string run = dir / "ep";
  const test::RunResult trained =
      run_command("OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
                  tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " + run +
                                        test::kTinyMixtral + " --steps 2 --ep 2"));
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  REQUIRE(fs::is_directory(run + "/step-00000002"));
  // --ep 2 given on one process: refused, naming the flag.
  const test::RunResult refused = run_command(
      tool("moe-train", "--resume " + run + " --out " + run + " --steps 3 --ep 2 --threads 1 -q"));
  INFO(refused.err);
  REQUIRE(refused.exit_code == 2);
  REQUIRE(refused.err.find("--ep 2 does not divide the 1 ranks") != std::string::npos);
  // Not given: the checkpoint's --ep 2 falls back to one process's --ep 1, the log says so, and
  // the run continues in place from step 2 (one file now; `last` names it alone).
  const test::RunResult r = run_command(
      tool("moe-train", "--resume " + run + " --out " + run + " --steps 3 --threads 1"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.err.find("resume: --ep 2 -> 1 (one process holds every expert)") != std::string::npos);
  REQUIRE(r.err.find("re-sharding it on load") != std::string::npos);
  REQUIRE(r.err.find("resumed from " + run + " at step 2") != std::string::npos);
  REQUIRE(fs::is_regular_file(run + "/step-00000003.h5"));
  REQUIRE_FALSE(fs::exists(fs::symlink_status(run + "/last")));
  // ... and once more: the run directory resolves to step 3, not to the older sharded step 2.
  const test::RunResult again = run_command(
      tool("moe-train", "--resume " + run + " --out " + run + " --steps 4 --threads 1"));
  INFO(again.err);
  REQUIRE(again.exit_code == 0);
  REQUIRE(again.err.find("resumed from " + run + " at step 3") != std::string::npos);
}

TEST_CASE("cli: a resumed run logs every flag that changes the checkpoint's settings",
          "[cli][rundir]") {
  test::ScratchDir dir("cli-rundir-overrides");
  const std::string run = dir / "run";
  test::train_on_fortunes(run, test::kTinyMixtral + " --steps 3 --warmup 1");
  const test::RunResult r = run_command(
      tool("moe-train", "--resume " + run + " --out " + run + " --steps 5 --lr 1e-3 --threads 1"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.err.find("resume: --steps 3 -> 5\n") != std::string::npos);
  REQUIRE(r.err.find("resume: --lr 0.003 -> 0.001\n") != std::string::npos);
  REQUIRE(r.err.find("resume: the learning rate of step 4 goes from ") != std::string::npos);
  // Nothing changed, nothing said: the run continues bit for bit.
  const test::RunResult same = run_command(
      tool("moe-train", "--resume " + run + " --out " + run + " --steps 5 --threads 1"));
  INFO(same.err);
  REQUIRE(same.exit_code == 0);
  REQUIRE(same.err.find("resume: ") == std::string::npos);
}

TEST_CASE("cli: a checkpoint resumes from another directory, and a moved data file is named",
          "[cli][rundir]") {
  test::ScratchDir dir("cli-rundir-data");
  fs::create_directories(dir / "work");
  fs::copy_file(test::fortunes_path("linux"), dir / "work/my.txt");
  // Trained with a relative --data inside work/ ...
  const test::RunResult trained = run_command(
      "cd " + (dir / "work") + " && " +
      tool("moe-train", "--data my.txt --out ../run" + test::kTinyMixtral + " --steps 2"));
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  // ... resumed from its parent: the checkpoint holds the file's absolute path.
  const std::string resume = tool("moe-train", "--resume run --out run --threads 1 -q");
  const test::RunResult here = run_command("cd " + dir.path() + " && " + resume + " --steps 3");
  INFO(here.err);
  REQUIRE(here.exit_code == 0);
  // The file moved: the error names it and the flag that fixes it.
  fs::rename(dir / "work/my.txt", dir / "moved.txt");
  const test::RunResult moved = run_command("cd " + dir.path() + " && " + resume + " --steps 4");
  REQUIRE(moved.exit_code == 1);
  const std::string named = "the checkpoint trains on '" +
                            (fs::path(dir.path()) / "work/my.txt").lexically_normal().string() +
                            "', which is not there any more: pass --data PATH";
  REQUIRE(moved.err.find(named) != std::string::npos);
  const test::RunResult again =
      run_command("cd " + dir.path() + " && " + resume + " --steps 4 --data moved.txt");
  INFO(again.err);
  REQUIRE(again.exit_code == 0);
  REQUIRE(again.err.find("is not the file the checkpoint trained on") == std::string::npos);
}

TEST_CASE("cli: a resumed run whose data file changed is refused, or told with --data",
          "[cli][rundir]") {
  test::ScratchDir dir("cli-rundir-changed");
  fs::copy_file(test::fortunes_path("linux"), dir / "my.txt");
  const std::string data = (fs::path(dir.path()) / "my.txt").lexically_normal().string();
  const test::RunResult trained =
      run_command(tool("moe-train", "--data " + data + " --out " + (dir / "run") +
                                        test::kTinyMixtral + " --steps 2"));
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  const std::string resume =
      tool("moe-train", "--resume " + (dir / "run") + " --out " + (dir / "run") + " --threads 1");
  // The same bytes under a new modification time: the same file.
  fs::last_write_time(dir / "my.txt", fs::file_time_type::clock::now());
  const test::RunResult same = run_command(resume + " --steps 3 -q");
  INFO(same.err);
  REQUIRE(same.exit_code == 0);
  // One byte changed, the size kept: the checksum tells.
  std::string text = test::read_file(dir / "my.txt");
  text[text.size() / 2] = text[text.size() / 2] == 'x' ? 'y' : 'x';
  test::write_file(dir / "my.txt", text);
  const test::RunResult edited = run_command(resume + " --steps 4 -q");
  REQUIRE(edited.exit_code == 1);
  REQUIRE(edited.err.find("the checkpoint trained on '" + data + "' as it was then (" +
                          std::to_string(text.size()) + " bytes, CRC-32C ") != std::string::npos);
  REQUIRE(edited.err.find("pass --data " + data + " to train on it as it is now") !=
          std::string::npos);
  // Asked for with --data: trained on, and said so in the log.
  const test::RunResult told = run_command(resume + " --steps 4 --data " + data);
  INFO(told.err);
  REQUIRE(told.exit_code == 0);
  REQUIRE(told.err.find("resume: --data " + data + " is not the file the checkpoint trained on") !=
          std::string::npos);
  // The new checkpoint records the file as it is now: resuming it again says nothing.
  const test::RunResult after = run_command(resume + " --steps 5");
  INFO(after.err);
  REQUIRE(after.exit_code == 0);
  REQUIRE(after.err.find("is not the file") == std::string::npos);
}

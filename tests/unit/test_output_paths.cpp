// Output paths: no writer renames over a device node, FIFO, directory or symbolic link; stale
// temporary files of dead processes are removed and those of live ones kept; a run directory
// holds one run.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>

#include "moe/io/checkpoint.h"
#include "moe/io/output.h"
#include "moe/io/safetensors.h"
#include "moe/train/run_dir.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

io::Checkpoint small_checkpoint() {
  io::Checkpoint c;
  c.model_config = {{"arch", "gpt"}, {"d_model", 4}};
  c.train_config = {{"lr", 1e-3}};
  c.params.push_back({"embed.weight", test::random_tensor({3, 4}, 5), false});
  return c;
}

}  // namespace

TEST_CASE("io: writers refuse to replace a FIFO, a symbolic link or a directory", "[io][out]") {
  test::ScratchDir dir("io-out-nodes");
  const std::string fifo = dir / "fifo", link = dir / "link", sub = dir / "sub";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  test::write_file(dir / "target", "target bytes");
  fs::create_symlink("target", link);
  fs::create_directory(sub);
  // As root, a real character device like /dev/full (major 1, minor 7), made in the scratch
  // directory: the case where a rename replaced /dev/full with a regular file.
  std::vector<std::string> nodes = {fifo, link, sub};
  const std::string device = dir / "full";
  if (::geteuid() == 0) {
    REQUIRE(::mknod(device.c_str(), S_IFCHR | 0600, ::makedev(1, 7)) == 0);
    nodes.push_back(device);
  }
  const io::Checkpoint c = small_checkpoint();
  for (const std::string& path : nodes) {
    INFO(path);
    for (const auto& write : std::vector<std::function<void()>>{
             [&] { io::save_checkpoint(path, c); },
             [&] { io::write_safetensors(path, c.params); },
             [&] { io::check_output_file(path, true); },
         }) {
      const std::string msg = test::error_of(write);
      REQUIRE_THAT(msg, Catch::Contains(str("'", path, "' is a")) &&
                            Catch::Contains("not a regular file: refusing to replace it"));
    }
  }
  if (::geteuid() == 0) REQUIRE(fs::is_character_file(fs::symlink_status(device)));
  REQUIRE(fs::is_fifo(fs::symlink_status(fifo)));
  REQUIRE(fs::is_symlink(fs::symlink_status(link)));
  REQUIRE(test::read_file(dir / "target") == "target bytes");
  REQUIRE(fs::is_empty(sub));
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path()))
    REQUIRE(e.path().filename().string().find(".tmp-") == std::string::npos);
  // A regular file is replaced (with `replace`), a missing one created.
  io::save_checkpoint(dir / "target", c);
  REQUIRE(io::load_checkpoint(dir / "target").params.size() == 1);
  const std::string target = dir / "target";
  REQUIRE(test::error_of([&] { io::check_output_file(target, false); }) ==
          str("'", target, "' already exists; remove it or pass --force to replace it"));
  REQUIRE(test::error_of([&] { io::check_output_file(dir / "new", false); }) == "(no error)");
}

TEST_CASE("io: a stream output refuses an existing file without replace", "[io][out]") {
  // Issue 45: text outputs (-o, --metrics, --summary) truncated an existing file without a word.
  test::ScratchDir dir("io-out-stream");
  const std::string file = dir / "metrics.jsonl", link = dir / "link", fifo = dir / "fifo";
  test::write_file(file, "kept\n");
  fs::create_symlink("metrics.jsonl", link);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {file, link}) {  // a stream follows the link to the file
    INFO(path);
    REQUIRE(test::error_of([&] { io::check_output_stream(path, false); }) ==
            str("'", path, "' already exists; remove it or pass --force to replace it"));
    REQUIRE(test::error_of([&] { io::check_output_stream(path, true); }) == "(no error)");
  }
  // Written into, never replaced: stdout, no output at all, a new file, a device, a FIFO.
  for (const std::string& path :
       {std::string("-"), std::string(), dir / "new.jsonl", std::string("/dev/null"), fifo}) {
    INFO(path);
    REQUIRE(test::error_of([&] { io::check_output_stream(path, false); }) == "(no error)");
  }
  REQUIRE(test::read_file(file) == "kept\n");
}

TEST_CASE("io: stale temporary files of dead processes are removed, live ones kept", "[io][out]") {
  test::ScratchDir dir("io-out-stale");
  const std::string own = std::to_string(::getpid());
  // PIDs above the kernel's largest (4194304) never run.
  const std::vector<std::string> stale = {"step-00000002.h5.tmp-999999999",
                                          ".last.h5.tmp-999999998", "out.h5.convert-999999997"};
  // Kept: a live process's, a finished checkpoint, names that only look alike, and a dead
  // process's file of a kind moe never writes (a user's own).
  const std::vector<std::string> kept = {"step-00000002.h5.tmp-" + own,
                                         "step-00000002.h5",
                                         "notes.tmp-abc",
                                         "x.tmp-",
                                         "model.tmp-1.h5",
                                         "notes.txt.tmp-999999996",
                                         ".h5.tmp-999999995"};
  for (const std::string& name : stale) test::write_file(dir / name, "partial");
  for (const std::string& name : kept) test::write_file(dir / name, "keep");
  std::vector<std::string> removed = io::remove_stale_temporaries(dir.path());
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected;
  for (const std::string& name : stale) expected.push_back(dir / name);
  std::sort(expected.begin(), expected.end());
  REQUIRE(removed == expected);
  for (const std::string& path : expected) REQUIRE_FALSE(fs::exists(path));
  for (const std::string& name : kept) REQUIRE(test::read_file(dir / name) == "keep");
  REQUIRE(io::remove_stale_temporaries(dir / "missing").empty());
}

TEST_CASE("io: interrupted sharded saves are removed, complete checkpoints kept", "[io][out]") {
  // Issue 45: a kill during an --ep 2 save left step-N/rank-R.h5.tmp-PID and step directories
  // without rank files; the clean-up looked only at the top of the run directory.
  test::ScratchDir dir("io-out-stale-sharded");
  const std::string own = std::to_string(::getpid());
  auto make = [&](const std::string& step, const std::vector<std::string>& files) {
    fs::create_directory(dir / step);
    for (const std::string& name : files) test::write_file(dir / (step + "/" + name), "x");
  };
  make("step-00000002", {"rank-00000.h5", "rank-00001.h5"});  // complete, older: kept
  // last's target: never touched, not even a dead process's temporary in it.
  make("step-00000004", {"rank-00000.h5", "rank-00001.h5", "rank-00001.h5.tmp-999999990"});
  fs::create_directory_symlink("step-00000004", dir / "last");
  make("step-00000006", {"rank-00000.h5", "rank-00001.h5.tmp-999999999"});  // interrupted
  make("step-00000008", {});                                                // never written
  make("step-00000010", {"rank-00000.h5.tmp-" + own});                      // a live save: kept
  make("step-00000012", {"rank-00000.h5", "rank-00001.h5"});  // complete, newer (a branch): kept
  make("notes", {});                                          // not ours
  std::vector<std::string> removed = io::remove_stale_temporaries(dir.path());
  std::sort(removed.begin(), removed.end());
  REQUIRE(removed == std::vector<std::string>{dir / "step-00000006", dir / "step-00000008"});
  REQUIRE_FALSE(fs::exists(dir / "step-00000006"));
  REQUIRE_FALSE(fs::exists(dir / "step-00000008"));
  for (const char* kept :
       {"step-00000002/rank-00001.h5", "step-00000004/rank-00001.h5.tmp-999999990",
        "step-00000012/rank-00001.h5", "notes"})
    REQUIRE(fs::exists(dir / kept));
  REQUIRE(fs::exists(dir / ("step-00000010/rank-00000.h5.tmp-" + own)));
  REQUIRE(fs::is_symlink(dir / "last"));
}

TEST_CASE("train: a run directory holds one run", "[train][out]") {
  test::ScratchDir dir("train-run-dir");
  const std::string run = dir / "run";
  train::check_run_directory(run, "", false);  // missing: fine
  fs::create_directory(run);
  test::write_file(run + "/notes.txt", "not a checkpoint");
  train::check_run_directory(run, "", false);  // no checkpoint: fine
  test::write_file(run + "/step-00000004.h5", "x");
  fs::create_symlink("step-00000004.h5", run + "/last.h5");
  REQUIRE(train::run_checkpoints(run) == std::vector<std::string>{"last.h5", "step-00000004.h5"});
  const std::string fresh = test::error_of([&] { train::check_run_directory(run, "", false); });
  REQUIRE_THAT(fresh, Catch::Contains("holds the checkpoints of another run (last.h5, "
                                      "step-00000004.h5)") &&
                          Catch::Contains("--resume " + run + "/last.h5") &&
                          Catch::Contains("--force"));
  const std::string other =
      test::error_of([&] { train::check_run_directory(run, dir / "b/last.h5", false); });
  REQUIRE_THAT(other, Catch::Contains("not of the run in '" + dir / "b/last.h5" + "'"));
  // Its own checkpoints, named through any spelling of the directory; or --force.
  train::check_run_directory(run, run + "/last.h5", false);
  train::check_run_directory(run + "/", dir / "./run/step-00000004.h5", false);
  train::check_run_directory(run, run + "/step-00000003/", false);  // sharded
  train::check_run_directory(run, "", true);
  // A sharded run: DIR/last and step-N directories.
  const std::string sharded = dir / "sharded";
  fs::create_directories(sharded + "/step-00000002");
  fs::create_directory_symlink("step-00000002", sharded + "/last");
  REQUIRE_THAT(test::error_of([&] { train::check_run_directory(sharded, "", false); }),
               Catch::Contains("--resume " + sharded + "/last,"));
}

// AtomicFile (commit, abandon, refusals) and CheckpointDir (names, `last`, discovery, resolution of
// a run directory, a checkpoint file and a sharded directory).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>

#include "moe/error.h"
#include "moe/io/atomic_file.h"
#include "moe/io/checkpoint_dir.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

// The names in `dir`, sorted: a temp left behind shows up here.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("AtomicFile: commit replaces the target whole, abandon keeps the old one",
          "[io][atomic]") {
  test::ScratchDir dir("atomic-file");
  const std::string target = dir / "out.h5";
  test::write_file(target, "old bytes");

  {  // abandoned by the destructor: the temp goes, the old file stays
    io::AtomicFile out(target);
    REQUIRE(out.temp() == target + ".tmp-" + std::to_string(::getpid()));
    test::write_file(out.temp(), "half a new file");
    REQUIRE(fs::exists(out.temp()));
  }
  REQUIRE(test::read_file(target) == "old bytes");
  REQUIRE(listing(dir.path()) == std::vector<std::string>{"out.h5"});

  {  // abandoned explicitly, then destroyed: still only the old file
    io::AtomicFile out(target, io::AtomicFile::Kind::file, ".convert-");
    REQUIRE(out.temp() == target + ".convert-" + std::to_string(::getpid()));
    test::write_file(out.temp(), "x");
    out.abandon();
    REQUIRE_FALSE(fs::exists(out.temp()));
  }
  REQUIRE(test::read_file(target) == "old bytes");

  {  // committed
    io::AtomicFile out(target);
    test::write_file(out.temp(), "new bytes");
    out.commit();
    out.sync_directory();
  }
  REQUIRE(test::read_file(target) == "new bytes");
  REQUIRE(listing(dir.path()) == std::vector<std::string>{"out.h5"});

  // A new file appears only on commit.
  const std::string fresh = dir / "fresh.h5";
  {
    io::AtomicFile out(fresh);
    test::write_file(out.temp(), "fresh");
    REQUIRE_FALSE(fs::exists(fresh));
    out.commit();
  }
  REQUIRE(test::read_file(fresh) == "fresh");
}

TEST_CASE("AtomicFile: refuses to replace what a rename would destroy", "[io][atomic]") {
  test::ScratchDir dir("atomic-refuse");
  const std::string fifo = dir / "fifo", link = dir / "link", sub = dir / "sub";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  test::write_file(dir / "target", "target bytes");
  fs::create_symlink("target", link);
  fs::create_directory(sub);
  // Before any work: the constructor refuses, and no temp is made.
  REQUIRE_THAT(test::error_of([&] { io::AtomicFile out(fifo); }),
               Catch::Contains("is a FIFO, not a regular file: refusing to replace it"));
  REQUIRE_THAT(test::error_of([&] { io::AtomicFile out(link); }),
               Catch::Contains("is a symbolic link"));
  REQUIRE_THAT(test::error_of([&] { io::AtomicFile out(sub); }), Catch::Contains("is a directory"));
  // The target turned into a link while the temp was written: the rename is refused, the temp
  // removed, the link and its target untouched.
  const std::string late = dir / "late";
  std::optional<io::AtomicFile> out(std::in_place, late);
  test::write_file(out->temp(), "new");
  fs::create_symlink("target", late);
  REQUIRE_THAT(test::error_of([&] { out->commit(); }), Catch::Contains("is a symbolic link"));
  const std::string temp = out->temp();
  out.reset();
  REQUIRE_FALSE(fs::exists(temp));
  REQUIRE(fs::is_symlink(late));
  REQUIRE(test::read_file(dir / "target") == "target bytes");
}

TEST_CASE("AtomicFile: '-' is stdout, which a whole-or-nothing output cannot use", "[io][atomic]") {
  test::ScratchDir dir("atomic-dash");
  const fs::path before = fs::current_path();
  fs::current_path(dir.path());  // a file named "-" would land here
  REQUIRE_THROWS_AS(io::AtomicFile("-"), UsageError);
  REQUIRE_THROWS_AS(io::AtomicFile("-", io::AtomicFile::Kind::directory), UsageError);
  REQUIRE_THAT(test::error_of([] { io::AtomicFile out("-"); }),
               Catch::Contains("'-' (stdout) cannot take this output"));
  const bool made = fs::exists("-") || fs::exists("-.tmp-" + std::to_string(::getpid()));
  fs::current_path(before);
  REQUIRE_FALSE(made);
}

TEST_CASE("AtomicFile: a directory is replaced whole", "[io][atomic]") {
  test::ScratchDir dir("atomic-dir");
  const std::string target = dir / "shards";
  fs::create_directory(target);
  test::write_file(target + "/old.h5", "old");
  {  // abandoned: the old directory stays as it was
    io::AtomicFile out(target + "/", io::AtomicFile::Kind::directory);
    REQUIRE(out.temp() == target + ".tmp-" + std::to_string(::getpid()));
    REQUIRE(fs::is_directory(out.temp()));
    test::write_file(out.temp() + "/new.h5", "new");
  }
  REQUIRE(listing(target) == std::vector<std::string>{"old.h5"});
  REQUIRE(listing(dir.path()) == std::vector<std::string>{"shards"});
  {
    io::AtomicFile out(target, io::AtomicFile::Kind::directory);
    test::write_file(out.temp() + "/new.h5", "new");
    out.commit();
    out.sync_directory();  // removes the old copy moved aside
  }
  REQUIRE(listing(target) == std::vector<std::string>{"new.h5"});
  REQUIRE(listing(dir.path()) == std::vector<std::string>{"shards"});
}

TEST_CASE("CheckpointDir: names and the last link", "[io][checkpoint_dir]") {
  REQUIRE(io::CheckpointDir::step_name(12) == "step-00000012.h5");
  REQUIRE(io::CheckpointDir::step_name(12, true) == "step-00000012");
  REQUIRE(io::CheckpointDir::step_name(123456789) == "step-123456789.h5");
  REQUIRE(std::string(io::CheckpointDir::last_name()) == "last.h5");
  REQUIRE(std::string(io::CheckpointDir::last_name(true)) == "last");
  REQUIRE(io::CheckpointDir::rank_file_name(3) == "rank-00003.h5");
  REQUIRE(io::CheckpointDir::rank_file("run/step-00000002", 1) ==
          "run/step-00000002/rank-00001.h5");
  REQUIRE(io::CheckpointDir::rank_of_file_name("rank-00042.h5") == 42);
  REQUIRE(io::CheckpointDir::rank_of_file_name("rank-0042.h5") == -1);
  REQUIRE(io::CheckpointDir::rank_of_file_name("rank-00042.h5.tmp-7") == -1);
  REQUIRE(io::CheckpointDir::is_step_name("step-00000001.h5"));
  REQUIRE(io::CheckpointDir::is_step_name("step-00000001"));
  REQUIRE_FALSE(io::CheckpointDir::is_step_name("step-1.h5"));
  REQUIRE_FALSE(io::CheckpointDir::is_step_name("step-0000000x.h5"));

  test::ScratchDir dir("checkpoint-dir-names");
  const io::CheckpointDir run(dir.path());
  REQUIRE(run.step(7) == dir / "step-00000007.h5");
  REQUIRE(run.step(7, true) == dir / "step-00000007");
  REQUIRE(run.last() == dir / "last.h5");
  REQUIRE(run.last(true) == dir / "last");

  REQUIRE(run.checkpoints().empty());
  test::write_file(run.step(4), "four");
  test::write_file(run.step(8), "eight");
  test::write_file(dir / "notes.txt", "not a checkpoint");
  run.point_last(4);
  REQUIRE(fs::read_symlink(run.last()) == "step-00000004.h5");
  run.point_last(8);  // moved, and no temp left behind
  REQUIRE(fs::read_symlink(run.last()) == "step-00000008.h5");
  REQUIRE(test::read_file(run.last()) == "eight");
  REQUIRE(run.checkpoints() ==
          std::vector<std::string>{"last.h5", "step-00000004.h5", "step-00000008.h5"});
  REQUIRE(listing(dir.path()).size() == 4);
  REQUIRE(io::CheckpointDir(dir / "missing").checkpoints().empty());
}

TEST_CASE("CheckpointDir: checkpoint_files resolves a run, a file and a sharded directory",
          "[io][checkpoint_dir]") {
  test::ScratchDir dir("checkpoint-dir-resolve");
  // A file run: the run directory resolves to last.h5.
  const io::CheckpointDir files_run(dir / "run");
  fs::create_directory(files_run.path());
  test::write_file(files_run.step(2), "two");
  files_run.point_last(2);
  REQUIRE(io::checkpoint_files({files_run.path()}) == std::vector<std::string>{files_run.last()});
  // A file as it is.
  REQUIRE(io::checkpoint_files({files_run.step(2)}) == std::vector<std::string>{files_run.step(2)});
  // A sharded run: the directory resolves through `last` to its rank files, in rank order.
  const io::CheckpointDir sharded_run(dir / "sharded");
  const std::string step_dir = sharded_run.step(3, true);
  fs::create_directories(step_dir);
  for (int r : {1, 0}) test::write_file(io::CheckpointDir::rank_file(step_dir, r), "shard");
  test::write_file(step_dir + "/rank-00002.h5.tmp-1", "a temp, ignored");
  sharded_run.point_last(3, true);
  const std::vector<std::string> shards = {io::CheckpointDir::rank_file(step_dir, 0),
                                           io::CheckpointDir::rank_file(step_dir, 1)};
  REQUIRE(io::checkpoint_files({step_dir}) == shards);
  const std::vector<std::string> via_last = io::checkpoint_files({sharded_run.path()});
  REQUIRE(via_last ==
          std::vector<std::string>{io::CheckpointDir::rank_file(sharded_run.last(true), 0),
                                   io::CheckpointDir::rank_file(sharded_run.last(true), 1)});
  // Errors: a missing path, a directory holding nothing, several paths with a directory.
  REQUIRE_THAT(test::error_of([&] { io::checkpoint_files({dir / "missing.h5"}); }),
               Catch::Contains("missing.h5': no such file or directory"));
  fs::create_directory(dir / "empty");
  REQUIRE_THAT(test::error_of([&] { io::checkpoint_files({dir / "empty"}); }),
               Catch::Contains("holds no checkpoint"));
  REQUIRE_THROWS_AS(io::checkpoint_files({files_run.step(2), step_dir}), UsageError);
  REQUIRE_THROWS_AS(io::checkpoint_files({}), UsageError);
}

TEST_CASE("CheckpointDir: a run that changes layout keeps one last link, the newest",
          "[io][checkpoint_dir]") {
  test::ScratchDir dir("checkpoint-dir-relayout");
  const io::CheckpointDir run(dir.path());
  // 4 ranks wrote a sharded step 2; one process resumed into the same directory and wrote step 4.
  fs::create_directories(run.step(2, true));
  test::write_file(io::CheckpointDir::rank_file(run.step(2, true), 0), "shard");
  run.point_last(2, true);
  test::write_file(run.step(4), "four");
  run.point_last(4);
  REQUIRE_FALSE(fs::exists(fs::symlink_status(run.last(true))));
  REQUIRE(io::resolve_checkpoint(run.path()).path == run.last());
  // ... and back: 4 ranks resumed step 4 and wrote a sharded step 6.
  fs::create_directories(run.step(6, true));
  test::write_file(io::CheckpointDir::rank_file(run.step(6, true), 0), "shard");
  run.point_last(6, true);
  REQUIRE_FALSE(fs::exists(fs::symlink_status(run.last())));
  const io::CheckpointRef six = io::resolve_checkpoint(run.path());
  REQUIRE(six.sharded);
  REQUIRE(fs::read_symlink(run.last(true)) == "step-00000006");
  // Both links left (a crash between the rename and the removal, or an earlier build): the one
  // naming the later step wins, whichever form it has.
  fs::create_symlink("step-00000004.h5", run.last());
  REQUIRE(io::resolve_checkpoint(run.path()).sharded);
  fs::remove(run.last(true));
  fs::create_symlink("step-00000002", run.last(true));
  REQUIRE(io::resolve_checkpoint(run.path()).path == run.last());
}

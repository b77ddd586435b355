// Mapped weights (issue 43 item 2, docs/FORMATS.md "Mapped weights"): moe-infer and moe-profile
// map a checkpoint's weight matrices and expert tensors from the file instead of reading them.
// A mapped model scores and generates bit for bit as the same model read into memory
// (--read-weights), in f32, bf16, Q8_0 and q4_k; its resident set holds what a pass touches, not
// the model; --verify-weights (and inspect --verify) report a damaged weight by its checksum; a
// truncated file is refused when opened, never met as a fault mid-run.
// The models are Mixtral-shaped with d_model and F of 256: each expert's chunk is a whole number
// of pages in every format tested (f32 256 KiB, bf16 128 KiB, q4_k 9 pages), so the files this
// build writes (data of a page or more on page boundaries) map every expert tensor.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "support/run.h"
#include "support/streamed_model.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// Mixtral-shaped, d_model 256 (see the top of the file); values with norms near 1.
ModelConfig model_config(int64_t layers, int64_t d_ff, int64_t experts) {
  return test::streamed_config(layers, 256, d_ff, experts);
}

// Writes an f32 model of `config` (expert tensors one expert at a time); returns its bytes.
int64_t write_model(const std::string& path, const ModelConfig& config) {
  return test::write_streamed_model(path, config, test::StreamedValues{11, true});
}

void require_ok(const test::RunResult& r) {
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

// How many parameters moe-infer reports mapped (its -v line "N of M parameters mapped").
int mapped_count(const std::string& err) {
  const size_t at = err.find(" parameters mapped from the file");
  REQUIRE(at != std::string::npos);
  const size_t of = err.rfind(" of ", at);
  const size_t start = err.rfind(": ", of) + 2;
  return std::stoi(err.substr(start, of - start));
}

// Runs `command` through /bin/sh with its output discarded; returns the exit status and the peak
// resident set (KiB) of the process and what it waited for (wait4's rusage).
std::pair<int, long> peak_rss(const std::string& command) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  REQUIRE(wait4(pid, &status, 0, &usage) == pid);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), usage.ru_maxrss};
}

// Where tensor `name` lies in the file (moe-convert inspect's placement): its first byte and the
// end of its last chunk.
std::pair<int64_t, int64_t> placement(const std::string& path, const std::string& name) {
  for (const io::TensorInfo& t : io::inspect({path}).tensors)
    if (t.name == name) return {t.file_offset, t.file_offset + t.file_extent};
  FAIL("no tensor " << name << " in " << path);
  return {-1, -1};
}

}  // namespace

TEST_CASE("cli: mapped weights score and generate as the weights read", "[cli][infer][mapped]") {
  test::ScratchDir dir("cli-mapped-weights");
  const std::string f32 = dir / "f32.h5";
  write_model(f32, model_config(2, 256, 4));
  const std::vector<std::pair<std::string, std::string>> conversions = {
      {"bf16", "dtype " + f32 + " --to bf16"},
      {"q8_0", "quantize " + f32},
      {"q4_k", "quantize " + f32 + " --type q4_k"}};
  std::vector<std::pair<std::string, std::string>> models = {{"f32", f32}};
  for (const auto& [name, args] : conversions) {
    const std::string out = dir / (name + ".h5");
    require_ok(run_command(tool("moe-convert", args + " -q -o " + out)));
    models.push_back({name, out});
  }
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, "The kernel\nA file system is\n");
  const std::string data =
      " --data " + test::fortunes_path("computers") + " --max-sequences 6 --threads 1";
  for (const auto& [name, path] : models) {
    INFO(name);
    for (const std::string& sub :
         {"score" + data, "generate --prompts " + prompts + " --max-new 12 --temperature 0"}) {
      const std::string base = sub + " --model " + path;
      auto mapped = run_command(tool("moe-infer", base + " -v"));
      auto verified = run_command(tool("moe-infer", base + " -v --verify-weights"));
      auto read = run_command(tool("moe-infer", base + " -q --read-weights"));
      require_ok(mapped);
      require_ok(verified);
      require_ok(read);
      // At least every expert tensor (3 a layer) is mapped; Q8_0 rows are packed into the
      // kernels' row groups at load, so none of that model's quantised weights is.
      if (name != "q8_0") CHECK(mapped_count(mapped.err) >= 2 * 3);
      REQUIRE(mapped_count(verified.err) == mapped_count(mapped.err));
      REQUIRE(!mapped.out.empty());
      REQUIRE(mapped.out == read.out);
      REQUIRE(verified.out == read.out);
    }
  }
}

TEST_CASE("cli: a mapped model's resident set is what a pass touches, not the model",
          "[cli][infer][mapped]") {
  test::ScratchDir dir("cli-mapped-rss");
  // 8 layers of 16 experts of [1024, 256] f32 (1 MiB each): 410 MB. One token routed to 2 of the
  // 16 experts of each layer touches an eighth of them.
  const std::string model = dir / "big.h5";
  const int64_t model_bytes = write_model(model, model_config(8, 1024, 16));
  const std::string prompts = dir / "one.txt";
  test::write_file(prompts, "A\n");
  const std::string args = "generate --model " + model + " --prompts " + prompts +
                           " --max-new 1 --temperature 0 --threads 1 -q";
  const auto [read_status, read_kib] = peak_rss(tool("moe-infer", args + " --read-weights"));
  const auto [mapped_status, mapped_kib] = peak_rss(tool("moe-infer", args));
  REQUIRE(read_status == 0);
  REQUIRE(mapped_status == 0);
  const int64_t read_bytes = int64_t(read_kib) * 1024, mapped_bytes = int64_t(mapped_kib) * 1024;
  INFO("model " << model_bytes << " bytes; peak RSS read " << read_bytes << ", mapped "
                << mapped_bytes);
  // Reading holds the model; mapping holds the touched eighth of the experts and the rest of the
  // weights (20 MB of attention and embeddings), far less than half of it.
  REQUIRE(read_bytes > model_bytes);
  REQUIRE(mapped_bytes < read_bytes - model_bytes / 2);
}

TEST_CASE("cli: a damaged mapped weight is reported by --verify-weights and inspect --verify",
          "[cli][infer][mapped]") {
  test::ScratchDir dir("cli-mapped-damage");
  const std::string model = dir / "model.h5";
  write_model(model, model_config(2, 256, 4));
  const std::string tensor = "blocks.1.moe.experts.w2";
  {  // one byte of the first expert's values, inside the mapped chunk (before its checksum)
    const int64_t at = placement(model, tensor).first + 1000;
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(at);
    f.write(&byte, 1);
  }
  const std::string args = "score --model " + model + " --data " +
                           test::fortunes_path("computers") + " --max-sequences 2";
  auto verified = run_command(tool("moe-infer", args + " --verify-weights"));
  REQUIRE(verified.exit_code == 1);
  REQUIRE_THAT(verified.err, Catch::Contains("moe-infer: error: '" + model + "'") &&
                                 Catch::Contains("/params/" + tensor + " (expert ") &&
                                 Catch::Contains("the file is damaged: checksum mismatch"));
  auto recorded = run_command(tool("moe-profile", "record --model " + model + " --data " +
                                                      test::fortunes_path("computers") +
                                                      " --verify-weights -o " + (dir / "t.h5")));
  REQUIRE(recorded.exit_code == 1);
  REQUIRE_THAT(recorded.err, Catch::Contains("checksum mismatch"));
  REQUIRE(!fs::exists(dir / "t.h5"));
  auto read = run_command(tool("moe-infer", args + " --read-weights"));
  REQUIRE(read.exit_code == 1);
  REQUIRE_THAT(read.err, Catch::Contains("checksum mismatch"));
  auto inspected = run_command(tool("moe-convert", "inspect --verify " + model));
  REQUIRE(inspected.exit_code == 1);
  REQUIRE_THAT(inspected.err, Catch::Contains(tensor));
}

TEST_CASE("cli: a truncated checkpoint is refused when opened, not met mid-run",
          "[cli][infer][mapped]") {
  test::ScratchDir dir("cli-mapped-truncated");
  const std::string model = dir / "model.h5";
  write_model(model, model_config(2, 256, 4));
  // Cut inside the last expert tensor written: the file ends before its last chunk does.
  fs::resize_file(
      model, static_cast<uintmax_t>(placement(model, "blocks.1.moe.experts.w3").second - 4096));
  const std::string args = " --model " + model + " --data " + test::fortunes_path("computers");
  for (const std::string& command :
       {tool("moe-infer", "score --max-sequences 2" + args),
        tool("moe-infer", "score --max-sequences 2 --read-weights" + args),
        tool("moe-profile", "record --max-tokens 64 -o " + (dir / "t.h5") + args)}) {
    INFO(command);
    auto r = run_command(command);
    REQUIRE(r.exit_code == 1);  // not a signal (SIGBUS: 135 through the shell)
    INFO(r.err);
    REQUIRE_THAT(r.err, Catch::Contains("'" + model + "'") && Catch::Contains("truncated"));
  }
}

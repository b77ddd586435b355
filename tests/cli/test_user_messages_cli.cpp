// Messages in the user's words (issue 45, item 11): a failed HDF5 call, a JSON file that does not
// parse or holds a value of the wrong type, a directory given as an input file, a failed
// allocation. Each error names the file and says what went wrong in words; none carries the C++
// text of a library call, nlohmann's exception tags or a bare std::bad_alloc.
#include <hdf5.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/io/hdf5.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// What a message must never hold: HDF5 call text (H5Fcreate(path.c_str(), ...)), nlohmann's
// "[json.exception.parse_error.101]", C++ names, a reader's name as a prefix ("safetensors:").
const std::vector<std::string> kInternals = {
    "json.exception", "H5",         "std::",        "bad_alloc",
    "c_str",          "split_tail", "BatchSampler", "safetensors:"};

void expect_words(const test::RunResult& r, const std::string& tool_name,
                  const std::vector<std::string>& words) {
  INFO(r.err);
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.rfind(tool_name + ": error: ", 0) == 0);
  for (const std::string& w : words) REQUIRE(r.err.find(w) != std::string::npos);
  for (const std::string& bad : kInternals) REQUIRE(r.err.find(bad) == std::string::npos);
}

struct Trained {
  test::ScratchDir dir{"cli-user-messages"};
  std::string ckpt, trace, table;
  Trained() {
    ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2");
    trace = dir / "trace.h5";
    table = dir / "paths.json";
    const std::string data = test::fortunes_path("linux");
    for (const std::string& command :
         {tool("moe-profile",
               "record -q --model " + ckpt + " --data " + data + " --max-tokens 2000 -o " + trace),
          tool("moe-profile", "paths -q " + trace + " -o " + table)}) {
      const test::RunResult r = run_command(command);
      INFO(command << "\n" << r.err);
      REQUIRE(r.exit_code == 0);
    }
  }
};

Trained& trained() {
  static Trained t;
  return t;
}

struct Case {
  std::string name, tool, args;
  std::vector<std::string> words;
};

void run_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    INFO(c.name << ": " << c.tool << " " << c.args);
    expect_words(run_command("timeout 60 " + tool(c.tool, c.args)), c.tool, c.words);
  }
}

// A copy of the HDF5 file `from` at `to` whose root attribute `name` (JSON text) is edited.
void edit_json_attr(const std::string& from, const std::string& to, const char* name,
                    const std::function<void(nlohmann::json&)>& edit) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  io::h5::Session session;
  const io::h5::Where root{to, "/"};
  const hid_t file = H5Fopen(to.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  nlohmann::json j = io::h5::has_attr(file, name, root)
                         ? nlohmann::json::parse(io::h5::read_string_attr(file, name, root))
                         : nlohmann::json();
  edit(j);
  if (io::h5::has_attr(file, name, root)) REQUIRE(H5Adelete(file, name) >= 0);
  io::h5::write_string_attr(file, name, j.dump(), root);
  REQUIRE(H5Fclose(file) >= 0);
}

}  // namespace

TEST_CASE("cli: HDF5 failures are told in words, naming the file", "[cli][messages]") {
  // Before: "'out/x.h5.tmp-123' /: H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl) failed:
  // unable to create file; unable to open file: time = ..., tent_flags = 13; ...".
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-hdf5");
  const std::string absent = dir / "absent";
  test::write_file(dir / "plain", "a file, not a directory\n");
  run_cases({
      {"freeze into a missing directory",
       "moe-convert",
       "freeze " + t.ckpt + " -o " + absent + "/x.h5",
       {"cannot create '" + absent + "/x.h5'", "directory '" + absent + "' does not exist"}},
      {"trace into a missing directory",
       "moe-profile",
       "record -q --model " + t.ckpt + " --data " + test::fortunes_path("linux") + " -o " + absent +
           "/t.h5",
       {"cannot create '" + absent + "/t.h5'", "directory '" + absent + "' does not exist"}},
      {"a file where the directory should be",
       "moe-convert",
       "freeze " + t.ckpt + " -o " + (dir / "plain") + "/x.h5",
       {dir / "plain", "ot a directory"}},
  });
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string locked = dir / "locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    run_cases({{"freeze into a read-only directory",
                "moe-convert",
                "freeze " + t.ckpt + " -o " + locked + "/x.h5",
                {"cannot create '" + locked + "/x.h5'",
                 "no permission to write in directory '" + locked + "'"}}});
    fs::permissions(locked, fs::perms::owner_all);
  }
  // Bits flipped in tensor data (Fletcher32): "reading the data failed: the file is damaged:
  // checksum mismatch" (before: "H5Dread(dataset, type, memory, ...) failed: ...").
  const std::string bytes = test::read_file(t.ckpt);
  int damaged = 0;
  for (int eighth = 3; eighth <= 5; ++eighth) {
    std::string copy = bytes;
    copy[copy.size() * eighth / 8] ^= 0x10;
    const std::string path = dir / "damaged.h5";
    test::write_file(path, copy);
    const test::RunResult r = run_command(tool("moe-convert", "inspect --verify " + path));
    if (r.exit_code == 0) continue;  // padding: nothing read is damaged
    expect_words(r, "moe-convert", {path});
    damaged += r.err.find("the file is damaged: checksum mismatch") != std::string::npos;
  }
  REQUIRE(damaged > 0);
}

TEST_CASE("cli: JSON that does not parse names the file, line and column", "[cli][messages]") {
  // Before: "[json.exception.parse_error.101] parse error at line 1, column 17: syntax error
  // while parsing object key - ..." and "[json.exception.type_error.302] type must be string,
  // but is null".
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-json");
  const std::string prompts = dir / "prompts.jsonl", null_prompt = dir / "null.jsonl",
                    requests = dir / "requests.jsonl", tokenizer = dir / "tokenizer.json",
                    metrics = dir / "metrics.jsonl", table = dir / "paths.json";
  test::write_file(prompts, "plain text prompt\n{\"prompt\": \"hi\",}\n");
  test::write_file(null_prompt, "{\"prompt\": null}\n");
  test::write_file(requests, "{\"context\": \"a\", \"continuation\": }\n");
  test::write_file(tokenizer, "{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0},}}\n");
  const std::string null_id = dir / "null-id/tokenizer.json", added = dir / "added/tokenizer.json";
  fs::create_directories(dir / "null-id");
  fs::create_directories(dir / "added");
  test::write_file(null_id, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": null}}}");
  test::write_file(added,
                   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}},"
                   " \"added_tokens\": [{\"id\": 1, \"content\": 3}]}");
  test::write_file(metrics, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": }\n");
  test::write_file(table, "{\"format\": \"moe.paths\",\n \"layers\": tru}\n");
  // A Hugging Face directory with a damaged config.json, and one with a damaged safetensors
  // header.
  const std::string hf = dir / "hf", bad_config = dir / "hf-config", bad_header = dir / "hf-header";
  REQUIRE(run_command(tool("moe-convert", "export-hf -q " + t.ckpt + " -o " + hf)).exit_code == 0);
  fs::copy(hf, bad_config);
  fs::copy(hf, bad_header);
  test::write_file(bad_config + "/config.json", "{\"architectures\": [\"MixtralForCausalLM\"],}");
  std::string st = test::read_file(hf + "/model.safetensors");
  st[8] = '[';  // the header's opening brace
  test::write_file(bad_header + "/model.safetensors", st);
  const std::string data = " --data " + test::fortunes_path("linux");
  run_cases({
      {"prompt file",
       "moe-infer",
       "generate --model " + t.ckpt + " --prompts " + prompts,
       {prompts + ":2: invalid JSON at column 17: unexpected '}'"}},
      {"prompt of the wrong type",
       "moe-infer",
       "generate --model " + t.ckpt + " --prompts " + null_prompt,
       {null_prompt + ":1: \"prompt\" must be a string, got null"}},
      {"request file",
       "moe-infer",
       "loglikelihood --model " + t.ckpt + " --requests " + requests,
       {requests + ":1: invalid JSON at column 34"}},
      {"tokenizer",
       "moe-infer",
       "score --model " + t.ckpt + data + " --tokenizer " + tokenizer,
       {tokenizer, "invalid JSON at line 2, column 20"}},
      {"tokenizer id of the wrong type",
       "moe-infer",
       "score --model " + t.ckpt + data + " --tokenizer " + null_id,
       {"tokenizer '" + null_id + "': model.vocab[\"a\"] must be a number, got null"}},
      {"added token of the wrong type",
       "moe-infer",
       "score --model " + t.ckpt + data + " --tokenizer " + added,
       {"tokenizer '" + added + "': added_tokens[0].content must be a string, got a number"}},
      {"metrics",
       "moe-profile",
       "plot-metrics " + metrics + " -o " + (dir / "m.svg"),
       {metrics + ":2: invalid JSON at column 21"}},
      {"path table",
       "moe-profile",
       "accuracy " + table + " " + t.trace,
       {table, "invalid JSON at line 2, column 15"}},
      {"config.json",
       "moe-convert",
       "import-hf " + bad_config + " -o " + (dir / "a.h5"),
       {bad_config + "/config.json", "invalid JSON at line 1, column"}},
      {"safetensors header",
       "moe-convert",
       "import-hf " + bad_header + " -o " + (dir / "b.h5"),
       {bad_header + "/model.safetensors", "header is not valid JSON: invalid JSON at line 1"}},
  });
}

TEST_CASE("cli: a JSON attribute of the wrong type names the file, attribute and key",
          "[cli][messages]") {
  // Before: "model config: must be a number, got null" (no file, no key), nlohmann's
  // "[json.exception.type_error.302] ..." for a history entry, a trace's model_config unchecked.
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-attrs");
  const std::string layers = dir / "layers.h5", experts = dir / "experts.h5",
                    history = dir / "history.h5", trace = dir / "trace.h5";
  edit_json_attr(t.ckpt, layers, "model_config", [](auto& j) { j["layers"] = nullptr; });
  edit_json_attr(t.ckpt, experts, "model_config", [](auto& j) { j["experts_per_layer"][1] = "4"; });
  edit_json_attr(t.ckpt, history, "history",
                 [](auto& j) { j = nlohmann::json::parse(R"([{"tool": null}])"); });
  edit_json_attr(t.trace, trace, "model_config", [](auto& j) { j["top_k"] = "2"; });
  const std::string config = "': attribute 'model_config': ";
  run_cases({
      {"model config",
       "moe-convert",
       "inspect " + layers,
       {"checkpoint '" + layers + config + "\"layers\" must be an integer, got null"}},
      {"model config list",
       "moe-infer",
       "score --model " + experts + " --data " + test::fortunes_path("linux"),
       {"checkpoint '" + experts + config +
        "\"experts_per_layer[1]\" must be an integer, got a string"}},
      {"conversion history",
       "moe-convert",
       "inspect " + history,
       {"checkpoint '" + history +
        "': attribute 'history': \"[0].tool\" must be a string, got null"}},
      {"trace model config",
       "moe-profile",
       "summary " + trace,
       {"trace '" + trace + config + "\"top_k\" must be an integer, got a string"}},
  });
}

TEST_CASE("cli: a resumed checkpoint's train_config of the wrong type names the file and key",
          "[cli][messages]") {
  // Before: "training config: must be a number, got null" (no file, no key) for the settings,
  // and the placement state's cost model and vExpert maps named neither key nor file.
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-train-config");
  const std::string lr = dir / "lr.h5", batch = dir / "batch.h5", cost = dir / "cost.h5",
                    slots = dir / "slots.h5";
  edit_json_attr(t.ckpt, lr, "train_config", [](auto& j) { j["lr"] = nullptr; });
  edit_json_attr(t.ckpt, batch, "train_config", [](auto& j) { j["batch"] = "x"; });
  edit_json_attr(t.ckpt, cost, "train_config", [](auto& j) {
    j["placement_state"] = {{"policy", "flexmoe"}, {"ranks", 1}, {"layers", nlohmann::json::object()},
                            {"cost", {{"bytes_per_token", "many"}}}};
  });
  edit_json_attr(t.ckpt, slots, "train_config", [](auto& j) {
    j["placement_state"] = {
        {"policy", "flexmoe"},
        {"ranks", 1},
        {"layers", {{"1", {{"experts", 4}, {"slots_per_rank", 5}, {"slots", {0, 1.5}}}}}}};
  });
  const std::string config = "': attribute 'train_config': ";
  std::vector<Case> cases = {
      {"lr", "moe-train", lr, {"checkpoint '" + lr + config + "\"lr\" must be a number, got null"}},
      {"batch",
       "moe-train",
       batch,
       {"checkpoint '" + batch + config + "\"batch\" must be an integer, got a string"}},
      {"cost",
       "moe-train",
       cost,
       {"checkpoint '" + cost + config +
        "\"placement_state.cost.bytes_per_token\" must be a number, got a string"}},
      {"slots",
       "moe-train",
       slots,
       {"checkpoint '" + slots + config +
        "\"placement_state.layers.1.slots[1]\" must be an integer, got 1.5"}},
  };
  for (Case& c : cases) c.args = "--resume " + c.args + " --out " + (dir / c.name) + " --steps 3";
  run_cases(cases);
}

TEST_CASE("cli: a resumed FlexMoE placement state missing a key names the checkpoint file",
          "[cli][messages]") {
  // Before: "checkpoint placement state: \"ranks\" is missing", naming no file (the types were
  // checked with the file's name when the session opened it; a missing key only when the
  // placement read it).
  REQUIRE(run_command("command -v mpiexec").exit_code == 0);  // scripts/setup installs it
  test::ScratchDir dir("cli-user-messages-placement");
  const std::string run = dir / "run", damaged = dir / "damaged.h5";
  const std::string placed = " --ep 2 --placement flexmoe";
  const test::RunResult trained = run_command(
      "OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
      tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " + run +
                            test::kTinyMixtral + " --steps 2" + placed));
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  // A placed run's rank 0 writes every logical expert: one file.
  edit_json_attr(run + "/step-00000002.h5", damaged, "train_config", [](auto& j) {
    REQUIRE(j.at("placement_state").contains("ranks"));
    j["placement_state"].erase("ranks");
  });
  const test::RunResult resumed = run_command(
      "OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
      tool("moe-train",
           "--resume " + damaged + " --out " + (dir / "again") + " --steps 3 --threads 1" +
               placed));
  INFO(resumed.err);
  CHECK(resumed.exit_code != 0);
  CHECK_THAT(resumed.err, Catch::Contains("checkpoint '" + damaged +
                                          "': attribute 'train_config': \"placement_state\": "
                                          "\"ranks\" is missing"));
}

TEST_CASE("cli: a directory given as an input file is refused by name", "[cli][messages]") {
  // Before: "basic_filebuf::underflow error reading the file: Is a directory" (moe-profile
  // accuracy), or nothing read at all.
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-dirs");
  const std::string folder = dir / "folder";
  fs::create_directory(folder);
  // Every input, one message.
  std::vector<Case> cases = {
      {"path table", "moe-profile", "accuracy " + folder + " " + t.trace, {}},
      {"trace", "moe-profile", "accuracy " + t.table + " " + folder, {}},
      {"metrics", "moe-profile", "plot-metrics " + folder + " -o " + (dir / "m.svg"), {}},
      {"prompts", "moe-infer", "generate --model " + t.ckpt + " --prompts " + folder, {}},
      {"requests", "moe-infer", "loglikelihood --model " + t.ckpt + " --requests " + folder, {}},
  };
  for (Case& c : cases) c.words = {"'" + folder + "': is a directory"};
  run_cases(cases);
}

TEST_CASE("cli: too little data is said naming the data file, without function names",
          "[cli][messages]") {
  // Before: "split_tail: ..." (moe-train) and "BatchSampler: the data holds 9 tokens, a window of
  // sequence length 16 needs 17" (moe-profile record), naming no file.
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-split");
  const std::string tiny = dir / "tiny.txt", tinier = dir / "tinier.txt";
  test::write_file(tiny, "hello world, short\n");  // one window, no validation part
  test::write_file(tinier, "hi there\n");
  expect_words(run_command(tool("moe-train", "--data " + tiny + " --out " + (dir / "run") +
                                                 test::kTinyMixtral + " --steps 1")),
               "moe-train", {"the data '" + tiny + "' holds 19 tokens, too few"});
  // A --val file too short for one window is named, not the training data.
  expect_words(run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --val " +
                                                 tinier + " --out " + (dir / "run-val") +
                                                 test::kTinyMixtral + " --steps 1")),
               "moe-train", {"the data '" + tinier + "' holds 9 tokens, too few"});
  // moe-distill: the teacher's expert loads are measured on the training part of the data.
  expect_words(run_command(tool("moe-distill", "--teacher " + t.ckpt + " --data " + tiny + " -o " +
                                                   (dir / "student") + " --steps 1")),
               "moe-distill", {"the data '" + tiny + "' holds 19 tokens, too few"});
  expect_words(
      run_command(tool("moe-profile", "record -q --model " + t.ckpt + " --data " + tinier + " -o " +
                                          (dir / "t.h5"))),
      "moe-profile",
      {"the data '" + tinier + "' holds 9 tokens, too few for a window of sequence length 16"});
}

TEST_CASE("cli: a model the exports cannot take is refused without function names",
          "[cli][messages]") {
  // Before: "export_hf: only the mixtral flavour ..." and "export_gguf: ...".
  test::ScratchDir dir("cli-user-messages-export");
  const std::string gpt = test::train_on_fortunes(
      dir / "run",
      " --arch gpt --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4"
      " --moe-every 1 --batch 4 --eval-batches 1 --threads 1 -q --steps 1");
  for (const auto& [command, words] : std::vector<std::pair<std::string, std::string>>{
           {"export-hf " + gpt + " -o " + (dir / "hf"), "Hugging Face export: only the mixtral"},
           {"export-gguf " + gpt + " -o " + (dir / "m.gguf"), "GGUF export: only the mixtral"}}) {
    const test::RunResult r = run_command(tool("moe-convert", command));
    expect_words(r, "moe-convert", {words});
    REQUIRE(r.err.find("export_") == std::string::npos);
  }
}

TEST_CASE("cli: a failed allocation is told as out of memory with what to shrink",
          "[cli][messages]") {
  // Before: "moe-infer: error: std::bad_alloc". 200 MB of text become 800 MB of token ids, more
  // than the limit leaves once the tool has started.
  if (test::kAddressSanitizer) return;  // ASan cannot run under an address-space limit
  Trained& t = trained();
  test::ScratchDir dir("cli-user-messages-oom");
  const std::string big = dir / "big.txt";
  {
    std::ofstream out(big, std::ios::binary);
    const std::string line = "the quick brown fox jumps over the lazy dog\n";
    for (int64_t written = 0; written < (int64_t(200) << 20); written += line.size()) out << line;
  }
  const std::string small =
      tool("moe-infer", "score -q --model " + t.ckpt + " --data " + test::fortunes_path("linux") +
                            " --max-sequences 2 --threads 1");
  const int64_t start = test::smallest_address_space(small);
  const test::RunResult r = run_command(test::under_limit(
      start + (int64_t(256) << 20),
      "timeout 120 " + tool("moe-infer", "score -q --model " + t.ckpt + " --data " + big +
                                             " --max-sequences 2 --threads 1")));
  fs::remove(big);
  expect_words(r, "moe-infer", {"out of memory while running 'moe-infer score'", "--batch"});
}

// io::map_checkpoint (docs/FORMATS.md "Mapped weights"): which tensors come back mapped, that
// their bytes are the file's (bitwise what load_checkpoint reads), that a write through a mapping
// is a fault rather than a change, that --verify-weights' checksum is HDF5's Fletcher32 (fed in
// pieces or whole), and that a damaged chunk is found only when verifying.
// Shape letters: E experts, F expert hidden width, D model width.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>
#include <fstream>
#include <vector>

#include "io/mapped_weights.h"
#include "moe/io/checkpoint.h"
#include "moe/rng.h"
#include "support/run.h"

using namespace moe;

namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = rng_normal(seed, static_cast<uint64_t>(i));
  return t;
}

// A checkpoint of an expert tensor [E, F, D] = [4, 64, 64] (16 KiB, four pages, an expert), a
// matrix [64, 64] (one chunk of 16 KiB, page-aligned) and a vector [64] (256 bytes).
io::Checkpoint small_checkpoint() {
  io::Checkpoint c;
  c.model_config = {
      {"arch", "mixtral"}, {"layers", 1}, {"d_model", 64}, {"experts_per_layer", {4}}};
  c.train_config = nullptr;
  c.params.push_back({"blocks.0.moe.experts.w1", random_tensor({4, 64, 64}, 1), true, {}});
  c.params.push_back({"blocks.0.attn.q.weight", random_tensor({64, 64}, 2), false, {}});
  c.params.push_back({"blocks.0.norm1.weight", random_tensor({64}, 3), false, {}});
  return c;
}

const io::NamedTensor& named(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& nt : c.params)
    if (nt.name == name) return nt;
  FAIL("no tensor " << name);
  return c.params.front();
}

const io::StreamFilter kNoStreaming = [](bool, const std::string&) { return false; };

}  // namespace

TEST_CASE("io: mapped tensors are the file's bytes, read-only", "[io][mapped]") {
  test::ScratchDir dir("mapped-weights");
  const std::string path = dir / "ckpt.h5";
  io::save_checkpoint(path, small_checkpoint());
  const io::Checkpoint read = io::load_checkpoint(path, false);
  const io::Checkpoint mapped = io::map_checkpoint(path, kNoStreaming);
  for (const char* name : {"blocks.0.moe.experts.w1", "blocks.0.attn.q.weight"}) {
    INFO(name);
    const io::NamedTensor &m = named(mapped, name), &r = named(read, name);
    REQUIRE(m.mapped);
    REQUIRE(m.is_deferred());  // mapped when read
    const Tensor t = m.whole();
    REQUIRE((t.shape() == r.tensor.shape() && t.dtype() == r.tensor.dtype()));
    REQUIRE(std::memcmp(t.raw(), r.tensor.raw(), r.tensor.nbytes()) == 0);
  }
  // Not mapped: load_checkpoint's tensors, never flagged (read, not a mapping).
  for (const io::NamedTensor& nt : read.params) REQUIRE(!nt.mapped);

  // A write through a mapping faults (PROT_READ), in a child so the test goes on.
  const Tensor expert = named(mapped, "blocks.0.moe.experts.w1").whole();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // not the MPI runtime's handler, which prints a backtrace
    static_cast<float*>(const_cast<void*>(expert.raw()))[4096 * 2] = 1.0f;
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  // (AddressSanitizer may keep its own handler, report the fault and exit non-zero instead.)
  INFO("status " << status);
  REQUIRE((WIFSIGNALED(status) ? WTERMSIG(status) == SIGSEGV
                               : test::kAddressSanitizer && WEXITSTATUS(status) != 0));
  // ... and the file still holds what was written.
  const Tensor again = io::read_expert(path, "blocks.0.moe.experts.w1", 2);
  REQUIRE(std::memcmp(again.raw(),
                      static_cast<const float*>(read.params[0].tensor.raw()) + 2 * 4096,
                      again.nbytes()) == 0);
}

TEST_CASE("io: Fletcher32 is HDF5's, fed whole or in pieces", "[io][mapped]") {
  std::vector<unsigned char> bytes(5 * io::Fletcher32::kFletcherPiece + 333);  // odd length
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  io::Fletcher32 whole, pieces;
  whole.add(bytes.data(), bytes.size());
  const size_t cut = 2 * io::Fletcher32::kFletcherPiece;
  pieces.add(bytes.data(), cut);
  pieces.add(bytes.data() + cut, bytes.size() - cut);
  REQUIRE(whole.value() == pieces.value());
  // Worked by hand: the words 0x0102 and 0x0304, then the odd byte 0x05 as 0x0500:
  // sum1 = 0x0102 + 0x0304 + 0x0500 = 0x0906; sum2 = 0x0102 + 0x0406 + 0x0906 = 0x0E0E.
  const unsigned char five[] = {1, 2, 3, 4, 5};
  io::Fletcher32 small;
  small.add(five, sizeof five);
  REQUIRE(small.value() == 0x0E0E0906u);
}

TEST_CASE("io: a damaged mapped chunk is found when verifying, and only then", "[io][mapped]") {
  test::ScratchDir dir("mapped-weights-damaged");
  const std::string path = dir / "ckpt.h5";
  io::save_checkpoint(path, small_checkpoint());
  auto map_all = [&](bool verify) {
    io::Checkpoint c = io::map_checkpoint(path, kNoStreaming, {verify});
    for (io::NamedTensor& nt : c.params) (void)nt.whole();
    return c;
  };
  REQUIRE_NOTHROW(map_all(true));  // the sums HDF5 wrote agree
  // One byte in the middle of the expert tensor's bytes (the largest tensor of the file).
  const Tensor expert = io::read_expert(path, "blocks.0.moe.experts.w1", 1);
  std::string file = test::read_file(path);
  const std::string needle(static_cast<const char*>(expert.raw()), 64);
  const size_t at = file.find(needle);
  REQUIRE(at != std::string::npos);
  file[at + 100] = static_cast<char>(file[at + 100] ^ 0x40);
  test::write_file(path, file);
  const io::Checkpoint unchecked = map_all(false);
  REQUIRE(named(unchecked, "blocks.0.moe.experts.w1").mapped);
  const std::string error = test::error_of([&] { map_all(true); });
  REQUIRE_THAT(error, Catch::Contains("'" + path + "'") &&
                          Catch::Contains("/params/blocks.0.moe.experts.w1 (expert 1)") &&
                          Catch::Contains("the file is damaged: checksum mismatch"));
}

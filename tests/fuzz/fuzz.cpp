// Scratch files for fuzz targets whose readers take a path (see fuzz.h).
#include "fuzz.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace moe::fuzz {

namespace {

struct Scratch {
  std::string dir;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/moe-fuzz-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (!::mkdtemp(buffer.data())) {
      std::perror("moe fuzz: mkdtemp");
      std::abort();  // a harness failure, not a finding: nothing can run without it
    }
    dir = buffer.data();
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static Scratch scratch;  // destroyed at exit, which removes the directory
  return scratch.dir;
}

std::string write_scratch(const std::string& name, const std::string& bytes) {
  std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::perror(("moe fuzz: writing " + path).c_str());
    std::abort();
  }
  return path;
}

}  // namespace moe::fuzz

#include "common/omp_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace moe::tools {
namespace {

bool starts_with(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// From the executable's .preinit_array: before the constructors of every shared library (the
// OpenMP runtime reads its variables in its constructor) and before the C library has set up
// getenv, so the environment is read from `envp` and the program is executed again with the
// variable added. Nothing but the exec is done here; if it fails, the process runs on as it was.
void default_spin_count(int, char** argv, char** envp) {
  if (argv == nullptr || envp == nullptr) return;
  std::vector<char*> env;
  for (char** e = envp; *e != nullptr; ++e) {
    if (starts_with(*e, "OMP_WAIT_POLICY=") || starts_with(*e, "GOMP_SPINCOUNT=")) return;
    env.push_back(*e);
  }
  static char spin[] = "GOMP_SPINCOUNT=1000";  // the tools' spin count (omp_wait.h)
  env.push_back(spin);
  env.push_back(nullptr);
  ::execve("/proc/self/exe", argv, env.data());
}

}  // namespace

std::string omp_wait_text() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* count = std::getenv("GOMP_SPINCOUNT");
  std::string text;
  if (policy) text = std::string("OMP_WAIT_POLICY=") + policy;
  if (count) text += (text.empty() ? "" : ", ") + std::string("GOMP_SPINCOUNT=") + count;
  return text.empty() ? "the OpenMP runtime's default" : text;
}

}  // namespace moe::tools

// Only an executable has a .preinit_array; every tool links this file through cli.cpp's use of
// omp_wait_text().
__attribute__((section(".preinit_array"), used)) static void (*const moe_preinit_spin)(
    int, char**, char**) = moe::tools::default_spin_count;

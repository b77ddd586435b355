// moe::Error: the library never aborts or exits; it throws, naming the tensor, shape, file or rank.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace moe {

// Concatenate anything streamable into one string (g++ 12 has no <format>).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// A runtime failure: bad file, numerical trouble, I/O. Tools exit 1.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller asked for something inconsistent (flags, shapes of a config). Tools exit 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace moe

// MOE_CHECK(cond, "what", value, ...): throws moe::Error("what value ... [file:line]") when cond is
// false.
#define MOE_CHECK(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond)) throw ::moe::Error(::moe::str(__VA_ARGS__, " [", __FILE__, ":", __LINE__, "]")); \
  } while (0)

#define MOE_USAGE_CHECK(cond, ...)                                 \
  do {                                                             \
    if (!(cond)) throw ::moe::UsageError(::moe::str(__VA_ARGS__)); \
  } while (0)

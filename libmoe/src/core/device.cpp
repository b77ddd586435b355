#include "moe/device.h"

#include "moe/cuda.h"
#include "moe/error.h"

namespace moe {

std::string Device::str() const {
  return kind == cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return {cpu, 0};
  if (text == "cuda") return {cuda, 0};
  if (text.rfind("cuda:", 0) == 0) {
    try {
      return {cuda, std::stoi(text.substr(5))};
    } catch (const std::exception&) {
    }
  }
  throw UsageError(moe::str("unknown device '", text, "' (expected cpu, cuda or cuda:N)"));
}

bool backend_available(Device::Kind kind) { return kind == Device::cpu || cuda::available(); }

}  // namespace moe

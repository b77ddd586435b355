#pragma once

namespace moe {
const char* version();       // "0.1.0"
const char* git_revision();  // `git describe` of the source tree at build time, or "unknown"
}  // namespace moe

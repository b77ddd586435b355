#include "moe/version.h"

#include "moe_git_rev.h"

namespace moe {
const char* version() { return MOE_VERSION; }
const char* git_revision() { return MOE_GIT_REVISION; }
}  // namespace moe

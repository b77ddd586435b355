// Ranks of one MPI job that must work on the same thing: moe-train's ranks train one model, and
// moe-infer score --ep's ranks each hold a share of one model's experts. Ranks started with other
// flags or files would train or score something meaningless (or wait for each other forever in a
// collective), so they are refused at start, every rank with the same message.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "moe/comm/communicator.h"

namespace moe::tools {

// Collective over `world`: every rank passes the settings that shape its result (flags as parsed,
// fingerprints of its inputs). The key lists are compared first (so that every rank then makes
// the same number of checks), then one check per key, so that the error names the setting:
// "<tool> setting 'batch' differs between ranks: rank 1 disagrees with rank 0 at byte 0 (rank 0:
// '2', rank 1: '4'; ...)". Every rank throws the same moe::Error; nothing happens on one rank.
void check_ranks_agree(comm::Communicator& world, const std::string& tool,
                       const nlohmann::json& settings);

}  // namespace moe::tools

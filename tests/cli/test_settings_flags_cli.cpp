// The library's settings table (moe/settings.h) names real flags: every flag a library message
// tells the user to change is one that some tool's --help lists, spelt as the tool spells it.
#include <catch2/catch.hpp>
#include <cctype>
#include <string>
#include <vector>

#include "moe/settings.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

// The names listed under the SUBCOMMANDS heading of a CLI11 help text (empty when it has none).
std::vector<std::string> subcommands_of(const std::string& help) {
  std::vector<std::string> names;
  bool in_list = false;
  for (const std::string& line : test::lines_of(help)) {
    if (line.rfind("SUBCOMMANDS", 0) == 0 || line.rfind("Subcommands", 0) == 0) {
      in_list = true;
      continue;
    }
    if (!in_list) continue;
    if (line.empty() || line[0] != ' ') break;
    const size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos) break;
    names.push_back(line.substr(first, line.find(' ', first) - first));
  }
  return names;
}

// The help of every tool and of each of its subcommands, one text.
std::string all_help() {
  std::string text;
  for (const char* name :
       {"moe-train", "moe-distill", "moe-infer", "moe-convert", "moe-profile", "moe-plan"}) {
    const test::RunResult top = run_command(tool(name, "--help"));
    INFO(name << ": " << top.err);
    REQUIRE(top.exit_code == 0);
    text += top.out;
    for (const std::string& sub : subcommands_of(top.out)) {
      const test::RunResult r = run_command(tool(name, sub + " --help"));
      INFO(name << " " << sub << ": " << r.err);
      REQUIRE(r.exit_code == 0);
      text += r.out;
    }
  }
  return text;
}

// `flag` occurs in `text` as a whole flag ("--to" is not found in "--top-k").
bool lists_flag(const std::string& text, const std::string& flag) {
  for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    const bool whole =
        end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) ||
                                text[end] == '-' || text[end] == '_');
    if (whole) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("cli: every flag of the settings table is a flag of a tool", "[cli][settings]") {
  const std::string help = all_help();
  // The tools with subcommands list them (a parser that found none would check too little).
  REQUIRE(subcommands_of(run_command(tool("moe-convert", "--help")).out).size() >= 5);
  REQUIRE(!lists_flag(help, "--no-such-setting"));
#define MOE_CHECK_LISTED(name, flag)                               \
  if (!lists_flag(help, flag_for(Setting::name)))                  \
    FAIL_CHECK("Setting::" #name " -> " << flag_for(Setting::name) \
                                        << ": no tool's --help lists it");
  MOE_SETTINGS(MOE_CHECK_LISTED)
#undef MOE_CHECK_LISTED
}

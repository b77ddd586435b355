// A flag whose value is one of a setting's names (--offload host, --kd-schedule step): any other
// name is refused while parsing (exit 2), and the name is parsed here, once, into the config's
// enum class; --help shows the default's name.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

namespace moe::tools {

template <class Enum, class Parse, class Name>
CLI::Option* add_named(CLI::App& g, const std::string& flag, Enum& field, const std::string& help,
                       std::vector<std::string> names, Parse parse, Name name) {
  return g
      .add_option_function<std::string>(
          flag, [&field, parse](const std::string& text) { field = parse(text); }, help)
      ->check(CLI::IsMember(std::move(names)))
      ->default_str(name(field));
}

}  // namespace moe::tools

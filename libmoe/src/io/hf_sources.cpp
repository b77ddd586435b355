// The tensors of a Hugging Face checkpoint directory (io/hf_sources.h).
#include "io/hf_sources.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/json_text.h"
#include "io/files.h"
#include "io/hf_names.h"
#include "moe/error.h"
#include "moe/io/input.h"

namespace moe::io::hf {

using nlohmann::json;

json read_json_file(const std::string& path) {
  check_input_file(path, "JSON file");  // a directory, device or FIFO: refused by name
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str("'", path, "': cannot open: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  try {
    json j = json::parse(text.str());
    if (!j.is_object()) throw Error(str("'", path, "': not a JSON object"));
    return j;
  } catch (const json::exception& e) {
    throw Error(str("'", path, "': ", json_error_words(e)));
  }
}

Sources open_sources(const std::string& dir) {
  Sources s;
  const std::string index_path = join_path(dir, kIndexFile);
  const std::string single_path = join_path(dir, kSingleFile);
  std::map<std::string, std::string> weight_map;  // tensor -> file, when sharded
  if (path_exists(index_path)) {
    json index = read_json_file(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(str("'", index_path, "': no \"weight_map\" object"));
    std::set<std::string> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw Error(
            str("'", index_path, "': weight_map entry of '", it.key(), "' is not a file name"));
      const std::string file = it.value().get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        throw Error(str("'", index_path, "': weight_map names the file '", file, "' for '",
                        it.key(), "' (expected a file name in the same directory)"));
      weight_map[it.key()] = file;
      shards.insert(file);
    }
    for (const std::string& file : shards) {
      const std::string path = join_path(dir, file);
      if (!path_exists(path))
        throw Error(str("'", index_path, "' names the shard '", file,
                        "', which is missing: no file '", path, "'"));
      s.files.push_back(std::make_unique<SafetensorsReader>(path));
    }
  } else if (path_exists(single_path)) {
    s.files.push_back(std::make_unique<SafetensorsReader>(single_path));
  } else {
    throw Error(str("'", dir, "': no ", kSingleFile, " or ", kIndexFile,
                    " (a Hugging Face checkpoint directory holds config.json and safetensors)"));
  }
  for (const auto& file : s.files) {
    for (const SafetensorsEntry& e : file->tensors()) {
      auto [it, inserted] = s.tensors.emplace(e.name, std::make_pair(file.get(), &e));
      if (!inserted)
        throw Error(str("tensor '", e.name, "' is in both '", it->second.first->path(), "' and '",
                        file->path(), "'"));
      if (!weight_map.empty()) {
        auto w = weight_map.find(e.name);
        if (w == weight_map.end())
          throw Error(str("'", file->path(), "' holds tensor '", e.name, "', which '", index_path,
                          "' does not list"));
        if (join_path(dir, w->second) != file->path())
          throw Error(str("'", index_path, "' places tensor '", e.name, "' in '", w->second,
                          "', but it is in '", file->path(), "'"));
      }
    }
    for (const auto& [k, v] : file->metadata()) s.metadata.emplace(k, v);
  }
  for (const auto& [name, file] : weight_map)
    if (!s.tensors.count(name))
      throw Error(str("'", index_path, "' lists tensor '", name, "' in '", file,
                      "', which does not hold it"));
  return s;
}

}  // namespace moe::io::hf

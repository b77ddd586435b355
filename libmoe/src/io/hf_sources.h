// The tensors of a Hugging Face checkpoint directory (model.safetensors, or the shards its
// model.safetensors.index.json lists, each checked against the index), for import-hf. Private to
// libmoe (hf_checkpoint.cpp).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moe/io/safetensors.h"
#include "moe/tensor.h"

namespace moe::io::hf {

// A JSON object file (config.json, the index), refused in words if it is anything else.
nlohmann::json read_json_file(const std::string& path);

// Every tensor of the checkpoint, in whichever file holds it.
struct Sources {
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors;
  std::map<std::string, std::string> metadata;  // merged over the files

  const SafetensorsEntry& entry(const std::string& name) const { return *tensors.at(name).second; }
  const std::string& file_of(const std::string& name) const {
    return tensors.at(name).first->path();
  }
  Tensor read(const std::string& name) const { return tensors.at(name).first->read(name); }
  Tensor read_rows(const std::string& name, int64_t begin, int64_t end) const {
    return tensors.at(name).first->read_rows(name, begin, end);
  }
  Tensor read_elements(const std::string& name, int64_t first, const Shape& shape) const {
    return tensors.at(name).first->read_elements(name, first, shape);
  }
};

// Opens every safetensors file of `dir`; refuses a missing shard, a tensor in two files, and an
// index that disagrees with the files.
Sources open_sources(const std::string& dir);

}  // namespace moe::io::hf

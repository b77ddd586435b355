// JSON held in HDF5 string attributes (a checkpoint's model_config and train_config, a trace's
// model_config), read and checked where the file is known: every fault names the file, the
// attribute and, for a value of the wrong type, its key ("checkpoint 'x.h5': attribute
// 'model_config': \"layers\" must be an integer, got null").
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "moe/io/hdf5.h"

namespace moe::io {

// "<kind> '<path>': attribute '<name>'", what the messages below start with.
std::string attribute_place(const std::string& kind, const std::string& path,
                            const std::string& name);

// The JSON text of attribute `name`; invalid JSON is refused as "<place>: invalid JSON at ...".
nlohmann::json read_json_attr(hid_t object, const char* name, const std::string& place,
                              const h5::Where& where);

// The types of a model config's values, checked against the writer's own output for a default
// config (core/json_text.h, json_type_mismatch): a value the model reader could not convert is
// refused as "<place>: \"layers\" must be an integer, got null". Keys may be missing, and the
// whole config may be null (files of tests and of other tools hold part of a config, or none):
// the model reader names those when it needs them.
void check_model_config(const nlohmann::json& config, const std::string& place);

}  // namespace moe::io

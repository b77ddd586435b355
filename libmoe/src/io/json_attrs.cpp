// JSON attributes of checkpoints and traces, checked where the file is known (see
// io/json_attrs.h).
#include "io/json_attrs.h"

#include "core/json_text.h"
#include "moe/models/config.h"

namespace moe::io {

std::string attribute_place(const std::string& kind, const std::string& path,
                            const std::string& name) {
  return str(kind, " '", path, "': attribute '", name, "'");
}

nlohmann::json read_json_attr(hid_t object, const char* name, const std::string& place,
                              const h5::Where& where) {
  return parse_json(h5::read_string_attr(object, name, where), place);
}

void check_model_config(const nlohmann::json& config, const std::string& place) {
  if (config.is_null()) return;  // no config at all: the model reader says so, if one is needed
  // Each list with one entry, so that its elements are compared too.
  ModelConfig shape;
  shape.experts_per_layer = {shape.experts};
  const std::string wrong = json_type_mismatch(config, to_json(shape));
  if (!wrong.empty()) throw Error(str(place, ": ", wrong));
}

}  // namespace moe::io

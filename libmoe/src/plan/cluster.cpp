// The cluster spec reader (moe/plan/cluster.h): strict, because a planner fed a wrong number
// answers confidently and wrongly. Every key is known, every quantity has its unit, and every
// message names the file, the line and the key as the user wrote them.
#include "moe/plan/cluster.h"

#include <toml++/toml.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "moe/error.h"
#include "moe/io/input.h"
#include "plan/check.h"

namespace moe::plan {

namespace {

using UnitTable = std::vector<std::pair<std::string, double>>;

const UnitTable kByteUnits = {{"B", 1},           {"KB", 1e3},           {"MB", 1e6},
                              {"GB", 1e9},        {"TB", 1e12},          {"KiB", 1024.0},
                              {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};

// "<number><unit>" or "<number> <unit>" with a unit of `units`; `kind` names them in errors.
double parse_quantity(std::string_view text, const std::string& key, const UnitTable& units,
                      const std::string& kind) {
  const std::string s(text);
  const char* begin = s.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  std::string list;
  for (const auto& [name, scale] : units) list += (list.empty() ? "" : ", ") + name;
  PLAN_CHECK(end != begin, key, ": '", s, "' is not a number with a unit of ", kind, " (", list,
             ")");
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  PLAN_CHECK(!unit.empty(), key, ": '", s, "' has no unit: write it with one of ", list);
  PLAN_CHECK(std::isfinite(value), key, ": '", s, "' is not a finite number");
  PLAN_CHECK(value >= 0, key, ": '", s, "' is negative");
  for (const auto& [name, scale] : units)
    if (unit == name) return value * scale;
  throw Error(str(key, ": unit '", unit, "' of '", s, "' is not one of ", kind, " (", list, ")"));
}

}  // namespace

double parse_bytes(std::string_view text, const std::string& key) {
  return parse_quantity(text, key, kByteUnits, "bytes");
}

double parse_bandwidth(std::string_view text, const std::string& key) {
  UnitTable units;
  for (const auto& [name, scale] : kByteUnits) units.push_back({name + "/s", scale});
  units.push_back({"Gbit/s", 1e9 / 8});
  return parse_quantity(text, key, units, "bandwidth");
}

double parse_seconds(std::string_view text, const std::string& key) {
  return parse_quantity(text, key, {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}}, "time");
}

double parse_flops(std::string_view text, const std::string& key) {
  return parse_quantity(text, key,
                        {{"FLOP/s", 1}, {"GFLOP/s", 1e9}, {"TFLOP/s", 1e12}, {"PFLOP/s", 1e15}},
                        "compute");
}

double parse_param_rate(std::string_view text, const std::string& key) {
  return parse_quantity(text, key,
                        {{"param/s", 1}, {"Kparam/s", 1e3}, {"Mparam/s", 1e6}, {"Gparam/s", 1e9}},
                        "optimizer rate");
}

double ClusterSpec::gemm_rate(DType dtype) const {
  const double rate = dtype == DType::bf16 ? gemm_bf16 : dtype == DType::f16 ? gemm_f16 : gemm_f32;
  PLAN_CHECK(rate > 0, "cluster '", name, "': [compute] ", dtype_name(dtype),
             " is not given, and the model computes in ", dtype_name(dtype));
  return rate;
}

namespace {

// One table's keys: each a parser writing its field; missing required keys are reported.
struct Field {
  std::function<void(const toml::node&, const std::string&)> read;
  bool required = true;
  bool positive = false;  // zero refused too (the value divides)
};

std::string at(const std::string& source, const toml::node& node) {
  return str(source, ":", node.source().begin.line);
}

std::string string_value(const toml::node& node, const std::string& where, const std::string& key,
                         const std::string& example) {
  PLAN_CHECK(node.is_string(), where, ": ", key,
             ": must be a quoted quantity with its unit, e.g. \"", example, "\"",
             node.is_number() ? " (a bare number has no unit)" : "");
  return node.as_string()->get();
}

void read_table(const toml::table& table, const std::string& name, const std::string& source,
                std::map<std::string, Field>& fields) {
  std::set<std::string> seen;
  for (auto&& [k, node] : table) {
    const std::string key(k.str());
    const std::string label = name.empty() ? key : str("[", name, "] ", key);
    auto f = fields.find(key);
    if (f == fields.end()) {
      std::string known;
      for (const auto& [n, field] : fields) known += (known.empty() ? "" : ", ") + n;
      throw Error(str(at(source, node), ": ", name.empty() ? "" : str("[", name, "] "),
                      "unknown key '", key, "' (", name.empty() ? "top level" : "[" + name + "]",
                      " has ", known, ")"));
    }
    f->second.read(node, label);
    seen.insert(key);
  }
  for (const auto& [key, field] : fields)
    PLAN_CHECK(!field.required || seen.count(key), source, ": ",
               name.empty() ? "" : str("[", name, "] "), "missing key '", key, "'");
}

Field quantity(double& out, double (*parse)(std::string_view, const std::string&),
               const std::string& source, const std::string& example, bool positive,
               bool required = true) {
  Field f;
  f.required = required;
  f.read = [&out, parse, source, example, positive](const toml::node& node,
                                                    const std::string& label) {
    const std::string where = at(source, node);
    out = parse(string_value(node, where, label, example), where + ": " + label);
    PLAN_CHECK(!positive || out > 0, where, ": ", label, ": must be more than zero");
  };
  return f;
}

Field count(int64_t& out, const std::string& source) {
  Field f;
  f.read = [&out, source](const toml::node& node, const std::string& label) {
    PLAN_CHECK(node.is_integer() && node.as_integer()->get() >= 1, at(source, node), ": ", label,
               ": must be an integer >= 1");
    out = node.as_integer()->get();
  };
  return f;
}

const toml::table& subtable(const toml::table& root, const std::string& name,
                            const std::string& source) {
  const toml::node* node = root.get(name);
  PLAN_CHECK(node, source, ": missing table [", name, "]");
  PLAN_CHECK(node->is_table(), at(source, *node), ": '", name, "' must be a table [", name, "]");
  return *node->as_table();
}

}  // namespace

ClusterSpec parse_cluster(std::string_view text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(str(source, ":", e.source().begin.line, ":", e.source().begin.column,
                    ": not valid TOML: ", e.description()));
  }
  ClusterSpec c;
  c.name = std::filesystem::path(source).stem().string();
  std::map<std::string, Field> top;
  top["name"] = {[&](const toml::node& n, const std::string& label) {
                   PLAN_CHECK(n.is_string(), at(source, n), ": ", label, ": must be a string");
                   c.name = n.as_string()->get();
                 },
                 false};
  top["device_kind"] = {[&](const toml::node& n, const std::string& label) {
    const bool ok =
        n.is_string() && (n.as_string()->get() == "cuda" || n.as_string()->get() == "cpu");
    PLAN_CHECK(ok, at(source, n), ": ", label, ": must be \"cuda\" or \"cpu\"");
    c.device_is_host = n.as_string()->get() == "cpu";
  }};
  top["nodes"] = count(c.nodes, source);
  top["devices_per_node"] = count(c.devices_per_node, source);
  const Field skip{[](const toml::node&, const std::string&) {}};
  for (const char* t : {"memory", "bandwidth", "latency", "compute"}) top[t] = skip;
  top["overhead"] = {skip.read, false};
  read_table(root, "", source, top);

  std::map<std::string, Field> memory{
      {"device", quantity(c.device_bytes, parse_bytes, source, "80GiB", true)},
      {"host", quantity(c.host_bytes, parse_bytes, source, "2TiB", true)},
      {"ssd", quantity(c.ssd_bytes, parse_bytes, source, "30TB", false)}};
  read_table(subtable(root, "memory", source), "memory", source, memory);

  std::map<std::string, Field> bandwidth{
      {"intra_node", quantity(c.intra_node_bw, parse_bandwidth, source, "450GB/s", true)},
      {"inter_node", quantity(c.inter_node_bw, parse_bandwidth, source, "400Gbit/s", true)},
      {"host_device", quantity(c.host_device_bw, parse_bandwidth, source, "64GB/s", true)},
      {"ssd", quantity(c.ssd_bw, parse_bandwidth, source, "7GB/s", true)},
      {"memcpy", quantity(c.memcpy_bw, parse_bandwidth, source, "20GB/s", true)},
      {"device_memory", quantity(c.device_memory_bw, parse_bandwidth, source, "3.35TB/s", true)}};
  read_table(subtable(root, "bandwidth", source), "bandwidth", source, bandwidth);

  std::map<std::string, Field> latency{
      {"intra_node", quantity(c.intra_node_latency, parse_seconds, source, "2us", false)},
      {"inter_node", quantity(c.inter_node_latency, parse_seconds, source, "5us", false)}};
  read_table(subtable(root, "latency", source), "latency", source, latency);

  std::map<std::string, Field> compute{
      {"f32", quantity(c.gemm_f32, parse_flops, source, "67TFLOP/s", true)},
      {"bf16", quantity(c.gemm_bf16, parse_flops, source, "989TFLOP/s", true, false)},
      {"f16", quantity(c.gemm_f16, parse_flops, source, "989TFLOP/s", true, false)},
      {"cpu_adamw", quantity(c.cpu_adamw, parse_param_rate, source, "1Gparam/s", true)}};
  read_table(subtable(root, "compute", source), "compute", source, compute);

  // [overhead] is optional (specs written before it still read); inside it every key is needed.
  if (root.get("overhead")) {
    c.has_overhead = true;
    std::map<std::string, Field> overhead{
        {"per_step", quantity(c.overhead_per_step, parse_seconds, source, "0.2ms", false)},
        {"per_layer", quantity(c.overhead_per_layer, parse_seconds, source, "0.1ms", false)},
        {"elementwise", quantity(c.elementwise_bw, parse_bandwidth, source, "5GB/s", false)}};
    read_table(subtable(root, "overhead", source), "overhead", source, overhead);
  }
  return c;
}

ClusterSpec read_cluster_file(const std::string& path) {
  io::check_input_file(path, "cluster spec");
  std::ifstream in(path, std::ios::binary);
  PLAN_CHECK(in.good(), path, ": cannot open the cluster spec");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_cluster(text.str(), path);
}

}  // namespace moe::plan

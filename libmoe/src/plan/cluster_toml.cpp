// The cluster spec writer (moe/plan/calibrate.h): the reader's format (plan/cluster.cpp), each
// quantity in the largest unit it reaches so that people can read it ("21.3GB/s", not
// "21300000000B/s"), with 15 significant digits so that the reader gets the same double back.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "io/files.h"
#include "moe/plan/calibrate.h"

namespace moe::plan {

namespace {

using Units = std::vector<std::pair<const char*, double>>;  // largest first

const Units kBytes = {
    {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}};
const Units kBandwidth = {{"TB/s", 1e12}, {"GB/s", 1e9}, {"MB/s", 1e6}, {"KB/s", 1e3}};
const Units kSeconds = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}};
const Units kFlops = {{"PFLOP/s", 1e15}, {"TFLOP/s", 1e12}, {"GFLOP/s", 1e9}};
const Units kParamRate = {{"Gparam/s", 1e9}, {"Mparam/s", 1e6}, {"Kparam/s", 1e3}};

std::string number(double value, const char* unit) {
  char text[64];
  std::snprintf(text, sizeof text, "%.15g%s", value, unit);
  return text;
}

// The value in the largest unit of `units` it reaches, else in `base` (worth base_scale). A value
// that needs more than 6 digits there (MemTotal: "23.5402793884277GiB") goes to the largest
// smaller unit in which it is a whole number ("24683500KiB"), when there is one.
std::string quantity(double value, const Units& units, const char* base, double base_scale = 1) {
  size_t first = units.size();
  for (size_t i = 0; i < units.size(); ++i)
    if (value >= units[i].second) {
      first = i;
      break;
    }
  if (first == units.size()) return number(value / base_scale, base);
  const std::string plain = number(value / units[first].second, units[first].first);
  if (std::string(plain).find_first_not_of("0123456789.") < 8) return plain;  // short enough
  for (size_t i = first + 1; i < units.size(); ++i) {
    const double v = value / units[i].second;
    if (v == std::floor(v)) return number(v, units[i].first);
  }
  const double v = value / base_scale;
  return v == std::floor(v) ? number(v, base) : plain;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;  // no control characters in a name
    out += c;
  }
  return out + "\"";
}

class Writer {
 public:
  Writer(std::ostream& out, const SpecNotes& notes) : out_(out), notes_(notes) {}

  void comments(const std::string& key) {
    auto it = notes_.notes.find(key);
    if (it == notes_.notes.end()) return;
    for (const std::string& line : it->second) out_ << "# " << line << "\n";
  }
  // `key = value`, the first note on the same line, further notes below it.
  void value(const std::string& table, const std::string& key, const std::string& text) {
    const std::string full = table.empty() ? key : table + "." + key;
    std::string line = key + " = " + text;
    auto it = notes_.notes.find(full);
    if (it == notes_.notes.end() || it->second.empty()) {
      out_ << line << "\n";
      return;
    }
    if (line.size() < 32) line.resize(32, ' ');
    out_ << line << " # " << it->second.front() << "\n";
    for (size_t i = 1; i < it->second.size(); ++i) out_ << "#   " << it->second[i] << "\n";
  }
  void table(const std::string& name) {
    out_ << "\n[" << name << "]\n";
    comments(name);
  }

 private:
  std::ostream& out_;
  const SpecNotes& notes_;
};

}  // namespace

void write_cluster_toml(const ClusterSpec& c, std::ostream& out, const SpecNotes& notes) {
  for (const std::string& line : notes.header) out << "# " << line << "\n";
  Writer w(out, notes);
  w.value("", "name", quoted(c.name));
  w.value("", "device_kind", c.device_is_host ? "\"cpu\"" : "\"cuda\"");
  w.value("", "nodes", std::to_string(c.nodes));
  w.value("", "devices_per_node", std::to_string(c.devices_per_node));
  auto q = [](double v, const Units& u, const char* base, double base_scale = 1) {
    return quoted(quantity(v, u, base, base_scale));
  };

  w.table("memory");
  w.value("memory", "device", q(c.device_bytes, kBytes, "B"));
  w.value("memory", "host", q(c.host_bytes, kBytes, "B"));
  w.value("memory", "ssd", q(c.ssd_bytes, kBytes, "B"));

  w.table("bandwidth");
  w.value("bandwidth", "intra_node", q(c.intra_node_bw, kBandwidth, "B/s"));
  w.value("bandwidth", "inter_node", q(c.inter_node_bw, kBandwidth, "B/s"));
  w.value("bandwidth", "host_device", q(c.host_device_bw, kBandwidth, "B/s"));
  w.value("bandwidth", "ssd", q(c.ssd_bw, kBandwidth, "B/s"));
  w.value("bandwidth", "memcpy", q(c.memcpy_bw, kBandwidth, "B/s"));
  w.value("bandwidth", "device_memory", q(c.device_memory_bw, kBandwidth, "B/s"));

  w.table("latency");  // 0 is allowed: no latency counted
  w.value("latency", "intra_node", q(c.intra_node_latency, kSeconds, "ns", 1e-9));
  w.value("latency", "inter_node", q(c.inter_node_latency, kSeconds, "ns", 1e-9));

  w.table("compute");
  w.value("compute", "f32", q(c.gemm_f32, kFlops, "FLOP/s"));
  if (c.gemm_bf16 > 0) w.value("compute", "bf16", q(c.gemm_bf16, kFlops, "FLOP/s"));
  if (c.gemm_f16 > 0) w.value("compute", "f16", q(c.gemm_f16, kFlops, "FLOP/s"));
  w.value("compute", "cpu_adamw", q(c.cpu_adamw, kParamRate, "param/s"));

  if (!c.has_overhead) return;
  w.table("overhead");  // 0 is allowed: no such cost counted
  w.value("overhead", "per_step", q(c.overhead_per_step, kSeconds, "ns", 1e-9));
  w.value("overhead", "per_layer", q(c.overhead_per_layer, kSeconds, "ns", 1e-9));
  w.value("overhead", "elementwise", q(c.elementwise_bw, kBandwidth, "B/s"));
}

void write_cluster_file(const std::string& path, const ClusterSpec& spec, const SpecNotes& notes) {
  std::ostringstream text;
  write_cluster_toml(spec, text, notes);
  io::write_text_atomic(path, text.str());
}

}  // namespace moe::plan

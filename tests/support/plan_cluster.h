// A cluster spec for moe-plan's tests, written as TOML with every key the reader requires: each
// test sets the numbers its hand-worked case needs and keeps the rest.
#pragma once
#include <string>

namespace moe::test {

struct ClusterText {
  std::string name;  // "" writes no name
  int nodes = 1, devices_per_node = 4;
  std::string device = "1GiB", host = "64GiB", ssd = "1TB";  // [memory]
  std::string intra_node = "100GB/s", inter_node = "10GB/s", host_device = "20GB/s",
              ssd_bandwidth = "2GB/s", memcpy = "10GB/s", device_memory = "1TB/s";  // [bandwidth]
  std::string intra_latency = "5us", inter_latency = "10us";                        // [latency]
  std::string f32 = "10TFLOP/s", cpu_adamw = "1Gparam/s";                            // [compute]

  std::string toml() const {
    std::string t;
    if (!name.empty()) t += "name = \"" + name + "\"\n";
    t += "device_kind = \"cuda\"\nnodes = " + std::to_string(nodes) +
         "\ndevices_per_node = " + std::to_string(devices_per_node) + "\n";
    t += "[memory]\ndevice = \"" + device + "\"\nhost = \"" + host + "\"\nssd = \"" + ssd + "\"\n";
    t += "[bandwidth]\nintra_node = \"" + intra_node + "\"\ninter_node = \"" + inter_node +
         "\"\nhost_device = \"" + host_device + "\"\nssd = \"" + ssd_bandwidth +
         "\"\nmemcpy = \"" + memcpy + "\"\ndevice_memory = \"" + device_memory + "\"\n";
    t += "[latency]\nintra_node = \"" + intra_latency + "\"\ninter_node = \"" + inter_latency +
         "\"\n";
    t += "[compute]\nf32 = \"" + f32 + "\"\ncpu_adamw = \"" + cpu_adamw + "\"\n";
    return t;
  }
};

}  // namespace moe::test

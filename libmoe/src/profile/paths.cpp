// Lina's path estimator: the table, its file, its accuracy (see moe/profile/paths.h).
// Shape letters: L MoE layers, k experts per token, E experts of a layer, n tokens.
#include "moe/profile/paths.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_text.h"
#include "io/files.h"
#include "moe/error.h"
#include "moe/io/input.h"
#include "moe/settings.h"
#include "profile/trace_blocks.h"

namespace moe::profile {

using detail::for_each_block;
using detail::ranked;

PathTable build_paths(const io::TraceReader& trace, int64_t path_length) {
  MOE_USAGE_CHECK(path_length >= 1, flag_for(Setting::path_length), " must be >= 1 (got ",
                  path_length, ")");
  const io::TraceInfo& info = trace.info();
  const int64_t L = trace.layers(), k = info.top_k;
  PathTable t;
  t.path_length = path_length;
  t.top_k = k;
  t.experts = info.experts;
  t.next.resize(static_cast<size_t>(std::max<int64_t>(0, L - 1)));
  for (int64_t l = 0; l < L; ++l) t.marginal.emplace_back(static_cast<size_t>(info.experts[l]), 0);
  std::vector<int32_t> path;
  for_each_block(trace, [&](int64_t n, const std::vector<int32_t>& ex) {
    for (int64_t tok = 0; tok < n; ++tok) {
      const int32_t* row = ex.data() + tok * L * k;  // [L, k]
      for (int64_t l = 0; l < L; ++l)
        for (int64_t j = 0; j < k; ++j) ++t.marginal[static_cast<size_t>(l)][row[l * k + j]];
      for (int64_t i = 0; i + 1 < L; ++i) {
        path.clear();
        for (int64_t p = std::max<int64_t>(0, i - path_length + 1); p <= i; ++p)
          path.push_back(row[p * k]);
        auto& dist = t.next[static_cast<size_t>(i)][path];
        if (dist.empty()) dist.assign(static_cast<size_t>(info.experts[i + 1]), 0);
        for (int64_t j = 0; j < k; ++j) ++dist[static_cast<size_t>(row[(i + 1) * k + j])];
      }
    }
  });
  return t;
}

void save_paths(const PathTable& t, const std::string& path) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < t.next.size(); ++i) {
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& [key, counts] : t.next[i])
      paths.push_back({{"path", key}, {"counts", counts}});
    layers.push_back({{"predicts", i + 1}, {"paths", paths}});
  }
  nlohmann::json j{{"format", "moe.paths"}, {"format_version", 1},  {"path_length", t.path_length},
                   {"top_k", t.top_k},      {"experts", t.experts}, {"marginal", t.marginal},
                   {"layers", layers}};
  io::write_text_atomic(path, j.dump() + "\n");
}

// Checks everything build_paths guarantees, so that a table edited by hand or damaged is refused
// (naming the file and the place) instead of predicting from garbage.
PathTable load_paths(const std::string& path) {
  io::check_input_file(path, "path table");  // a directory, device or FIFO: refused by name
  std::ifstream in(path);
  if (!in) throw Error(str("path table '", path, "': cannot open: ", std::strerror(errno)));
  const std::string who = str("path table '", path, "'");
  PathTable t;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || j.value("format", std::string()) != "moe.paths")
      throw Error(str(who, ": not a moe.paths file (made by moe-profile paths)"));
    // Every number is read as what the writer wrote: an integer (nlohmann would convert 1e300 to
    // an int64 with undefined behaviour, and truncate 0.5).
    auto integer = [&](const nlohmann::json& v, const std::string& what) {
      if (!v.is_number_integer() ||
          (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
        throw Error(str(who, ": ", what, " is ", v.dump(), ", not an integer"));
      return v.get<int64_t>();
    };
    auto integers = [&](const nlohmann::json& v, const std::string& what) {
      if (!v.is_array()) throw Error(str(who, ": ", what, " is not an array"));
      std::vector<int64_t> out;
      for (size_t i = 0; i < v.size(); ++i) out.push_back(integer(v[i], str(what, "[", i, "]")));
      return out;
    };
    if (integer(j.at("format_version"), "format_version") != 1)
      throw Error(str(who, ": format version ", j.at("format_version").dump(),
                      ", this build reads version 1"));
    t.path_length = integer(j.at("path_length"), "path_length");
    t.top_k = integer(j.at("top_k"), "top_k");
    if (t.path_length < 1) throw Error(str(who, ": path_length ", t.path_length, " is not >= 1"));
    if (t.top_k < 1) throw Error(str(who, ": top_k ", t.top_k, " is not >= 1"));
    t.experts = integers(j.at("experts"), "experts");
    for (size_t l = 0; l < t.experts.size(); ++l)
      if (t.experts[l] < t.top_k)
        throw Error(
            str(who, ": layer ", l, " has ", t.experts[l], " experts, fewer than top_k ", t.top_k));
    const nlohmann::json& marginal = j.at("marginal");
    if (!marginal.is_array()) throw Error(str(who, ": marginal is not an array"));
    for (size_t l = 0; l < marginal.size(); ++l)
      t.marginal.push_back(integers(marginal[l], str("marginal[", l, "]")));
    const size_t L = t.experts.size();
    const nlohmann::json& layers = j.at("layers");
    if (!layers.is_array() || t.marginal.size() != L || layers.size() != (L ? L - 1 : 0))
      throw Error(str(who, ": ", t.marginal.size(), " marginals and ", layers.size(),
                      " layers for ", L, " MoE layers (expected ", L, " and ", L ? L - 1 : 0, ")"));
    // Counts are numbers of assignments: never negative.
    auto check_counts = [&](const std::vector<int64_t>& counts, const std::string& what) {
      for (size_t e = 0; e < counts.size(); ++e)
        if (counts[e] < 0)
          throw Error(str(who, ": ", what, " count of expert ", e, " is ", counts[e]));
    };
    for (size_t l = 0; l < L; ++l) {
      if (int64_t(t.marginal[l].size()) != t.experts[l])
        throw Error(str(who, ": marginal of layer ", l, " has ", t.marginal[l].size(),
                        " entries for ", t.experts[l], " experts"));
      check_counts(t.marginal[l], str("layer ", l, "'s marginal"));
    }
    t.next.resize(L ? L - 1 : 0);
    for (size_t i = 0; i + 1 < L; ++i) {
      const nlohmann::json& layer = layers[i];
      const std::string at = str("layers[", i, "]");
      if (!layer.is_object() || !layer.contains("predicts"))
        throw Error(
            str(who, ": ", at, " has no 'predicts' (the MoE layer it predicts, ", i + 1, ")"));
      if (integer(layer.at("predicts"), at + ".predicts") != int64_t(i + 1))
        throw Error(
            str(who, ": ", at, ".predicts is ", layer.at("predicts").dump(), ", expected ", i + 1));
      // The path of layer i + 1 holds the first choices at layers max(0, i - l + 1) .. i.
      const int64_t first = std::max<int64_t>(0, int64_t(i) - t.path_length + 1);
      const size_t length = i + 1 - static_cast<size_t>(first);
      for (const auto& p : layer.at("paths")) {
        auto key = integers(p.at("path"), at + ".path");
        if (key.size() != length)
          throw Error(str(who, ": a path of ", at, " has ", key.size(), " experts, expected ",
                          length, " (layers ", first, "..", i, " with path_length ", t.path_length,
                          ")"));
        std::vector<int32_t> ids;
        for (size_t q = 0; q < key.size(); ++q) {
          const int64_t layer_of = first + int64_t(q), E = t.experts[size_t(layer_of)];
          if (key[q] < 0 || key[q] >= E)
            throw Error(str(who, ": a path of ", at, " names expert ", key[q], " at layer ",
                            layer_of, ", outside [0, ", E, ")"));
          ids.push_back(static_cast<int32_t>(key[q]));
        }
        auto counts = integers(p.at("counts"), at + ".counts");
        if (int64_t(counts.size()) != t.experts[i + 1])
          throw Error(str(who, ": a path of layer ", i + 1, " has ", counts.size(), " counts for ",
                          t.experts[i + 1], " experts"));
        check_counts(counts, str("a path of ", at));
        if (!t.next[i].emplace(std::move(ids), std::move(counts)).second)
          throw Error(str(who, ": ", at, " lists the path ", p.at("path").dump(), " twice"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(who, ": not a moe.paths table (the JSON 'moe-profile paths' writes): ",
                    json_error_words(e)));
  }
  return t;
}

std::vector<LayerAccuracy> accuracy(const PathTable& t, const io::TraceReader& trace) {
  const io::TraceInfo& info = trace.info();
  const int64_t L = trace.layers(), k = info.top_k;
  MOE_CHECK(t.experts == info.experts && t.top_k == k, "the path table was built for ",
            t.experts.size(), " MoE layers of ", t.experts.empty() ? 0 : t.experts[0],
            "... experts, top-", t.top_k, "; the trace has ", L, " layers, top-", k,
            " (another model?)");
  std::vector<LayerAccuracy> out;
  for (int64_t i = 0; i + 1 < L; ++i) out.push_back({.layer = i + 1});
  // The estimated top-2k set of a count vector (cached for the marginals).
  auto top_set = [&](const std::vector<int64_t>& counts) {
    std::vector<int64_t> r = ranked(counts);
    r.resize(std::min<size_t>(r.size(), static_cast<size_t>(2 * k)));
    std::vector<char> in(counts.size(), 0);
    for (int64_t e : r) in[static_cast<size_t>(e)] = 1;
    return in;
  };
  std::vector<std::vector<char>> marginal_sets;
  for (const auto& m : t.marginal) marginal_sets.push_back(top_set(m));
  std::map<std::pair<int64_t, std::vector<int32_t>>, std::vector<char>> cache;
  std::vector<int32_t> path;
  for_each_block(trace, [&](int64_t n, const std::vector<int32_t>& ex) {
    for (int64_t tok = 0; tok < n; ++tok) {
      const int32_t* row = ex.data() + tok * L * k;
      for (int64_t i = 0; i + 1 < L; ++i) {
        LayerAccuracy& a = out[static_cast<size_t>(i)];
        path.clear();
        for (int64_t p = std::max<int64_t>(0, i - t.path_length + 1); p <= i; ++p)
          path.push_back(row[p * k]);
        const std::vector<char>* set = &marginal_sets[static_cast<size_t>(i + 1)];
        auto found = t.next[static_cast<size_t>(i)].find(path);
        if (found == t.next[static_cast<size_t>(i)].end()) {
          ++a.unseen_paths;
        } else {
          auto key = std::make_pair(i, path);
          auto it = cache.find(key);
          if (it == cache.end()) it = cache.emplace(key, top_set(found->second)).first;
          set = &it->second;
        }
        bool hit = true, marginal_hit = true;
        for (int64_t j = 0; j < k; ++j) {
          const auto e = static_cast<size_t>(row[(i + 1) * k + j]);
          hit &= (*set)[e] != 0;
          marginal_hit &= marginal_sets[static_cast<size_t>(i + 1)][e] != 0;
        }
        ++a.tokens;
        a.hits += hit;
        a.marginal_hits += marginal_hit;
      }
    }
  });
  return out;
}

}  // namespace moe::profile

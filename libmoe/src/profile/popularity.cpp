// Popularity summaries, Lina's path estimator and the SVG plot (see moe/profile/popularity.h).
// Shape letters: L MoE layers, k experts per token, E experts of a layer, B batches, n tokens.
#include "moe/profile/popularity.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/files.h"
#include "moe/error.h"

namespace moe::profile {

namespace {

constexpr int64_t kBlockTokens = 65536;  // tokens read per block when streaming a trace

// Experts by count descending, ties by lower id.
std::vector<int64_t> ranked(const std::vector<int64_t>& counts) {
  std::vector<int64_t> order(counts.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)];
  });
  return order;
}

// Calls fn(n, experts) for consecutive blocks of the trace's tokens (experts [n, L, k]).
template <typename Fn>
void for_each_block(const io::TraceReader& trace, Fn fn) {
  std::vector<int32_t> experts;
  for (int64_t begin = 0; begin < trace.tokens(); begin += kBlockTokens) {
    const int64_t end = std::min(trace.tokens(), begin + kBlockTokens);
    trace.read_tokens(begin, end, experts);
    fn(end - begin, experts);
  }
}

}  // namespace

io::TraceInfo trace_info(const ModelConfig& config, io::Provenance provenance,
                         const std::string& source) {
  io::TraceInfo info;
  info.model_config = moe::to_json(config);
  info.provenance = std::move(provenance);
  info.top_k = config.residual_moe ? 1 : config.top_k;
  for (int64_t b = 0; b < config.layers; ++b) {
    if (!config.is_moe_layer(b)) continue;
    info.moe_blocks.push_back(b);
    info.experts.push_back(config.experts_per_layer.at(static_cast<size_t>(b)));
  }
  info.source = source;
  return info;
}

io::TraceBatch trace_batch(const io::TraceInfo& info, const ForwardStats& stats, const Tensor& ids,
                           int64_t step) {
  const auto L = static_cast<int64_t>(info.moe_blocks.size());
  const int64_t k = info.top_k, n = ids.numel();
  int64_t Emax = 0;
  for (int64_t e : info.experts) Emax = std::max(Emax, e);
  MOE_CHECK(static_cast<int64_t>(stats.moe.size()) == L, "trace: the forward pass has ",
            stats.moe.size(), " MoE layers, the trace ", L);
  io::TraceBatch b;
  b.step = step;
  const int32_t* id = ids.data<int32_t>();
  b.token_ids.assign(id, id + n);
  b.experts.resize(static_cast<size_t>(n * L * k));
  b.gates.resize(static_cast<size_t>(n * L * k));
  b.loads.assign(static_cast<size_t>(L * Emax), 0);
  for (int64_t l = 0; l < L; ++l) {
    const nn::MoEStats& m = stats.moe[static_cast<size_t>(l)];
    MOE_CHECK(static_cast<int64_t>(m.choices.size()) == n * k, "trace: layer ", l, " captured ",
              m.choices.size(), " choices for ", n, " tokens x ", k,
              " (run the forward pass with routing capture)");
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) {
        b.experts[static_cast<size_t>((t * L + l) * k + j)] =
            m.choices[static_cast<size_t>(t * k + j)];
        b.gates[static_cast<size_t>((t * L + l) * k + j)] = m.gates[static_cast<size_t>(t * k + j)];
      }
    for (size_t e = 0; e < m.load.size(); ++e)
      b.loads[static_cast<size_t>(l * Emax) + e] = m.load[e];
    b.dropped.push_back(m.dropped);
  }
  return b;
}

std::vector<LayerSummary> summarize(const io::TraceReader& trace) {
  const io::TraceInfo& info = trace.info();
  const int64_t L = trace.layers(), B = trace.batches(), Emax = trace.max_experts();
  const std::vector<int64_t> loads = trace.loads(), dropped = trace.dropped();
  int64_t tokens = 0;
  for (int64_t t : trace.batch_tokens()) tokens += t;
  std::vector<LayerSummary> out(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    LayerSummary& s = out[static_cast<size_t>(l)];
    s.layer = l;
    s.block = info.moe_blocks.at(static_cast<size_t>(l));
    s.experts = info.experts.at(static_cast<size_t>(l));
    s.tokens = tokens;
    s.assignments = tokens * info.top_k;
    s.counts.assign(static_cast<size_t>(s.experts), 0);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t e = 0; e < s.experts; ++e)
        s.counts[static_cast<size_t>(e)] += loads[static_cast<size_t>((b * L + l) * Emax + e)];
      s.dropped += dropped[static_cast<size_t>(b * L + l)];
    }
    const double E = static_cast<double>(s.experts);
    double sum = 0, mx = 0, mn = std::numeric_limits<double>::infinity();
    for (int64_t c : s.counts) {
      sum += double(c);
      mx = std::max(mx, double(c));
      mn = std::min(mn, double(c));
    }
    const double mean = sum / E;
    double var = 0, entropy = 0;
    for (int64_t c : s.counts) {
      var += (double(c) - mean) * (double(c) - mean) / E;
      if (c > 0) entropy -= double(c) / sum * std::log2(double(c) / sum);
    }
    s.max_over_mean = mean > 0 ? mx / mean : 0;
    s.max_over_min = sum == 0 ? 0 : mn > 0 ? mx / mn : std::numeric_limits<double>::infinity();
    s.cv = mean > 0 ? std::sqrt(var) / mean : 0;
    s.entropy_bits = sum > 0 ? entropy : 0;
    s.entropy_norm = s.experts > 1 && sum > 0 ? entropy / std::log2(E) : 0;
    s.dropped_fraction = s.assignments ? double(s.dropped) / double(s.assignments) : 0;
    s.top = ranked(s.counts);
  }
  return out;
}

nlohmann::json to_json(const LayerSummary& s) {
  auto finite = [](double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  return {{"layer", s.layer},
          {"block", s.block},
          {"experts", s.experts},
          {"tokens", s.tokens},
          {"assignments", s.assignments},
          {"counts", s.counts},
          {"max_over_mean", s.max_over_mean},
          {"max_over_min", finite(s.max_over_min)},
          {"cv", s.cv},
          {"entropy_bits", s.entropy_bits},
          {"entropy_norm", s.entropy_norm},
          {"top_experts", s.top},
          {"dropped", s.dropped},
          {"dropped_fraction", s.dropped_fraction}};
}

// ---- Lina's path estimator ---------------------------------------------------------------------

PathTable build_paths(const io::TraceReader& trace, int64_t path_length) {
  MOE_USAGE_CHECK(path_length >= 1, "--path-length must be >= 1 (got ", path_length, ")");
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
  std::ifstream in(path);
  if (!in) throw Error(str("path table '", path, "': cannot open"));
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
    throw Error(
        str(who, ": not a moe.paths table (the JSON 'moe-profile paths' writes): ", e.what()));
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

// ---- SVG -------------------------------------------------------------------------------------

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

// White -> dark blue for v in [0, 1].
std::string blue(double v) {
  v = std::clamp(v, 0.0, 1.0);
  auto ch = [&](double lo) { return static_cast<int>(std::lround(255.0 - (255.0 - lo) * v)); };
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", ch(8), ch(48), ch(107));
  return buf;
}

}  // namespace

std::string plot_svg(const io::TraceReader& trace, const std::string& title) {
  const std::vector<LayerSummary> layers = summarize(trace);
  const int64_t L = trace.layers(), B = trace.batches(), Emax = trace.max_experts();
  const double cell = std::clamp(720.0 / double(std::max<int64_t>(1, Emax)), 8.0, 40.0);
  const double left = 90, top = 60, heat_w = cell * double(Emax), heat_h = 24.0 * double(L);
  const double chart_top = top + heat_h + 90, chart_h = 220, chart_w = std::max(heat_w, 480.0);
  const double width = left + std::max(heat_w + 150, chart_w + 40),
               height = chart_top + chart_h + 70;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << left << "\" y=\"24\" font-size=\"16\">" << escape(title) << "</text>\n";
  o << "<text x=\"" << left << "\" y=\"44\">Share of each MoE layer's assignments per expert ("
    << trace.tokens() << " tokens, top-" << trace.info().top_k << "; darker = more)</text>\n";
  double max_share = 0;
  for (const LayerSummary& s : layers)
    for (int64_t c : s.counts)
      if (s.assignments) max_share = std::max(max_share, double(c) / double(s.assignments));
  for (const LayerSummary& s : layers) {
    const double y = top + 24.0 * double(s.layer);
    o << "<text x=\"" << left - 8 << "\" y=\"" << y + 16 << "\" text-anchor=\"end\">block "
      << s.block << "</text>\n";
    for (int64_t e = 0; e < s.experts; ++e) {
      const double share =
          s.assignments ? double(s.counts[static_cast<size_t>(e)]) / double(s.assignments) : 0;
      o << "<rect x=\"" << left + cell * double(e) << "\" y=\"" << y << "\" width=\"" << cell
        << "\" height=\"24\" fill=\"" << blue(max_share > 0 ? share / max_share : 0)
        << "\" stroke=\"#dddddd\"><title>block " << s.block << ", expert " << e << ": "
        << s.counts[static_cast<size_t>(e)] << " (" << fmt("%.1f", 100 * share)
        << "%)</title></rect>\n";
    }
    o << "<text x=\"" << left + heat_w + 8 << "\" y=\"" << y + 16 << "\">max/mean "
      << fmt("%.2f", s.max_over_mean) << "</text>\n";
  }
  for (int64_t e = 0; e < Emax; e += std::max<int64_t>(1, Emax / 16))
    o << "<text x=\"" << left + cell * (double(e) + 0.5) << "\" y=\"" << top + heat_h + 16
      << "\" text-anchor=\"middle\">" << e << "</text>\n";
  o << "<text x=\"" << left + heat_w / 2 << "\" y=\"" << top + heat_h + 34
    << "\" text-anchor=\"middle\">expert</text>\n";

  // Load imbalance over time: max/mean of each layer's loads per batch.
  o << "<text x=\"" << left << "\" y=\"" << chart_top - 16
    << "\">Load imbalance over the trace: max/mean of each layer's expert loads per batch</text>\n";
  const std::vector<int64_t> loads = trace.loads();
  std::vector<std::vector<double>> ratio(static_cast<size_t>(L));
  double ymax = 1;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t E = layers[static_cast<size_t>(l)].experts;
    for (int64_t b = 0; b < B; ++b) {
      double sum = 0, mx = 0;
      for (int64_t e = 0; e < E; ++e) {
        const double v = double(loads[static_cast<size_t>((b * L + l) * Emax + e)]);
        sum += v;
        mx = std::max(mx, v);
      }
      ratio[static_cast<size_t>(l)].push_back(sum > 0 ? mx / (sum / double(E)) : 1);
      ymax = std::max(ymax, ratio[static_cast<size_t>(l)].back());
    }
  }
  ymax = std::ceil(ymax * 2) / 2;
  auto px = [&](int64_t b) { return left + (B > 1 ? chart_w * double(b) / double(B - 1) : 0.0); };
  auto py = [&](double v) {
    return chart_top + chart_h - chart_h * (v - 1) / std::max(ymax - 1, 1e-9);
  };
  o << "<rect x=\"" << left << "\" y=\"" << chart_top << "\" width=\"" << chart_w << "\" height=\""
    << chart_h << "\" fill=\"none\" stroke=\"#888888\"/>\n";
  for (double v : {1.0, (1 + ymax) / 2, ymax})
    o << "<text x=\"" << left - 6 << "\" y=\"" << py(v) + 4 << "\" text-anchor=\"end\">"
      << fmt("%.2f", v) << "</text>\n";
  o << "<text x=\"" << left + chart_w / 2 << "\" y=\"" << chart_top + chart_h + 20
    << "\" text-anchor=\"middle\">batch (1.." << B << ")</text>\n";
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  for (int64_t l = 0; l < L; ++l) {
    const char* color = colors[l % 10];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (int64_t b = 0; b < B; ++b)
      o << fmt("%.1f", px(b)) << ','
        << fmt("%.1f", py(ratio[static_cast<size_t>(l)][static_cast<size_t>(b)])) << ' ';
    o << "\"/>\n";
    o << "<text x=\"" << left + chart_w + 8 << "\" y=\"" << chart_top + 14 + 16 * double(l)
      << "\" fill=\"" << color << "\">block " << layers[static_cast<size_t>(l)].block
      << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace moe::profile

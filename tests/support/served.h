// A model whose experts an offload::ServingCache serves, as moe-infer builds it: the cache is the
// view's expert store, and the model is loaded through that view (the cache and the view must
// outlive the model, so all three live here). Shared by test_serving_cache.cpp and
// test_serving_prefetch.cpp.
#pragma once
#include <string>

#include "moe/infer/model.h"
#include "moe/offload/serving_cache.h"

namespace moe::test {

struct Served {
  explicit Served(const std::string& path) : cache(path) {
    view.expert_store = &cache;
    m = infer::load_model(path, false, &view);
  }
  offload::ServingCache cache;
  nn::Parallel view;
  infer::LoadedModel m;
};

}  // namespace moe::test

// Column-sharded embedding over a data-parallel group (see moe/nn/sharded_embedding.h).
// Shape letters: n this rank's tokens, N all ranks' tokens, C = dim / W columns per rank.
#include "moe/nn/sharded_embedding.h"

#include <cstring>

#include "moe/ops/dense.h"
#include "moe/settings.h"

namespace moe::nn {

ShardedEmbedding::ShardedEmbedding(ParamSet& ps, const std::string& name, int64_t rows, int64_t dim,
                                   float init_std, comm::Communicator& group)
    : group_(&group), rows_(rows), dim_(dim) {
  const int W = group.size();
  MOE_USAGE_CHECK(rows > 0 && dim > 0, "embedding ", name, ": rows ", rows, " and dim ", dim,
                  " must be positive");
  MOE_USAGE_CHECK(dim % W == 0, flag_for(Setting::shard_embedding), ": embedding ", name, " dim ",
                  dim, " does not divide over the W = ", W,
                  " ranks of the data-parallel group: run on a number of ranks that divides it, "
                  "or without (",
                  flag_for(Setting::shard_embedding),
                  "=false when a resumed checkpoint carries it)");
  columns_ = dim / W;
  start_ = group.rank() * columns_;
  table_ = &ps.add_shard(name, ParamShard{{rows, dim}, /*dim=*/1, start_, columns_},
                         Init::normal(init_std), /*decay=*/false);
}

Tensor ShardedEmbedding::forward(const Tensor& ids, Saved* saved) const {
  ids.expect_dtype(DType::i32, "sharded embedding ids");
  const int W = group_->size();
  const int64_t n = ids.numel(), C = columns_;

  // Every rank's token count, then every rank's ids (rank-major).
  Tensor count = Tensor::empty({1}, DType::i64);
  count.data<int64_t>()[0] = n;
  Tensor counts_t = Tensor::empty({W}, DType::i64);
  group_->all_gather(count, counts_t);
  std::vector<int64_t> counts(counts_t.data<int64_t>(), counts_t.data<int64_t>() + W);
  int64_t N = 0;
  for (int64_t c : counts) N += c;
  Tensor all_ids = Tensor::empty({N}, DType::i32).set_name(table_->name + ".ids");
  group_->all_gatherv(ids.reshape({n}), all_ids, counts);

  // Every rank sees the same ids here, so every rank throws the same error.
  const int32_t* id = all_ids.data<int32_t>();
  for (int r = 0; r < W; id += counts[r], ++r)
    for (int64_t i = 0; i < counts[r]; ++i)
      MOE_CHECK(id[i] >= 0 && id[i] < rows_, "sharded embedding: id ", id[i], " (token ", i,
                " of rank ", r, ") is out of range for table ", table_->name, "[", rows_, ",", dim_,
                "]");

  // Our columns for every rank's tokens; rank r's block of rows goes back to rank r.
  Tensor mine = Tensor::empty({N, C});
  ops::embedding_forward(table_->w(), all_ids, mine);
  Tensor parts = Tensor::empty({W * n, C});  // block s: columns of rank s for our tokens
  group_->all_to_all_v(mine, counts, parts, std::vector<int64_t>(W, n));

  Tensor out = Tensor::empty({n, dim_});
  const float* p = parts.data<float>();
  float* o = out.data<float>();
  for (int s = 0; s < W; ++s)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(o + i * dim_ + s * C, p + (s * n + i) * C, sizeof(float) * C);
  if (saved) *saved = {all_ids, std::move(counts)};
  return out;
}

void ShardedEmbedding::backward(const Tensor& dy, const Saved& saved) {
  const int W = group_->size();
  const int64_t n = saved.counts.at(group_->rank()), C = columns_;
  dy.expect_shape({n, dim_}, "sharded embedding dy");
  dy.expect_dtype(DType::f32, "sharded embedding dy");

  // Block s of `parts` holds the columns rank s owns, for our tokens.
  Tensor parts = Tensor::empty({W * n, C});
  const float* g = dy.data<float>();
  float* p = parts.data<float>();
  for (int s = 0; s < W; ++s)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(p + (s * n + i) * C, g + i * dim_ + s * C, sizeof(float) * C);
  Tensor mine = Tensor::empty({saved.ids.numel(), C});  // our columns, global token order
  group_->all_to_all_v(parts, std::vector<int64_t>(W, n), mine, saved.counts);
  ops::embedding_backward(mine, saved.ids, table_->grad);
}

}  // namespace moe::nn

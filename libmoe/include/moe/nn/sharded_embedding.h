// Embedding partition in data parallelism (MoESys §IV-C): the W ranks of a data-parallel group
// each hold a column slice [rows, dim/W] of the logical table [rows, dim] instead of a replica,
// so the table's values, gradients and optimizer state cost 1/W per rank and its gradient needs
// no all-reduce. Shape letters: n this rank's tokens, N = sum of n over the group, C = dim/W.
//
// forward (collective):
//   all_gather    the group's token counts                  (W x i64 per rank)
//   all_gatherv   the group's ids, rank-major, [N] i32      (every rank needs every id: N ids)
//   lookup        this rank's C columns for all N tokens -> [N, C]
//   all_to_all_v  rows of rank r's tokens go to rank r;  this rank gets [W*n, C] (block s =
//                 columns of rank s), assembled into [n, dim]
// backward (collective):
//   all_to_all_v  dy [n, dim] cut into W column blocks: block s goes to rank s; this rank gets
//                 [N, C] in global token order (rank 0's tokens, then rank 1's, ...)
//   scatter-add   into the local gradient shard [rows, C], rows summed in global token order
//
// Volume per rank and step (f32; the own block of each all_to_all_v is a local copy): the ids
// exchange receives 4N bytes; forward sends 4*N*C and receives 4*n*dim bytes, backward the
// reverse. With balanced ranks (N = W*n) a rank sends 4*n*dim*(W-1)/W bytes in forward and as
// much in backward, against 2*4*rows*dim*(W-1)/W sent by a ring all-reduce of a replicated
// table's gradient: less whenever a rank's tokens are fewer than the table's rows, besides the
// 1/W memory.
#pragma once
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/param.h"

namespace moe::nn {

class ShardedEmbedding {
 public:
  // This rank holds columns [r*dim/W, (r+1)*dim/W) (r, W = group.rank(), group.size()) in a
  // Param named exactly `name` (a ParamShard of [rows, dim] along dimension 1, no weight decay):
  // its values are those columns of nn::Embedding(ps', name, rows, dim, init_std) built in a
  // ParamSet with the same seed. dim % W != 0 throws moe::UsageError naming --shard-embedding.
  // `group` must outlive this object.
  ShardedEmbedding(ParamSet& ps, const std::string& name, int64_t rows, int64_t dim, float init_std,
                   comm::Communicator& group);

  struct Saved {
    Tensor ids;                   // [N] i32: every rank's ids, rank-major
    std::vector<int64_t> counts;  // [W]: tokens of each rank
  };
  // Collective over the group. ids: this rank's token ids (i32, any shape, n = numel, may differ
  // between ranks, 0 included) -> [n, dim], bitwise equal to nn::Embedding::forward on the full
  // table. An id out of range on any rank throws moe::Error naming the id, its rank and the table,
  // on every rank (checked after the ids exchange, so no rank is left in a collective).
  Tensor forward(const Tensor& ids, Saved* saved) const;
  // Collective. dy [n, dim] for this rank's tokens; table().grad (the local shard [rows, dim/W])
  // += the sum over every rank's tokens of their dy columns, in global token order (no atomics,
  // no all-reduce; scaling by 1/W, like the averaged dense gradients, is the trainer's job).
  void backward(const Tensor& dy, const Saved& saved);

  Param& table() const { return *table_; }
  int64_t rows() const { return rows_; }
  int64_t dim() const { return dim_; }
  int64_t column_start() const { return start_; }
  int64_t columns() const { return columns_; }

 private:
  Param* table_;
  comm::Communicator* group_;
  int64_t rows_, dim_, start_, columns_;
};

}  // namespace moe::nn

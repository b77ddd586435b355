// How a model is laid out over ranks, as the layers see it: data parallelism (each rank its share
// of the global batch), expert parallelism (each rank of an EP group holds E/P experts of every
// MoE layer), and the sharded token embedding (MoESys). A view of pointers: parallel::Layout owns
// the communicators and builds this with of(); tests may fill it by hand. A null pointer
// everywhere is the single-process model.
//
// Shape letters: W data-parallel ranks (the world), P expert-parallel ranks (P divides W and E),
// E experts of a layer, N tokens of one rank, M its kept assignments, D model width.
#pragma once
#include <cstdint>

#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/comm/scheduler.h"
#include "moe/nn/expert_store.h"
#include "moe/nn/placement.h"
#include "moe/parallel/layout.h"

namespace moe::nn {

using ExchangeStats = parallel::ExchangeStats;

struct Parallel {
  // The ranks whose tokens make up one global batch. The routers sum their expert loads over it
  // (one all-reduce of E + 1 integers per MoE layer and step), so the aux loss sees the whole
  // batch's f_e, as one process would. Null or size 1: this process alone.
  comm::Communicator* batch = nullptr;
  // Expert parallelism: rank p of this group holds experts [p E/P, (p+1) E/P) of every MoE layer;
  // tokens travel to their experts and back with all-to-all-v. Null or size 1: all experts here.
  comm::Communicator* experts = nullptr;
  comm::AllToAllV* exchange = nullptr;       // over `experts` (flat or hierarchical); required
  comm::CommScheduler* scheduler = nullptr;  // when set, the token exchanges go through it
  // Shard the token embedding by columns over this group (MoESys §IV-C). Null: replicated.
  comm::Communicator* embedding = nullptr;
  ExchangeStats* stats = nullptr;  // accumulated when set
  // Dynamic placement (moe/nn/placement.h; Lina in inference, FlexMoE and LPT in training): every
  // rank of `experts` holds all E experts of every layer, and the policy decides per layer and
  // batch which ranks compute which expert's rows. Null: the static layout above (E/P experts
  // per rank).
  PlacementPolicy* placement = nullptr;
  // Where the experts' state lives (offloaded training, moe/nn/expert_store.h): every MoE layer
  // registers its experts with this store instead of allocating them. Null: resident Params.
  ExpertStore* expert_store = nullptr;

  // The layers' view of `layout` (no placement policy); it must outlive the view.
  static Parallel of(parallel::Layout& layout) {
    Parallel view;
    view.batch = layout.batch();
    view.experts = layout.experts();
    view.exchange = layout.exchange();
    view.scheduler = layout.scheduler();
    view.embedding = layout.embedding();
    view.stats = layout.exchange_stats();
    return view;
  }

  int ep_size() const { return experts ? experts->size() : 1; }
  int ep_rank() const { return experts ? experts->rank() : 0; }
  bool expert_parallel() const { return ep_size() > 1; }
  bool data_parallel() const { return batch && batch->size() > 1; }
  // Whether each rank holds only its E/P experts (expert parallelism without a placement policy).
  bool shards_experts() const { return expert_parallel() && placement == nullptr; }
};

}  // namespace moe::nn

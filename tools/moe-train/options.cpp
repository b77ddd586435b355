// moe-train's flags, one function per group: each registers the flags of its group and says
// which struct field each fills (TrainOptions' own fields, its ModelConfig, its TrainConfig).
#include "options.h"

#include <algorithm>

#include "common/named_option.h"
#include "moe/error.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/offload/budget.h"
#include "moe/settings.h"

namespace moe::tools {
namespace {

// --device, the data and the tasks (TrainConfig's data fields).
void add_data_options(CLI::Option_group& g, TrainOptions& o) {
  auto* io = &g;
  auto& t = o.train;
  add_device_option(*io, o.device, "where the model trains (several ranks: NCCL between GPUs)");
  o.train_flags.push_back(
      io->add_option("--data", t.data, "Training text (bytes are tokens) or .u16/.u32 token file"));
  o.train_flags.push_back(
      io->add_option("--val", t.val, "Validation data (default: the held-out tail of --data)"));
  o.train_flags.push_back(
      add_named(*io, "--data-format", t.data_format, "auto (by extension), text, u16 or u32",
                {"auto", "text", "u16", "u32"}, io::parse_token_format, io::token_format_name));
  o.train_flags.push_back(
      io->add_option("--val-fraction", t.val_fraction, "Held-out tail of --data when no --val")
          ->capture_default_str());
  o.train_flags.push_back(
      io->add_option("--tasks", t.tasks,
                     "Multi-task training: a TOML file of [[task]] tables (name, data, batch, "
                     "weight) replacing --data and --batch; ranks are given to tasks by workload"));
  o.train_flags.push_back(
      io->add_option("--task-replan-every", t.task_replan_every,
                     "--tasks: reallocate ranks to tasks by their measured time every N steps "
                     "(0: never; the allocation is saved in every checkpoint)")
          ->check(non_negative())
          ->capture_default_str());
  o.train_flags.push_back(
      add_named(*io, "--task-allocation", t.task_allocation,
                "--tasks: ranks per task by workload (tokens per step) or equal (the "
                "baseline: ranks / tasks each)",
                {"workload", "equal"}, train::parse_allocation_rule, train::allocation_rule_name));
}

// Where the run writes and how often (TrainOptions' own fields; --eval-batches is TrainConfig's).
void add_output_options(CLI::Option_group& g, TrainOptions& o) {
  auto* io = &g;
  auto& t = o.train;
  io->add_option("--out", o.out, "Output directory: step-<8 digits>.h5 checkpoints and last.h5")
      ->required();
  io->add_flag("--force", o.force,
               "Write into --out even when it holds the checkpoints of another run (same-numbered "
               "steps are replaced, last.h5 moves to this run), and replace an existing --metrics "
               "or --trace file (a --resume appends to its --metrics without it)");
  io->add_option("--resume", o.resume,
                 "Continue exactly from this checkpoint: a file, the directory of a sharded one, "
                 "or a run's output directory (its newest checkpoint, DIR/last.h5 or DIR/last); "
                 "--metrics then appends");
  io->add_option("--init", o.init,
                 "Start from this checkpoint's weights (and tokenizer) with a fresh optimizer at "
                 "step 0: fine-tune an imported or trained model (its model is kept; the "
                 "training flags are this run's)")
      ->excludes("--resume");
  io->add_option("--checkpoint-every", o.checkpoint_every,
                 "Checkpoint every N steps (0: only at the end)")
      ->check(non_negative())
      ->capture_default_str();
  io->add_flag("--checkpoint-at-start", o.checkpoint_at_start,
               "Also checkpoint before the first step: a resumed run writes the state it "
               "restored, in this run's layout (with --steps at the checkpoint's step it only "
               "re-shards)");
  io->add_option("--eval-every", o.eval_every, "Validation loss every N steps (0: only at the end)")
      ->check(non_negative())
      ->capture_default_str();
  o.train_flags.push_back(
      io->add_option("--eval-batches", t.eval_batches, "Validation batches per evaluation")
          ->check(positive())
          ->capture_default_str());
  io->add_option("--metrics", o.metrics, "JSON lines of metrics to PATH ('-' = stdout)");
  io->add_option("--trace", o.trace,
                 "Record the routing of every --trace-every-th step to this HDF5 trace "
                 "(moe-profile reads it; rank 0's tokens under mpiexec)");
  io->add_option("--trace-every", o.trace_every, "Steps between recorded steps")
      ->check(positive())
      ->capture_default_str();
  io->add_option("--log-every", o.log_every, "Progress/metrics line every N steps")
      ->check(positive())
      ->capture_default_str();
  io->add_flag("--breakdown-sync", o.breakdown_sync,
               "With -v and --device cuda: wait for the GPU at each part of the step breakdown, "
               "so each part holds its own GPU time (slower steps; without it the parts are "
               "host times)");
}

// The model's shape (ModelConfig; --arch is parsed after the flags).
void add_model_shape_options(CLI::Option_group& g, TrainOptions& o) {
  auto* mg = &g;
  auto& m = o.model;
  auto model_opt = [&](CLI::Option* opt) {
    o.model_flags.push_back(opt);
    return opt;
  };
  model_opt(mg->add_option("--arch", o.arch,
                           "gpt (GPT-2/Switch numerics), mixtral (HF Mixtral numerics), or the "
                           "HF families on mixtral's layers: qwen2_moe, qwen3_moe, olmoe, "
                           "glm4_moe, deepseek_v3 (DeepSeek-V2/V3: glm4_moe's MoE layers with "
                           "Multi-head Latent Attention, --kv-lora-rank and the flags beside it), "
                           "gpt_oss (OpenAI gpt-oss: biases, attention sinks, the clamped SwiGLU "
                           "of --swiglu-alpha and --swiglu-limit, a router bias; every layer MoE)")
                ->check(CLI::IsMember({"gpt", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe",
                                       "glm4_moe", "deepseek_v3", "gpt_oss"}))
                ->capture_default_str());
  model_opt(mg->add_option("--vocab", m.vocab_size,
                           "Vocabulary size (256 for text; token files: max id + 1 by default)")
                ->capture_default_str());
  model_opt(mg->add_option("--layers", m.layers, "Transformer blocks")->capture_default_str());
  model_opt(mg->add_option("--d-model", m.d_model, "Model width D")->capture_default_str());
  model_opt(mg->add_option("--heads", m.heads,
                           "Attention heads (must divide --d-model unless --head-dim is given)")
                ->capture_default_str());
  model_opt(
      mg->add_option(
            "--kv-heads", m.kv_heads,
            "Key/value heads for grouped-query attention (mixtral; divides --heads; 0 = --heads)")
          ->capture_default_str());
  model_opt(mg->add_option("--d-ff", m.d_ff, "Hidden width of dense MLPs and of each expert")
                ->capture_default_str());
  model_opt(mg->add_option("--dense-ff", m.dense_ff,
                           "Hidden width of the dense layers' MLPs when it differs from the "
                           "experts' (GLM-4-MoE's intermediate_size; 0 = --d-ff)")
                ->capture_default_str());
  model_opt(mg->add_option("--head-dim", m.head_dim,
                           "Attention head width (0 = d-model/heads; RoPE architectures)")
                ->capture_default_str());
  model_opt(mg->add_option("--rope-dim", m.rope_dim,
                           "Features of each head RoPE rotates, the first ones (partial RoPE, "
                           "even; 0 = all of the head)")
                ->capture_default_str());
  model_opt(mg->add_option("--sliding-window", m.sliding_window,
                           "Sliding-window attention on every layer (--arch gpt_oss: on the even "
                           "layers 0, 2, ..., HF gpt-oss's layer_types): a token sees the last N "
                           "positions, itself included (Mixtral's sliding_window; 0 = none)")
                ->capture_default_str());
  model_opt(mg->add_option(flag_for(Setting::swiglu_alpha), m.swiglu_alpha,
                           "--arch gpt_oss's clamped SwiGLU: the slope of its sigmoid (HF "
                           "swiglu_alpha)")
                ->capture_default_str());
  model_opt(mg->add_option(flag_for(Setting::swiglu_limit), m.swiglu_limit,
                           "--arch gpt_oss's clamped SwiGLU: gate <= limit, |up| <= limit (HF "
                           "swiglu_limit)")
                ->capture_default_str());
  model_opt(mg->add_flag("--tie-embeddings", m.tie_embeddings,
                         "The LM head reads the token embedding (tie_word_embeddings; gpt always "
                         "ties)"));
  model_opt(mg->add_flag("--qkv-bias", m.qkv_bias,
                         "Biases on q, k and v (glm4_moe; qwen2_moe always has them)"));
  model_opt(mg->add_flag("--qk-norm", m.qk_norm,
                         "Per-head RMSNorm of q and k (glm4_moe; qwen3_moe always has it)"));
  model_opt(mg->add_option("--shared-expert-ff", m.shared_expert_ff,
                           "Hidden width of each MoE layer's always-on shared expert (0 = none)")
                ->capture_default_str());
  model_opt(mg->add_option("--seq", m.seq, "Context length T (tokens per sequence)")
                ->capture_default_str());
  model_opt(mg->add_option("--experts", m.experts, "Experts per MoE layer")->capture_default_str());
  model_opt(mg->add_option("--experts-per-layer", m.experts_per_layer,
                           "PR-MoE pyramid: expert counts, one per layer (0 = dense) or one per "
                           "MoE layer; GLM-4-MoE's first dense layers: 0,...,0,E,...,E")
                ->delimiter(','));
  model_opt(mg->add_option("--moe-every", m.moe_every, "Every K-th block is MoE (1 = all)")
                ->capture_default_str());
  model_opt(mg->add_option("--top-k", m.top_k, "Experts per token")->capture_default_str());
}

// The routers and the numerics (ModelConfig; --normalize-topk, --router, --dtype are parsed after
// the flags).
void add_routing_options(CLI::Option_group& g, TrainOptions& o) {
  auto* mg = &g;
  auto& m = o.model;
  auto model_opt = [&](CLI::Option* opt) {
    o.model_flags.push_back(opt);
    return opt;
  };
  model_opt(
      mg->add_option("--capacity-factor", m.capacity_factor,
                     "Expert capacity C = cf*N*k/E; tokens beyond it are dropped (0 = dropless)")
          ->capture_default_str());
  model_opt(
      mg->add_option("--aux-loss-coef", m.aux_loss_coef, "Switch/GShard load-balancing loss weight")
          ->capture_default_str());
  model_opt(mg->add_option("--z-loss-coef", m.z_loss_coef, "Router z-loss weight")
                ->capture_default_str());
  model_opt(mg->add_flag("--residual-moe", m.residual_moe,
                         "PR-MoE residual MoE: dense MLP + one (top-1) expert"));
  model_opt(mg->add_option("--normalize-topk", o.normalize_topk,
                           "Renormalise the top-k gate weights: on, off, auto (the --arch default: "
                           "mixtral, qwen3_moe on)")
                ->check(CLI::IsMember({"auto", "on", "off"}))
                ->capture_default_str());
  model_opt(mg->add_option("--router", o.router,
                           "Router scores: softmax over the experts, or a sigmoid per expert "
                           "(DeepSeek-V3), or auto (the --arch's own: glm4_moe and deepseek_v3 "
                           "sigmoid, the others softmax)")
                ->check(CLI::IsMember({"auto", "softmax", "sigmoid"}))
                ->capture_default_str());
  model_opt(mg->add_option("--router-groups", m.router_groups,
                           "Group-limited top-k (DeepSeek-V3, GLM-4-MoE n_group): the experts in "
                           "this many equal groups, chosen only within --router-group-topk of "
                           "them (1 = off)")
                ->capture_default_str());
  model_opt(mg->add_option("--router-group-topk", m.router_group_topk,
                           "With --router-groups: the groups a token's experts come from, the "
                           "best by their two best scores (topk_group)")
                ->capture_default_str());
  model_opt(mg->add_option("--routed-scale", m.routed_scale,
                           "Every gate weight times this (routed_scaling_factor)")
                ->capture_default_str());
  model_opt(mg->add_option("--balance-bias-rate", m.balance_bias_rate,
                           "Aux-loss-free balancing: after each step, each expert's selection "
                           "bias += rate * sign(mean load - its load) (0 = off)")
                ->capture_default_str());
  model_opt(mg->add_option("--router-center-rate", m.router_center_rate,
                           "Router centring: each router ignores the direction of its input's "
                           "running mean, which moves toward each step's mean input by this rate "
                           "(1 = the last step's mean; 0 = off)")
                ->capture_default_str());
  model_opt(mg->add_option("--router-jitter", m.router_jitter,
                           "Multiplicative router input noise U(1-j, 1+j) in training")
                ->capture_default_str());
  model_opt(
      mg->add_option("--norm-eps", m.norm_eps, "LayerNorm/RMSNorm epsilon")->capture_default_str());
  model_opt(
      mg->add_option("--rope-theta", m.rope_theta, "RoPE base (mixtral)")->capture_default_str());
  model_opt(
      mg->add_option(
            "--dtype", o.dtype,
            "Parameter and activation storage: f32, bf16, f16 (math and optimizer state stay fp32)")
          ->check(CLI::IsMember({"f32", "bf16", "f16"}))
          ->capture_default_str());
}

// Multi-head Latent Attention (ModelConfig's MLA fields; deepseek_v3 only). Left out with --arch
// deepseek_v3, they take small shapes scaled to the width (fill_latent_defaults). The flag names
// are the checkpoint's keys, so a resumed run checks them against its model.
void add_latent_options(CLI::Option_group& g, TrainOptions& o) {
  auto& m = o.model;
  auto model_opt = [&](CLI::Option* opt) { o.model_flags.push_back(opt); };
  const char* left_out =
      " (deepseek_v3 only; left out: a small shape from --d-model D and --heads H, ";
  model_opt(g.add_option("--q-lora-rank", m.q_lora_rank,
                         std::string("Width of the query latent (HF q_lora_rank; 0 = a plain q "
                                     "projection, as DeepSeek-V2-Lite)") +
                             left_out + "D/2)"));
  model_opt(g.add_option("--kv-lora-rank", m.kv_lora_rank,
                         std::string("Width of the compressed key/value latent the decode cache "
                                     "holds (HF kv_lora_rank)") +
                             left_out + "D/4)"));
  model_opt(g.add_option("--qk-nope-dim", m.qk_nope_dim,
                         std::string("Features of each q/k head without RoPE (HF "
                                     "qk_nope_head_dim)") +
                             left_out + "D/H)"));
  model_opt(g.add_option("--qk-rope-dim", m.qk_rope_dim,
                         std::string("Features of each q/k head RoPE rotates, even (HF "
                                     "qk_rope_head_dim)") +
                             left_out + "D/H/2 rounded down to even, at least 2)"));
  model_opt(g.add_option("--v-head-dim", m.v_head_dim,
                         std::string("Width of each value head, at most --qk-nope-dim + "
                                     "--qk-rope-dim (HF v_head_dim)") +
                             left_out + "D/H)"));
}

// RoPE scaling (ModelConfig::rope_type and ::yarn, named as HF's rope_scaling keys). Model flags:
// with --resume or --init each one given must agree with the checkpoint's RoPE (its yarn object's
// key); check_rope_flags checks a new model's.
void add_rope_scaling_options(CLI::Option_group& g, TrainOptions& o) {
  auto& m = o.model;
  auto& y = m.yarn;
  auto rope_opt = [&](CLI::Option* opt) {
    o.rope_flags.push_back(opt);
    o.model_flags.push_back(opt);
  };
  rope_opt(add_named(g, "--rope-scaling", m.rope_type,
                     "RoPE scaling (HF rope_scaling's rope_type): none, or yarn (YaRN: "
                     "DeepSeek-V3, gpt-oss; RoPE architectures; needs "
                     "--original-max-position-embeddings)",
                     {"none", "yarn"}, parse_rope_type, rope_type_name));
  rope_opt(g.add_option("--rope-factor", y.factor,
                        "YaRN: how many times the original context is stretched (HF factor, >= 1)")
               ->capture_default_str());
  rope_opt(g.add_option("--original-max-position-embeddings", y.original_ctx,
                        "YaRN: the context the RoPE was trained for (HF "
                        "original_max_position_embeddings; required with --rope-scaling yarn)"));
  rope_opt(g.add_option("--beta-fast", y.beta_fast,
                        "YaRN: rotations in the original context below which a pair is fully "
                        "interpolated (HF beta_fast, > 0)")
               ->capture_default_str());
  rope_opt(
      g.add_option("--beta-slow", y.beta_slow,
                   "YaRN: rotations above which a pair keeps its frequency (HF beta_slow, > 0)")
          ->capture_default_str());
  rope_opt(g.add_option("--mscale", y.mscale,
                        "YaRN: the cos/sin scale's mscale (HF mscale; 0 = absent, >= 0)")
               ->capture_default_str());
  rope_opt(g.add_option("--mscale-all-dim", y.mscale_all_dim,
                        "YaRN: HF mscale_all_dim (0 = absent, >= 0); deepseek_v3 also scales "
                        "the softmax by yarn_mscale(factor, it)^2")
               ->capture_default_str());
}

// TrainConfig's optimizer fields.
void add_optimizer_options(CLI::Option_group& g, TrainOptions& o) {
  auto* og = &g;
  auto& t = o.train;
  o.train_flags.push_back(
      og->add_option("--batch", t.batch, "Sequences per step")->capture_default_str());
  o.train_flags.push_back(
      og->add_option("--steps", t.steps, "Total optimizer steps (the schedule's length)")
          ->capture_default_str());
  o.train_flags.push_back(
      og->add_option("--lr", t.lr,
                     "Peak learning rate (AdamW); default 3e-3 up to --d-model 128, then "
                     "3e-3 x 128 / d_model")
          ->check(positive()));
  o.train_flags.push_back(
      og->add_option("--min-lr-ratio", t.min_lr_ratio, "Cosine decay floor as a fraction of --lr")
          ->capture_default_str());
  o.train_flags.push_back(
      og->add_option("--warmup", t.warmup, "Linear warmup steps")->capture_default_str());
  o.train_flags.push_back(
      og->add_option("--weight-decay", t.weight_decay, "AdamW decoupled weight decay")
          ->capture_default_str());
  o.train_flags.push_back(
      og->add_option("--clip", t.clip, "Clip the global gradient norm to this (0 = off)")
          ->capture_default_str());
  o.train_flags.push_back(
      og->add_option("--grad-accum", t.grad_accum,
                     "Micro-batches per step: N forward/backward passes over --batch/N sequences "
                     "each, one update (--batch divides by N x the ranks)")
          ->check(positive())
          ->capture_default_str());
  o.train_flags.push_back(add_named(
      *og, "--recompute", t.recompute,
      "Activation recomputation: none; moe (the experts' hidden activations); "
      "block (keep each block's input only). Bitwise the same training",
      {"none", "moe", "block"}, [](const std::string& name) { return nn::parse_recompute(name); },
      nn::recompute_name));
}

// A byte size, checked while parsing (exit 2). A share ("25%") needs a total that training
// does not have, so it is refused rather than read as 0.
CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.find('%') != std::string::npos)
          return "a share (%) has no total here: give bytes such as 512MiB or 1.5GB";
        try {
          offload::parse_bytes("size", text, 0);
        } catch (const std::exception& e) {
          return e.what();
        }
        return {};
      },
      "SIZE");
}

// Expert offload (TrainConfig::offload, the store's settings): none of these changes the numbers a
// run computes, so a resumed run may change any of them (train_flags) and the checkpoint is the
// same whatever they are.
void add_offload_options(CLI::Option_group& g, TrainOptions& o) {
  auto* xg = &g;
  auto& t = o.train.offload;
  const CLI::Validator bytes = byte_size();
  o.train_flags.push_back(
      add_named(*xg, "--offload", t.tier,
                "Where expert weights and AdamW state live: none (resident), host (RAM), "
                "ssd (files under --ssd-dir behind a --host-budget cache), auto (plan by "
                "the budgets)",
                {"none", "host", "ssd", "auto"}, offload::parse_tier, offload::tier_name));
  o.train_flags.push_back(
      xg->add_option("--device-budget", t.device_budget,
                     "Bytes of expert slots that compute reads (e.g. 64MiB; default: the pinned "
                     "experts + the prefetch window + 1)")
          ->check(bytes));
  o.train_flags.push_back(xg->add_option("--host-budget", t.host_budget,
                                         "Bytes of expert state in RAM (host: a limit checked at "
                                         "start; ssd: the cache; default: no limit)")
                              ->check(bytes));
  o.train_flags.push_back(xg->add_option(
      "--ssd-dir", t.ssd_dir, "Directory of the per-expert files of --offload ssd (a cache)"));
  o.train_flags.push_back(
      xg->add_option("--pin-fraction", t.pin_fraction,
                     "Share of experts kept on the device from forward to backward, the most "
                     "loaded of the previous step")
          ->check(CLI::Range(0.0, 1.0))
          ->capture_default_str());
  o.train_flags.push_back(
      xg->add_option("--prefetch-depth", t.prefetch_depth,
                     "Experts uploaded ahead of the one computing (0: on demand)")
          ->check(CLI::Range(int64_t{0}, int64_t{64}))
          ->capture_default_str());
  o.train_flags.push_back(xg->add_flag(
      "--optimizer-overlap,!--no-optimizer-overlap", t.optimizer_overlap,
      "Each expert's AdamW as soon as its gradient is final, during backward (needs --clip 0; "
      "default on; --no-optimizer-overlap: after backward, an ablation)"));
  o.train_flags.push_back(add_named(
      *xg, "--expert-cache", t.expert_cache,
      "Host cache policy of --offload ssd: lru, or lfu (MoESys: hit counts)", {"lru", "lfu"},
      offload::parse_cache_policy, [](offload::CachePolicy p) { return offload::to_string(p); }));
  o.train_flags.push_back(
      xg->add_option("--lfu-threshold", t.lfu.threshold,
                     "lfu: only experts with at least this count may be evicted")
          ->check(non_negative())
          ->capture_default_str());
  o.train_flags.push_back(xg->add_option("--lfu-beta", t.lfu.beta,
                                         "lfu: every count is multiplied by this each --lfu-period")
                              ->check(CLI::Range(0.0, 1.0))
                              ->capture_default_str());
  o.train_flags.push_back(
      xg->add_option("--lfu-period", t.lfu.period, "lfu: steps between decays of the counts")
          ->check(positive())
          ->capture_default_str());
}

// TrainConfig's layout over the ranks.
void add_parallel_options(CLI::Option_group& g, TrainOptions& o) {
  auto* dg = &g;
  auto& t = o.train;
  o.train_flags.push_back(
      dg->add_option("--ep", t.ep,
                     "Expert-parallel ranks: each holds E/N experts of every MoE layer (divides "
                     "the world size and every layer's experts)")
          ->check(positive())
          ->capture_default_str());
  o.train_flags.push_back(dg->add_flag(
      "--shard-embedding", t.shard_embedding,
      "Split the token table by columns over the ranks (MoESys); needs --arch mixtral"));
  o.train_flags.push_back(
      dg->add_option("--zero", t.zero,
                     "ZeRO for the dense parameters over the ranks: 0 off, 1 AdamW state "
                     "sharded, 2 and gradients reduce-scattered, 3 and values sharded (gathered "
                     "around each block's use)")
          ->capture_default_str());
  o.train_flags.push_back(
      dg->add_option("--zero-prefetch", t.zero_prefetch,
                     "--zero 3: all-gather the dense parameters this many blocks ahead of "
                     "compute, on a thread of their own (0: just before each block)")
          ->check(non_negative())
          ->capture_default_str());
  o.train_flags.push_back(
      add_named(*dg, "--a2a", t.a2a,
                "Expert all-to-all: flat, or hierarchical (intra-node, then across nodes)",
                {"flat", "hierarchical"}, comm::parse_a2a_algorithm, comm::a2a_algorithm_name));
  o.train_flags.push_back(
      dg->add_option("--ranks-per-node", t.ranks_per_node,
                     "Virtual nodes of N ranks for --a2a hierarchical (0: the real nodes)")
          ->check(non_negative())
          ->capture_default_str());
  o.train_flags.push_back(
      add_named(*dg, "--comm-scheduler", t.comm_scheduler,
                "off: gradient all-reduce after backward; priority: Lina's micro-ops "
                "overlapping backward, all-to-all first",
                {"off", "priority"}, comm::parse_scheduler_mode, comm::scheduler_mode_name));
}

// TrainConfig's expert placement, then the scheduler's micro-op size (as --help lists them).
void add_placement_options(CLI::Option_group& g, TrainOptions& o) {
  auto* dg = &g;
  auto& t = o.train;
  o.train_flags.push_back(add_named(
      *dg, "--placement", t.placement,
      "Which ranks compute which experts: static (rank p: experts [p E/P, (p+1) "
      "E/P)), lpt (ES-MoE: per batch, Graham's LPT over the group's tokens) or "
      "flexmoe (vExpert replicas, flexible routing, cost-model replans); lpt and "
      "flexmoe need --ep > 1 and hold every expert on every rank",
      {"static", "lpt", "flexmoe"}, train::parse_placement_rule, train::placement_rule_name));
  o.train_flags.push_back(
      dg->add_option("--vexperts-per-rank", t.vexperts_per_rank,
                     "flexmoe: vExpert slots per rank and MoE layer (0: ceil(E/P) + 1)")
          ->check(non_negative())
          ->capture_default_str());
  o.train_flags.push_back(
      dg->add_option("--balance-threshold", t.balance_threshold,
                     "flexmoe: replan while max/mean rank tokens is above this (>= 1)")
          ->check(CLI::Range(1.0, 1e9))
          ->capture_default_str());
  o.train_flags.push_back(
      dg->add_option("--replan-every", t.replan_every, "flexmoe: optimizer steps between replans")
          ->check(positive())
          ->capture_default_str());
  o.train_flags.push_back(
      dg->add_option("--partition-mb", t.partition_mb,
                     "Largest gradient all-reduce micro-op with --comm-scheduler priority (MiB)")
          ->capture_default_str());
}

// The setting a flag sets: the settings table (moe/settings.h) read backwards. The library knows
// the model and training flags given by their settings (train::GivenFlags).
Setting setting_of(const CLI::Option& opt) {
  const std::string flag = opt.get_name();
#define MOE_SETTING_OF(name, text) \
  if (flag == text) return Setting::name;
  MOE_SETTINGS(MOE_SETTING_OF)
#undef MOE_SETTING_OF
  throw Error(str(flag, " is not in the settings table (libmoe/include/moe/settings.h)"));
}

}  // namespace

void add_train_options(CLI::App& app, TrainOptions& o) {
  add_common_options(app, o.common, "moe-train");
  ModelConfig& m = o.model;
  // moe-train's default, not the library's (ModelConfig keeps Switch's 0.01): at the default
  // --lr and --warmup a byte-level model's routing collapses onto 2 of 8 experts within its first
  // steps, and 0.05 spreads it again sooner (docs/PERFORMANCE.md, "Routing balance").
  m.aux_loss_coef = 0.05;
  // Router centring is on in moe-train (the library's ModelConfig leaves it off, so imported and
  // older models keep plain routers): routing ignores the part of the stream every token shares,
  // which at d_model 512 otherwise sends most tokens to the same experts (PERFORMANCE.md).
  m.router_center_rate = 1.0;
  auto& io = *app.add_option_group("Data and output");
  add_data_options(io, o);
  add_output_options(io, o);
  auto& model = *app.add_option_group("Model (taken from the checkpoint with --resume or --init)");
  add_model_shape_options(model, o);
  add_routing_options(model, o);
  add_latent_options(
      *app.add_option_group("Multi-head Latent Attention (deepseek_v3; from the checkpoint "
                            "with --resume or --init)"),
      o);
  add_rope_scaling_options(*app.add_option_group("RoPE scaling (YaRN; RoPE architectures)"), o);
  add_optimizer_options(*app.add_option_group("Optimization"), o);
  add_offload_options(*app.add_option_group("Expert offload (ES-MoE, MoESys)"), o);
  auto& dist = *app.add_option_group(
      "Distributed (under mpiexec/srun; world = data parallel x expert parallel)");
  add_parallel_options(dist, o);
  add_placement_options(dist, o);
  // Every flag a resumed run reconciles has its setting: a missing one fails every run, --help too.
  for (const auto* flags : {&o.model_flags, &o.train_flags})
    for (const CLI::Option* opt : *flags) (void)setting_of(*opt);
}

void check_outputs(TrainOptions& o, bool lead) {
  tools::check_one_stdout({{"--metrics", o.metrics}, {"--trace", o.trace}});
  if (lead) {  // rank 0's outputs: an existing file only with --force, before any work
    if (o.resume.empty()) io::check_output_stream(o.metrics, o.force);  // a resume appends
    io::check_output_stream(o.trace, o.force);
  } else {
    o.common.quiet = true;
    o.metrics.clear();
    if (log_level() > LogLevel::warn) set_log_level(LogLevel::warn);
  }
}

namespace {

bool given(CLI::App& app, const char* flag) { return app.get_option(flag)->count() > 0; }

constexpr const char* kLatentFlags[] = {"--q-lora-rank", "--kv-lora-rank", "--qk-nope-dim",
                                        "--qk-rope-dim", "--v-head-dim"};

// deepseek_v3's latent attention where its flags are left out: DeepSeek-V3's proportions in small
// (its q latent 3x the kv one, values as wide as the unrotated part of a key, RoPE on a third of
// a key), from the width D and heads H: at the default --d-model 128 --heads 4, q 64, kv 32,
// heads of 32 + 16 features and values of 32.
void fill_latent_defaults(ModelConfig& m, CLI::App& app) {
  const int64_t hd = std::max<int64_t>(m.heads > 0 ? m.d_model / m.heads : 0, 2);
  if (!given(app, "--q-lora-rank")) m.q_lora_rank = std::max<int64_t>(m.d_model / 2, 1);
  if (!given(app, "--kv-lora-rank")) m.kv_lora_rank = std::max<int64_t>(m.d_model / 4, 1);
  if (!given(app, "--qk-nope-dim")) m.qk_nope_dim = hd;
  if (!given(app, "--qk-rope-dim")) m.qk_rope_dim = std::max<int64_t>(hd / 4 * 2, 2);
  if (!given(app, "--v-head-dim")) m.v_head_dim = m.qk_nope_dim;
}

// gpt_oss's layout where its flags are left out: experts in every layer (its clamped SwiGLU is an
// expert activation), a --sliding-window on the even layers as HF's default layer_types, and
// YaRN's correction range unrounded (HF gpt-oss's rope_parameters truncate false).
void fill_gpt_oss_defaults(ModelConfig& m, CLI::App& app) {
  if (!given(app, "--moe-every") && !given(app, "--experts-per-layer")) m.moe_every = 1;
  m.yarn.truncate = false;
  if (m.sliding_window > 0 && m.window_layers.empty())
    for (int64_t i = 0; i < m.layers; i += 2) m.window_layers.push_back(i);
}

// The clamped SwiGLU's flags are gpt_oss's alone: given for another --arch they would be ignored
// (ModelConfig::validate_swiglu refuses only values other than the defaults). With --resume or
// --init the arch must be given too, to be checked against the checkpoint's.
void check_gpt_oss_flags(const TrainOptions& o, CLI::App& app) {
  if (o.arch == "gpt_oss") return;
  for (const Setting s : {Setting::swiglu_alpha, Setting::swiglu_limit})
    if (given(app, flag_for(s)))
      throw UsageError(str(flag_for(s),
                           " is gpt_oss's (its clamped SwiGLU): it needs --arch gpt_oss, not "
                           "--arch ",
                           o.arch,
                           o.resume.empty() && o.init.empty()
                               ? ""
                               : " (with --resume or --init, give --arch gpt_oss too)"));
}

// The latent attention's flags are deepseek_v3's alone: one given for another --arch would be
// ignored. Their sizes and the head flags they replace are ModelConfig::validate_mla's.
void check_latent_flags(const TrainOptions& o, CLI::App& app) {
  if (o.arch == "deepseek_v3") return;
  for (const char* flag : kLatentFlags)
    if (given(app, flag))
      throw UsageError(str(flag,
                           " is deepseek_v3's (Multi-head Latent Attention): it needs --arch "
                           "deepseek_v3, not --arch ",
                           o.arch,
                           o.resume.empty() && o.init.empty()
                               ? ""
                               : " (with --resume or --init, give --arch deepseek_v3 too)"));
}

// The RoPE scaling flags of a new model: YaRN's settings only with --rope-scaling yarn, which
// needs the original context (its architecture and ranges are ModelConfig::validate_rope's).
// With --resume or --init the model is the checkpoint's: the library checks each flag given
// against its RoPE, as every model flag.
void check_rope_flags(const TrainOptions& o, CLI::App& app) {
  if (!o.resume.empty() || !o.init.empty()) return;
  const bool yarn = o.model.rope_type == RopeType::yarn;
  for (const CLI::Option* opt : o.rope_flags)
    if (!yarn && opt->count() && opt->get_name() != "--rope-scaling")
      throw UsageError(str(opt->get_name(), " is a YaRN setting: add --rope-scaling yarn"));
  if (!yarn) return;
  if (!given(app, "--original-max-position-embeddings"))
    throw UsageError(
        "--rope-scaling yarn needs --original-max-position-embeddings (the context the RoPE was "
        "trained for, which --rope-factor stretches)");
}

}  // namespace

// Flag combinations that cannot be run, before any work.
void check_flags(const TrainOptions& o, CLI::App& app) {
  check_latent_flags(o, app);
  check_gpt_oss_flags(o, app);
  check_rope_flags(o, app);
  // Each task's batch is in its tasks file: a --batch beside --tasks would be ignored.
  if (!o.train.tasks.empty() && app.get_option("--batch")->count())
    throw UsageError("--batch does not apply with --tasks: each task's batch is in " +
                     o.train.tasks + " (the step's batch is their total)");
  if (o.breakdown_sync && o.common.verbose == 0)
    throw UsageError("--breakdown-sync times the step breakdown that -v prints: add -v");
  if (o.breakdown_sync && Device::parse(o.device).kind != Device::cuda)
    throw UsageError(
        "--breakdown-sync applies to --device cuda (on the CPU every part of -v's "
        "breakdown is already its own time)");
}

// The run as the flags ask for it (the tool adds provenance and its callbacks); the explicitly
// given model and training flags are the ones a resumed run reconciles with its checkpoint.
train::SessionRequest session_request(const TrainOptions& o, CLI::App& app) {
  train::SessionRequest r;
  r.model = o.model;
  r.model.arch = parse_arch(o.arch);
  if (r.model.arch == Arch::deepseek_v3) fill_latent_defaults(r.model, app);
  if (r.model.arch == Arch::gpt_oss) fill_gpt_oss_defaults(r.model, app);
  const bool sigmoid_family = r.model.arch == Arch::glm4_moe || r.model.arch == Arch::deepseek_v3;
  r.model.router_scoring = o.router != "auto" ? parse_router_scoring(o.router)
                           : sigmoid_family   ? nn::RouterScoring::sigmoid
                                              : nn::RouterScoring::softmax;
  r.model.dtype = parse_dtype(o.dtype);
  r.model.normalize_topk =
      o.normalize_topk == "auto" ? flavour_of(r.model).normalize_topk : o.normalize_topk == "on";
  r.train = o.train;
  r.train.seed = o.common.seed;
  for (const CLI::Option* opt : o.model_flags)
    if (opt->count()) r.given.model.push_back(setting_of(*opt));
  for (const CLI::Option* opt : o.train_flags)
    if (opt->count()) r.given.train.push_back(setting_of(*opt));
  r.given.seed = app.get_option("--seed")->count() > 0;
  r.data_given = app.get_option("--data")->count() > 0;
  r.experts_listed = app.get_option("--experts-per-layer")->count() > 0;
  r.out = o.out;
  r.resume = o.resume;
  r.init = o.init;
  r.force = o.force;
  r.checkpoint_every = o.checkpoint_every;
  r.device = o.device;
  r.trace = o.trace;
  r.trace_every = o.trace_every;
  return r;
}

}  // namespace moe::tools

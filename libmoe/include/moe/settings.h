// The settings by name, for messages. The library names a setting (Setting::offload); the tools
// own the flags that set them, and this one table says which flag sets each, so that a refusal
// can tell the user what to change (flag_for(Setting::offload) is "--offload"). It is the only
// place in libmoe that spells a flag: a message writes flag_for(Setting::...), never "--...".
// A setting two tools share has one flag in both (--ep, --device, --expert-cache of moe-train
// and moe-infer; --ranks of moe-convert partition and moe-plan).
#pragma once

namespace moe {

// X(setting, flag): one line per setting, in groups by what they set.
// The training run's settings (TrainConfig; moe-distill's teacher, student and kd settings).
#define MOE_TRAIN_SETTINGS(X)                       \
  X(data, "--data")                                 \
  X(val, "--val")                                   \
  X(data_format, "--data-format")                   \
  X(val_fraction, "--val-fraction")                 \
  X(batch, "--batch")                               \
  X(steps, "--steps")                               \
  X(lr, "--lr")                                     \
  X(min_lr_ratio, "--min-lr-ratio")                 \
  X(warmup, "--warmup")                             \
  X(weight_decay, "--weight-decay")                 \
  X(clip, "--clip")                                 \
  X(eval_batches, "--eval-batches")                 \
  X(vocab, "--vocab")                               \
  X(ep, "--ep")                                     \
  X(shard_embedding, "--shard-embedding")           \
  X(a2a, "--a2a")                                   \
  X(ranks_per_node, "--ranks-per-node")             \
  X(comm_scheduler, "--comm-scheduler")             \
  X(placement, "--placement")                       \
  X(vexperts_per_rank, "--vexperts-per-rank")       \
  X(balance_threshold, "--balance-threshold")       \
  X(replan_every, "--replan-every")                 \
  X(offload, "--offload")                           \
  X(device_budget, "--device-budget")               \
  X(host_budget, "--host-budget")                   \
  X(ssd_dir, "--ssd-dir")                           \
  X(pin_fraction, "--pin-fraction")                 \
  X(prefetch_depth, "--prefetch-depth")             \
  X(optimizer_overlap, "--optimizer-overlap")       \
  X(no_optimizer_overlap, "--no-optimizer-overlap") \
  X(expert_cache, "--expert-cache")                 \
  X(grad_accum, "--grad-accum")                     \
  X(recompute, "--recompute")                       \
  X(tasks, "--tasks")                               \
  X(task_replan_every, "--task-replan-every")       \
  X(task_allocation, "--task-allocation")           \
  X(zero, "--zero")                                 \
  X(zero_prefetch, "--zero-prefetch")               \
  X(seed, "--seed")                                 \
  X(resume, "--resume")                             \
  X(init, "--init")                                 \
  X(trace, "--trace")                               \
  X(balance_bias_rate, "--balance-bias-rate")       \
  X(router_center_rate, "--router-center-rate")     \
  X(teacher, "--teacher")                           \
  X(student_layers, "--student-layers")             \
  X(keep_layers, "--keep-layers")                   \
  X(student_experts, "--student-experts")           \
  X(expert_selection, "--expert-selection")         \
  X(selection_batches, "--selection-batches")       \
  X(kd_alpha, "--kd-alpha")                         \
  X(kd_temperature, "--kd-temperature")             \
  X(kd_stop_step, "--kd-stop-step")                 \
  X(kd_schedule, "--kd-schedule")                   \
  X(device, "--device")                             \
  X(arch, "--arch")

// The model's shape (ModelConfig): moe-train's model flags.
#define MOE_MODEL_SETTINGS(X)                 \
  X(layers, "--layers")                       \
  X(moe_every, "--moe-every")                 \
  X(experts, "--experts")                     \
  X(experts_per_layer, "--experts-per-layer") \
  X(d_model, "--d-model")                     \
  X(heads, "--heads")                         \
  X(head_dim, "--head-dim")                   \
  X(kv_heads, "--kv-heads")                   \
  X(d_ff, "--d-ff")                           \
  X(dense_ff, "--dense-ff")                   \
  X(shared_expert_ff, "--shared-expert-ff")   \
  X(residual_moe, "--residual-moe")           \
  X(sliding_window, "--sliding-window")       \
  X(tie_embeddings, "--tie-embeddings")       \
  X(aux_loss_coef, "--aux-loss-coef")         \
  X(z_loss_coef, "--z-loss-coef")             \
  X(normalize_topk, "--normalize-topk")       \
  X(rope_dim, "--rope-dim")                   \
  X(rope_theta, "--rope-theta")               \
  X(qkv_bias, "--qkv-bias")                   \
  X(qk_norm, "--qk-norm")                     \
  X(router, "--router")                       \
  X(routed_scale, "--routed-scale")           \
  X(router_groups, "--router-groups")         \
  X(router_group_topk, "--router-group-topk") \
  X(seq, "--seq")                             \
  X(top_k, "--top-k")                         \
  X(capacity_factor, "--capacity-factor")     \
  X(router_jitter, "--router-jitter")         \
  X(norm_eps, "--norm-eps")                   \
  X(swiglu_alpha, "--swiglu-alpha")           \
  X(swiglu_limit, "--swiglu-limit")           \
  X(dtype, "--dtype")

// The model's attention variants: Multi-head Latent Attention (ModelConfig's MLA sizes) and RoPE
// scaling (ModelConfig::rope_type and its yarn settings, named as HF's rope_scaling keys).
#define MOE_ATTN_SETTINGS(X)                                      \
  X(q_lora_rank, "--q-lora-rank")                                 \
  X(kv_lora_rank, "--kv-lora-rank")                               \
  X(qk_nope_dim, "--qk-nope-dim")                                 \
  X(qk_rope_dim, "--qk-rope-dim")                                 \
  X(v_head_dim, "--v-head-dim")                                   \
  X(rope_scaling, "--rope-scaling")                               \
  X(rope_factor, "--rope-factor")                                 \
  X(original_max_positions, "--original-max-position-embeddings") \
  X(beta_fast, "--beta-fast")                                     \
  X(beta_slow, "--beta-slow")                                     \
  X(mscale, "--mscale")                                           \
  X(mscale_all_dim, "--mscale-all-dim")

// moe-train's output and the finer layout and expert-cache settings.
#define MOE_RUN_SETTINGS(X)           \
  X(out, "--out")                     \
  X(force, "--force")                 \
  X(metrics, "--metrics")             \
  X(log_every, "--log-every")         \
  X(partition_mb, "--partition-mb")   \
  X(lfu_threshold, "--lfu-threshold") \
  X(lfu_beta, "--lfu-beta")           \
  X(lfu_period, "--lfu-period")

// Serving (moe-infer's infer::Options; --ep, --device and --expert-cache above are its too).
#define MOE_SERVE_SETTINGS(X)             \
  X(expert_budget, "--expert-budget")     \
  X(prefetch, "--prefetch")               \
  X(prefetch_margin, "--prefetch-margin") \
  X(pin_from, "--pin-from")               \
  X(popularity, "--popularity")           \
  X(incremental, "--incremental")

// moe-convert's conversions (dtype --to, quantize --type, partition --ranks, import-hf),
// moe-profile's paths and moe-plan's calibration.
#define MOE_CONVERT_SETTINGS(X)         \
  X(to_dtype, "--to")                   \
  X(quant_type, "--type")               \
  X(ranks, "--ranks")                   \
  X(allow_unmapped, "--allow-unmapped") \
  X(keep_mxfp4, "--keep-mxfp4")         \
  X(path_length, "--path-length")       \
  X(calibrate_quick, "--quick")

#define MOE_SETTINGS(X) \
  MOE_TRAIN_SETTINGS(X) \
  MOE_MODEL_SETTINGS(X) \
  MOE_ATTN_SETTINGS(X)  \
  MOE_RUN_SETTINGS(X)   \
  MOE_SERVE_SETTINGS(X) \
  MOE_CONVERT_SETTINGS(X)

#define MOE_SETTING_ENUMERATOR(name, flag) name,
enum class Setting { MOE_SETTINGS(MOE_SETTING_ENUMERATOR) };
#undef MOE_SETTING_ENUMERATOR

// The flag that sets `setting` ("--offload").
const char* flag_for(Setting setting);

}  // namespace moe

// The settings table's config keys (see setting_keys.h).
#include "train/setting_keys.h"

namespace moe::train {

namespace {

struct SettingKey {
  Setting setting;
  const char* key;  // a JSON pointer into the config
};

// ModelConfig's keys (models/config.cpp, to_json). Keys written only when set (sliding_window,
// tie_embeddings, rope_type and the yarn object) are absent from a model without them.
constexpr SettingKey kModelKeys[] = {
    {Setting::arch, "/arch"},
    {Setting::vocab, "/vocab_size"},
    {Setting::layers, "/layers"},
    {Setting::moe_every, "/moe_every"},
    {Setting::experts, "/experts"},
    {Setting::experts_per_layer, "/experts_per_layer"},
    {Setting::d_model, "/d_model"},
    {Setting::heads, "/heads"},
    {Setting::head_dim, "/head_dim"},
    {Setting::kv_heads, "/kv_heads"},
    {Setting::d_ff, "/d_ff"},
    {Setting::dense_ff, "/dense_ff"},
    {Setting::shared_expert_ff, "/shared_expert_ff"},
    {Setting::residual_moe, "/residual_moe"},
    {Setting::sliding_window, "/sliding_window"},
    {Setting::tie_embeddings, "/tie_embeddings"},
    {Setting::aux_loss_coef, "/aux_loss_coef"},
    {Setting::z_loss_coef, "/z_loss_coef"},
    {Setting::normalize_topk, "/normalize_topk"},
    {Setting::rope_dim, "/rope_dim"},
    {Setting::rope_theta, "/rope_theta"},
    {Setting::qkv_bias, "/qkv_bias"},
    {Setting::qk_norm, "/qk_norm"},
    {Setting::router, "/router_scoring"},
    {Setting::routed_scale, "/routed_scale"},
    {Setting::router_groups, "/router_groups"},
    {Setting::router_group_topk, "/router_group_topk"},
    {Setting::seq, "/seq"},
    {Setting::top_k, "/top_k"},
    {Setting::capacity_factor, "/capacity_factor"},
    {Setting::router_jitter, "/router_jitter"},
    {Setting::norm_eps, "/norm_eps"},
    {Setting::swiglu_alpha, "/swiglu_alpha"},
    {Setting::swiglu_limit, "/swiglu_limit"},
    {Setting::dtype, "/dtype"},
    {Setting::balance_bias_rate, "/balance_bias_rate"},
    {Setting::router_center_rate, "/router_center_rate"},
    {Setting::q_lora_rank, "/q_lora_rank"},
    {Setting::kv_lora_rank, "/kv_lora_rank"},
    {Setting::qk_nope_dim, "/qk_nope_dim"},
    {Setting::qk_rope_dim, "/qk_rope_dim"},
    {Setting::v_head_dim, "/v_head_dim"},
    {Setting::rope_scaling, "/rope_type"},
    {Setting::rope_factor, "/yarn/factor"},
    {Setting::original_max_positions, "/yarn/original_ctx"},
    {Setting::beta_fast, "/yarn/beta_fast"},
    {Setting::beta_slow, "/yarn/beta_slow"},
    {Setting::mscale, "/yarn/mscale"},
    {Setting::mscale_all_dim, "/yarn/mscale_all_dim"},
};

// TrainConfig's keys (train/trainer.cpp, for_each_field).
constexpr SettingKey kTrainKeys[] = {
    {Setting::data, "/data"},
    {Setting::val, "/val"},
    {Setting::data_format, "/data_format"},
    {Setting::val_fraction, "/val_fraction"},
    {Setting::batch, "/batch"},
    {Setting::steps, "/steps"},
    {Setting::lr, "/lr"},
    {Setting::min_lr_ratio, "/min_lr_ratio"},
    {Setting::warmup, "/warmup"},
    {Setting::weight_decay, "/weight_decay"},
    {Setting::clip, "/clip"},
    {Setting::eval_batches, "/eval_batches"},
    {Setting::seed, "/seed"},
    {Setting::ep, "/ep"},
    {Setting::shard_embedding, "/shard_embedding"},
    {Setting::a2a, "/a2a"},
    {Setting::ranks_per_node, "/ranks_per_node"},
    {Setting::comm_scheduler, "/comm_scheduler"},
    {Setting::partition_mb, "/partition_mb"},
    {Setting::placement, "/placement"},
    {Setting::vexperts_per_rank, "/vexperts_per_rank"},
    {Setting::balance_threshold, "/balance_threshold"},
    {Setting::replan_every, "/replan_every"},
    {Setting::offload, "/offload"},
    {Setting::device_budget, "/device_budget"},
    {Setting::host_budget, "/host_budget"},
    {Setting::ssd_dir, "/ssd_dir"},
    {Setting::pin_fraction, "/pin_fraction"},
    {Setting::prefetch_depth, "/prefetch_depth"},
    {Setting::optimizer_overlap, "/optimizer_overlap"},
    {Setting::no_optimizer_overlap, "/optimizer_overlap"},
    {Setting::expert_cache, "/expert_cache"},
    {Setting::lfu_threshold, "/lfu_threshold"},
    {Setting::lfu_beta, "/lfu_beta"},
    {Setting::lfu_period, "/lfu_period"},
    {Setting::grad_accum, "/grad_accum"},
    {Setting::recompute, "/recompute"},
    {Setting::tasks, "/tasks"},
    {Setting::task_replan_every, "/task_replan_every"},
    {Setting::task_allocation, "/task_allocation"},
    {Setting::zero, "/zero"},
    {Setting::zero_prefetch, "/zero_prefetch"},
};

}  // namespace

const char* config_key(Setting setting, SettingConfig config) {
  if (config == SettingConfig::model) {
    for (const SettingKey& k : kModelKeys)
      if (k.setting == setting) return k.key;
  } else {
    for (const SettingKey& k : kTrainKeys)
      if (k.setting == setting) return k.key;
  }
  return nullptr;
}

}  // namespace moe::train

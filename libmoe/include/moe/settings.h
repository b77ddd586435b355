// The training settings by name, for messages. The library names a setting (Setting::offload);
// the tools own the flags that set them, and this one table says which flag of the training
// tools (moe-train; moe-distill for the teacher, student and kd settings) sets each, so that a
// refusal can tell the user what to change (flag_for(Setting::offload) is "--offload").
#pragma once

namespace moe {

// X(setting, flag): one line per setting.
#define MOE_SETTINGS(X)                         \
  X(data, "--data")                             \
  X(val, "--val")                               \
  X(data_format, "--data-format")               \
  X(val_fraction, "--val-fraction")             \
  X(batch, "--batch")                           \
  X(steps, "--steps")                           \
  X(lr, "--lr")                                 \
  X(min_lr_ratio, "--min-lr-ratio")             \
  X(warmup, "--warmup")                         \
  X(weight_decay, "--weight-decay")             \
  X(clip, "--clip")                             \
  X(eval_batches, "--eval-batches")             \
  X(vocab, "--vocab")                           \
  X(ep, "--ep")                                 \
  X(shard_embedding, "--shard-embedding")       \
  X(a2a, "--a2a")                               \
  X(ranks_per_node, "--ranks-per-node")         \
  X(comm_scheduler, "--comm-scheduler")         \
  X(placement, "--placement")                   \
  X(vexperts_per_rank, "--vexperts-per-rank")   \
  X(balance_threshold, "--balance-threshold")   \
  X(replan_every, "--replan-every")             \
  X(offload, "--offload")                       \
  X(device_budget, "--device-budget")           \
  X(host_budget, "--host-budget")               \
  X(ssd_dir, "--ssd-dir")                       \
  X(pin_fraction, "--pin-fraction")             \
  X(prefetch_depth, "--prefetch-depth")         \
  X(optimizer_overlap, "--optimizer-overlap")   \
  X(expert_cache, "--expert-cache")             \
  X(grad_accum, "--grad-accum")                 \
  X(recompute, "--recompute")                   \
  X(tasks, "--tasks")                           \
  X(task_replan_every, "--task-replan-every")   \
  X(task_allocation, "--task-allocation")       \
  X(zero, "--zero")                             \
  X(zero_prefetch, "--zero-prefetch")           \
  X(seed, "--seed")                             \
  X(resume, "--resume")                         \
  X(init, "--init")                             \
  X(trace, "--trace")                           \
  X(balance_bias_rate, "--balance-bias-rate")   \
  X(router_center_rate, "--router-center-rate") \
  X(teacher, "--teacher")                       \
  X(student_layers, "--student-layers")         \
  X(keep_layers, "--keep-layers")               \
  X(student_experts, "--student-experts")       \
  X(expert_selection, "--expert-selection")     \
  X(selection_batches, "--selection-batches")   \
  X(kd_alpha, "--kd-alpha")                     \
  X(kd_temperature, "--kd-temperature")         \
  X(kd_stop_step, "--kd-stop-step")             \
  X(kd_schedule, "--kd-schedule")               \
  X(device, "--device")                         \
  X(arch, "--arch")

#define MOE_SETTING_ENUMERATOR(name, flag) name,
enum class Setting { MOE_SETTINGS(MOE_SETTING_ENUMERATOR) };
#undef MOE_SETTING_ENUMERATOR

// The flag that sets `setting` ("--offload").
const char* flag_for(Setting setting);

}  // namespace moe

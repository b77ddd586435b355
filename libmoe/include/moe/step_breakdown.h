// Where a training step's time goes: wall seconds per kind of work (GEMMs, attention, elementwise
// passes, routing, dispatch/combine, loss, optimizer, memory, communication), measured by
// steady_clock scopes that the ops open around their work.
//
// Accounting is exclusive: a scope opened inside another charges its time to its own part and
// pauses the outer one, so the parts add up to the recorded span (time outside every scope is
// `other`). Only the thread that opened a StepRecording records; everywhere else (and on that
// thread when no recording is open) a PartScope costs one thread-local load and a branch, so the
// scopes stay in the ops for good.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace moe {

enum class StepPart : int {
  gemm,         // dense and grouped (expert) GEMMs, LM head included
  attention,    // the attention core: scores, causal softmax, contexts (their GEMMs included)
  elementwise,  // norms, activations, bias, RoPE, residual adds, embeddings
  router,       // router softmax, top-k, load, aux and z losses and their backward
  dispatch,     // the routing plan, dispatch gathers, combine and its backward
  loss,         // cross-entropy over the vocabulary
  optimizer,    // zeroing and clipping gradients, AdamW, the finiteness check
  memory,       // tensor allocation, zero fills, copies
  comm,         // gradient reduction and other collectives waited for
  other,        // everything outside the scopes above (framework overhead, sampling)
  count
};
constexpr int kStepParts = static_cast<int>(StepPart::count);

const char* step_part_name(StepPart part);

struct StepBreakdown {
  std::array<double, kStepParts> seconds{};
  // Floating-point operations of the `gemm` part's products (2 m n k each; the attention core's
  // products are not counted): with seconds[gemm], the rate the step's GEMMs ran at.
  double gemm_flops = 0;
  double& operator[](StepPart p) { return seconds[static_cast<size_t>(p)]; }
  double operator[](StepPart p) const { return seconds[static_cast<size_t>(p)]; }
  double total() const;
  bool empty() const { return total() == 0; }
  StepBreakdown& operator+=(const StepBreakdown& other);
  // "gemm 0.041 s 52% 310 GFLOP/s | attention 0.012 s 15% | ...", parts over 0.5% of the total,
  // largest first, each divided by `per` (steps) first.
  std::string describe(double per = 1) const;
};

namespace detail {
struct StepRecorder {
  StepBreakdown* into = nullptr;
  StepPart current = StepPart::other;
  std::chrono::steady_clock::time_point mark;
  // Called before each reading of the clock when set (a GPU's synchronize, with its index): the
  // work a part queued on the device is then charged to that part, not to the next one that waits.
  void (*wait)(int) = nullptr;
  int wait_arg = 0;
  void charge(std::chrono::steady_clock::time_point now) {
    (*into)[current] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  }
  std::chrono::steady_clock::time_point settle_now() const {
    if (wait) wait(wait_arg);
    return std::chrono::steady_clock::now();
  }
};
// This thread's recorder (null: not recording). A thread_local inside an inline function is one
// variable per thread across every translation unit; an `extern thread_local` would be reached
// through GCC's TLS wrapper function, whose address UBSan's null check rejects (a false "load of
// null pointer" in the sanitizer build).
inline StepRecorder*& current_recorder() {
  thread_local StepRecorder* recorder = nullptr;
  return recorder;
}
}  // namespace detail

// Records this thread's time into `into` (added to what it holds) for its lifetime. With `wait`,
// every part boundary first calls wait(wait_arg) (e.g. cuda::synchronize and the device), so the
// parts hold the device's time of their own work; the waits slow the step down.
class StepRecording {
 public:
  explicit StepRecording(StepBreakdown& into, void (*wait)(int) = nullptr, int wait_arg = 0);
  ~StepRecording();
  StepRecording(const StepRecording&) = delete;
  StepRecording& operator=(const StepRecording&) = delete;

 private:
  detail::StepRecorder recorder_;
  detail::StepRecorder* outer_;
};

// Adds a GEMM's 2 m n k to the recording of this thread (nothing when it does not record).
inline void count_gemm_flops(int64_t m, int64_t n, int64_t k) {
  if (detail::StepRecorder* r = detail::current_recorder())
    r->into->gemm_flops +=
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

// Charges the time until its end to `part` when this thread records; nothing otherwise.
class PartScope {
 public:
  explicit PartScope(StepPart part) {
    if (detail::StepRecorder* r = detail::current_recorder()) {
      r->charge(r->settle_now());
      previous_ = r->current;
      r->current = part;
      recorder_ = r;
    }
  }
  ~PartScope() {
    if (recorder_) {
      recorder_->charge(recorder_->settle_now());
      recorder_->current = previous_;
    }
  }
  PartScope(const PartScope&) = delete;
  PartScope& operator=(const PartScope&) = delete;

 private:
  detail::StepRecorder* recorder_ = nullptr;
  StepPart previous_ = StepPart::other;
};

}  // namespace moe

// StepBreakdown (moe/step_breakdown.h): exclusive accounting of nested scopes, parts that add up
// to the recorded span, nothing recorded off the recording thread or without a recording, a wait
// (a GPU's synchronize) before every clock read when asked, and a training step's breakdown
// (Trainer::record_breakdown) whose parts are the step's own time.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "moe/cuda.h"
#include "moe/step_breakdown.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

// At least `ms` milliseconds of wall time (the clock the breakdown reads).
void spend(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

TEST_CASE("step breakdown: nested scopes charge their own part, the parts add up", "[unit]") {
  StepBreakdown b;
  const auto start = std::chrono::steady_clock::now();
  {
    StepRecording recording(b);
    spend(5);  // other
    {
      PartScope gemm(StepPart::gemm);
      spend(20);
      {
        PartScope mem(StepPart::memory);  // paused gemm while it runs
        spend(10);
      }
      spend(20);
    }
  }
  const double span =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(b[StepPart::gemm] >= 0.040);
  CHECK(b[StepPart::gemm] <= span - 0.015);  // not the memory part's (nor other's) time
  CHECK(b[StepPart::memory] >= 0.010);
  CHECK(b[StepPart::other] >= 0.005);
  CHECK(b[StepPart::attention] == 0);
  // Exclusive: the parts are the span, not more.
  CHECK(b.total() <= span);
  CHECK(b.total() >= 0.055);
  const std::string text = b.describe();
  // The largest part first: gemm slept 40 ms against 10 and 5, but a loaded machine may oversleep
  // any of them, so the order is taken from the measured parts, not assumed.
  StepPart largest = StepPart::gemm;
  for (StepPart p : {StepPart::memory, StepPart::other})
    if (b[p] > b[largest]) largest = p;
  CHECK(text.rfind(std::string(step_part_name(largest)) + " ", 0) == 0);
  CHECK(text.find("memory ") != std::string::npos);
  CHECK(text.find("attention") == std::string::npos);  // parts under 0.5% are left out
}

TEST_CASE("step breakdown: nothing is recorded without a recording or on other threads", "[unit]") {
  StepBreakdown b;
  {
    PartScope scope(StepPart::gemm);  // no recording open: a no-op
    spend(2);
  }
  CHECK(b.empty());
  {
    StepRecording recording(b);
    std::thread other([] {
      PartScope scope(StepPart::attention);  // this thread does not record
      spend(5);
    });
    other.join();
  }
  CHECK(b[StepPart::attention] == 0);
  CHECK(b[StepPart::other] >= 0.005);  // the recording thread waited in join
  CHECK(std::string(step_part_name(StepPart::dispatch)) == "dispatch");
  StepBreakdown sum;
  sum += b;
  sum += b;
  CHECK(sum.total() == Approx(2 * b.total()));
}

namespace {
// A stand-in for a GPU's synchronize: `queued` milliseconds of work wait until the next call.
int waits = 0, wait_arg_seen = -1, queued_ms = 0;
void wait_for_queue(int arg) {
  ++waits;
  wait_arg_seen = arg;
  spend(queued_ms);
  queued_ms = 0;
}
}  // namespace

TEST_CASE("step breakdown: with a wait, a part holds the work it queued", "[unit]") {
  StepBreakdown b;
  waits = 0, queued_ms = 0;
  {
    StepRecording recording(b, &wait_for_queue, 3);
    {
      PartScope gemm(StepPart::gemm);
      queued_ms = 30;  // queued, not done: the wait at the part's end does it
    }
    {
      PartScope elementwise(StepPart::elementwise);  // waits for nothing
    }
  }
  // Every clock read waited first: the recording's start and end, each scope's start and end.
  CHECK(waits == 6);
  CHECK(wait_arg_seen == 3);
  // The wait runs before the clock is read, so the queued work is charged to the part that
  // queued it (read the clock first and it would go to the next part).
  CHECK(b[StepPart::gemm] >= 0.030);
  // Without a wait nothing waits for the queue.
  StepBreakdown plain;
  waits = 0;
  {
    StepRecording recording(plain);
    PartScope gemm(StepPart::gemm);
    queued_ms = 30;
  }
  CHECK(waits == 0);
  CHECK(queued_ms == 30);
  queued_ms = 0;
}

TEST_CASE("step breakdown: a step waits for the GPU only under --breakdown-sync", "[unit]") {
  // Trainer::step records with this wait: cuda::synchronize on a GPU when asked (each part then
  // holds its own device time), none otherwise. Only the choice runs here (no GPU is needed to
  // compare function addresses); the [cuda] suite trains with it.
  const Device gpu{Device::cuda, 1}, cpu{};
  CHECK(train::breakdown_wait(gpu, true) == &cuda::synchronize);
  CHECK(train::breakdown_wait(gpu, false) == nullptr);
  CHECK(train::breakdown_wait(cpu, true) == nullptr);
  CHECK(train::breakdown_wait(cpu, false) == nullptr);
}

TEST_CASE("step breakdown: a training step's parts are its own seconds", "[unit]") {
  ModelConfig model = test::small_model_config(Arch::gpt);
  model.resolve();
  train::TrainConfig config;
  config.data = test::fortunes_path("computers");
  config.batch = 4;
  config.steps = 3;
  config.eval_batches = 1;
  train::Trainer trainer(model, config, io::Provenance{});
  const train::StepStats off = trainer.step();
  CHECK(off.breakdown.empty());
  trainer.record_breakdown(true);
  const train::StepStats on = trainer.step();
  CHECK(on.breakdown.total() <= on.seconds);
  CHECK(on.breakdown.total() >= 0.9 * on.seconds);
  for (StepPart part :
       {StepPart::gemm, StepPart::attention, StepPart::elementwise, StepPart::router,
        StepPart::dispatch, StepPart::loss, StepPart::optimizer}) {
    INFO(step_part_name(part));
    CHECK(on.breakdown[part] > 0);
  }
  CHECK(on.breakdown[StepPart::comm] == 0);  // one process
  // The GEMM part's operations, counted from the shapes alone: per token, each layer's q, k, v
  // and output projections (4 D^2 multiply-adds: kv heads = heads here), its router (D E) and
  // its k experts' two products (2 k D F), and the LM head (D V); the backward does two products
  // (dX, dW) per forward one, and a multiply-add is 2 operations. Exact: integers well inside
  // a double's 53 bits.
  const double D = double(model.d_model), E = double(model.experts), F = double(model.d_ff),
               k = double(model.top_k), V = double(model.vocab_size), L = double(model.layers);
  const double tokens = double(config.batch) * double(model.seq);
  const double macs = tokens * (L * (4 * D * D + D * E + 2 * k * D * F) + D * V);
  CHECK(on.breakdown.gemm_flops == 3 * 2 * macs);
  CHECK(off.breakdown.gemm_flops == 0);  // not recorded
  CHECK(on.breakdown.describe().find(" GFLOP/s") != std::string::npos);
}

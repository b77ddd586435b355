// Mixture-of-Students distillation: the KD loss against a double-precision reference, the KD
// schedule, the student plan (layers, experts, PR-MoE pyramid, refusals), weights cut from the
// teacher, and a short deterministic distillation from a teacher trained on a real corpus.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "moe/infer/model.h"
#include "moe/io/dataset.h"
#include "moe/ops/distill.h"
#include "moe/rng.h"
#include "moe/train/distill.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;

namespace {

// 4 layers, all MoE with 4 experts (top-2), byte vocabulary, tiny widths: trains in a blink.
ModelConfig teacher_model(DType dtype = DType::f32) {
  ModelConfig c;
  c.arch = Arch::gpt;
  c.layers = 4;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.seq = 16;
  c.experts = 4;
  c.moe_every = 1;
  c.top_k = 2;
  c.dtype = dtype;
  c.resolve();
  return c;
}

train::TrainConfig tiny_train(int64_t steps, double lr = 3e-3) {
  train::TrainConfig t;
  t.data = test::fortunes_path("linux");
  t.batch = 8;
  t.steps = steps;
  t.lr = lr;
  t.warmup = 2;
  t.eval_batches = 2;
  t.seed = 7;
  return t;
}

// Trains a teacher for `steps` steps and returns its checkpoint file.
std::string make_teacher(const test::ScratchDir& dir, int64_t steps = 60,
                         DType dtype = DType::f32) {
  train::Trainer t(teacher_model(dtype), tiny_train(steps), {});
  while (t.steps_done() < steps) t.step();
  return t.save(dir.path());
}

io::Provenance distill_provenance() {
  io::Provenance p;
  p.tool = "moe-distill";
  p.version = "test";
  return p;
}

// Row-by-row reference in double: CE and T^2 KL(softmax(t/T) || softmax(s/T)).
ops::DistillLossValue reference_loss(const Tensor& s, const Tensor& t, const Tensor& targets,
                                     double temperature, double ce_weight, double kd_weight) {
  const int64_t n = s.dim(0), v = s.dim(1);
  ops::DistillLossValue out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = targets.data<int32_t>()[i];
    if (y < 0) continue;
    const float* sr = s.data<float>() + i * v;
    const float* tr = t.data<float>() + i * v;
    auto log_softmax = [&](const float* x, double scale, std::vector<double>& out_row) {
      double sum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(x[j] * scale);
      out_row.resize(static_cast<size_t>(v));
      for (int64_t j = 0; j < v; ++j) out_row[j] = x[j] * scale - std::log(sum);
    };
    std::vector<double> log_p1, log_p, log_q;
    log_softmax(sr, 1.0, log_p1);
    log_softmax(sr, 1.0 / temperature, log_p);
    log_softmax(tr, 1.0 / temperature, log_q);
    double kl = 0;
    for (int64_t j = 0; j < v; ++j) kl += std::exp(log_q[j]) * (log_q[j] - log_p[j]);
    out.ce += -log_p1[y];
    out.kd += temperature * temperature * kl;
    ++out.rows;
  }
  out.ce /= static_cast<double>(out.rows);
  out.kd /= static_cast<double>(out.rows);
  out.total = ce_weight * out.ce + kd_weight * out.kd;
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("distill: KD loss value matches a double-precision reference", "[distill]") {
  Tensor student = test::random_tensor({9, 13}, 41, 3.0f);
  Tensor teacher = test::random_tensor({9, 13}, 42, 4.0f);
  Tensor targets = Tensor::from_vector({9}, std::vector<int32_t>{0, 12, -1, 5, 7, 7, -1, 3, 11});
  for (double temperature : {0.5, 1.0, 2.0, 5.0}) {
    for (double alpha : {0.0, 0.3, 1.0}) {
      INFO("T " << temperature << " alpha " << alpha);
      ops::DistillLossValue got =
          ops::distill_loss(student, teacher, targets, static_cast<float>(temperature),
                            static_cast<float>(alpha), static_cast<float>(1 - alpha));
      ops::DistillLossValue want =
          reference_loss(student, teacher, targets, temperature, alpha, 1 - alpha);
      REQUIRE(got.rows == 7);
      REQUIRE(got.ce == Approx(want.ce).epsilon(1e-5));
      REQUIRE(got.kd == Approx(want.kd).epsilon(1e-5).margin(1e-6));
      REQUIRE(got.total == Approx(want.total).epsilon(1e-5).margin(1e-6));
      REQUIRE(want.kd > 0.05);  // the teacher differs: a real KL, not a zero that matches anything
    }
  }
  // Target out of range and a bad temperature are refused.
  Tensor bad = Tensor::from_vector({9}, std::vector<int32_t>{0, 13, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE_THAT(test::error_of([&] { ops::distill_loss(student, teacher, bad, 1, 1, 0); }),
               Catch::Contains("target 13 at row 1"));
  REQUIRE_THAT(test::error_of([&] { ops::distill_loss(student, teacher, targets, 0, 1, 0); }),
               Catch::Contains("temperature"));
}

TEST_CASE("distill: staged KD weight, linear and step schedules", "[distill]") {
  using train::kd_weight_at;
  using train::KdSchedule;
  REQUIRE(kd_weight_at(0, 0.2, 10, KdSchedule::linear) == Approx(0.8));
  REQUIRE(kd_weight_at(5, 0.2, 10, KdSchedule::linear) == Approx(0.4));
  REQUIRE(kd_weight_at(9, 0.2, 10, KdSchedule::linear) == Approx(0.08));
  REQUIRE(kd_weight_at(10, 0.2, 10, KdSchedule::linear) == 0.0);
  REQUIRE(kd_weight_at(50, 0.2, 10, KdSchedule::linear) == 0.0);
  REQUIRE(kd_weight_at(0, 0.2, 10, KdSchedule::step) == Approx(0.8));
  REQUIRE(kd_weight_at(9, 0.2, 10, KdSchedule::step) == Approx(0.8));
  REQUIRE(kd_weight_at(10, 0.2, 10, KdSchedule::step) == 0.0);
  REQUIRE(kd_weight_at(0, 0.2, 0, KdSchedule::linear) == 0.0);  // --kd-stop-step 0: no KD at all
  REQUIRE(kd_weight_at(3, 1.0, 10, KdSchedule::step) == 0.0);   // alpha 1: plain CE
}

TEST_CASE("distill: evenly spaced student layers always keep the last", "[distill]") {
  using V = std::vector<int64_t>;
  REQUIRE(train::evenly_spaced_layers(4, 2) == V{1, 3});
  REQUIRE(train::evenly_spaced_layers(5, 2) == V{1, 4});
  REQUIRE(train::evenly_spaced_layers(6, 3) == V{1, 3, 5});
  REQUIRE(train::evenly_spaced_layers(12, 4) == V{2, 5, 8, 11});
  REQUIRE(train::evenly_spaced_layers(4, 1) == V{3});
  REQUIRE(train::evenly_spaced_layers(4, 4) == V{0, 1, 2, 3});
  REQUIRE_THROWS_AS(train::evenly_spaced_layers(4, 5), UsageError);
  REQUIRE_THROWS_AS(train::evenly_spaced_layers(4, 0), UsageError);
}

TEST_CASE(
    "distill: student plan keeps the most routed experts, PR-MoE pyramids, refuses a "
    "bigger student",
    "[distill]") {
  using V = std::vector<int64_t>;
  const ModelConfig teacher = teacher_model();
  const std::vector<V> loads{{1, 2, 3, 4}, {10, 3, 7, 7}, {0, 0, 5, 0}, {2, 9, 9, 1}};
  train::StudentSpec spec;
  spec.layers = 2;
  spec.experts = {2};
  train::StudentPlan plan = train::plan_student(teacher, spec, loads);
  REQUIRE(plan.layers == V{1, 3});
  REQUIRE(plan.experts == std::vector<V>{{0, 2}, {1, 2}});  // ties go to the lower index
  REQUIRE(plan.routing_kept.size() == 2);
  REQUIRE(plan.routing_kept[0] == Approx(17.0 / 27.0));
  REQUIRE(plan.routing_kept[1] == Approx(18.0 / 21.0));
  ModelConfig student = train::student_config(teacher, plan);
  REQUIRE(student.layers == 2);
  REQUIRE(student.experts_per_layer == V{2, 2});
  REQUIRE(student.d_model == teacher.d_model);
  REQUIRE(student.vocab_size == teacher.vocab_size);

  spec.expert_rule = train::ExpertRule::first;
  plan = train::plan_student(teacher, spec);
  REQUIRE(plan.experts == std::vector<V>{{0, 1}, {0, 1}});
  REQUIRE(plan.routing_kept.empty());

  // A pyramid: one count per student MoE layer; explicit layers.
  spec = {};
  spec.keep_layers = {0, 2, 3};
  spec.experts = {2, 3, 4};
  plan = train::plan_student(teacher, spec, loads);
  REQUIRE(plan.layers == V{0, 2, 3});
  REQUIRE(plan.experts == std::vector<V>{{2, 3}, {0, 1, 2}, {0, 1, 2, 3}});
  REQUIRE(train::student_config(teacher, plan).experts_per_layer == V{2, 3, 4});

  auto refused = [&](train::StudentSpec s) {
    std::string message;
    try {
      train::plan_student(teacher, s, loads);
      message = "(no error)";
    } catch (const UsageError& e) {
      message = e.what();
    }
    return message;
  };
  spec = {};
  spec.layers = 5;
  REQUIRE_THAT(refused(spec), Catch::Contains("more than the teacher's 4 layers"));
  spec = {};
  spec.experts = {5};
  REQUIRE_THAT(refused(spec), Catch::Contains("more than the 4 experts of teacher layer 0"));
  spec.experts = {1};
  REQUIRE_THAT(refused(spec), Catch::Contains("needs at least 2"));
  spec.experts = {2, 2, 2};
  REQUIRE_THAT(refused(spec), Catch::Contains("has 3 values"));
  spec = {};
  spec.keep_layers = {3, 1};
  REQUIRE_THAT(refused(spec), Catch::Contains("strictly increasing"));
  spec.keep_layers = {4};
  REQUIRE_THAT(refused(spec), Catch::Contains("not one of the teacher's 4 layers"));
  REQUIRE_THAT(test::error_of([] { train::parse_expert_rule("random"); }),
               Catch::Contains("--expert-selection"));

  // Dense teacher layers stay dense; the per-layer form needs 0 there.
  ModelConfig every2 = teacher;
  every2.moe_every = 2;
  every2.experts_per_layer.clear();
  every2.resolve();
  REQUIRE(every2.experts_per_layer == V{0, 4, 0, 4});
  spec = {};
  spec.experts = {0, 2, 0, 3};
  spec.expert_rule = train::ExpertRule::first;
  plan = train::plan_student(every2, spec);
  REQUIRE(train::student_config(every2, plan).experts_per_layer == V{0, 2, 0, 3});
  spec.experts = {1, 2, 0, 3};
  REQUIRE_THROWS_AS(train::plan_student(every2, spec), UsageError);
}

TEST_CASE("distill: student weights are the teacher's kept layers and expert rows", "[distill]") {
  const ModelConfig teacher_config = teacher_model();
  ParamSet teacher_params(17, teacher_config.dtype);
  Transformer teacher(teacher_config, teacher_params);
  for (Param* p : teacher_params.all()) {  // distinct values everywhere (norm weights too)
    p->value.copy_from(test::random_tensor(p->value.shape(), hash_name(p->name), 0.5f));
    p->refresh_compute();
  }
  train::StudentSpec spec;
  spec.keep_layers = {1, 3};
  spec.experts = {3, 2};
  spec.expert_rule = train::ExpertRule::first;
  train::StudentPlan plan = train::plan_student(teacher_config, spec);
  plan.experts = {{0, 2, 3}, {1, 3}};  // any increasing subset works, not only the first ones
  const ModelConfig student_config = train::student_config(teacher_config, plan);
  std::vector<io::NamedTensor> weights =
      train::student_params(teacher_params, teacher_config, plan);
  ParamSet student_params(3, student_config.dtype);
  Transformer student(student_config, student_params);
  REQUIRE(weights.size() == student_params.size());
  for (const io::NamedTensor& nt : weights) {
    INFO(nt.name);
    Param* p = student_params.find(nt.name);
    REQUIRE(p);
    REQUIRE(nt.tensor.shape() == p->value.shape());
    REQUIRE(nt.tensor.dtype() == p->value.dtype());
    REQUIRE(nt.expert == p->expert);
    // The teacher tensor it came from.
    std::string source = nt.name;
    int64_t student_layer = -1;
    if (source.rfind("blocks.", 0) == 0) {
      student_layer = source[7] - '0';
      source = "blocks." + std::to_string(plan.layers[student_layer]) + source.substr(8);
    }
    const Param& from = teacher_params.at(source);
    if (nt.expert || nt.name.ends_with("moe.router.weight")) {
      const std::vector<int64_t>& kept = plan.experts[student_layer];
      const size_t row = from.value.nbytes() / static_cast<size_t>(from.value.dim(0));
      for (size_t i = 0; i < kept.size(); ++i)
        REQUIRE(std::memcmp(static_cast<const std::byte*>(nt.tensor.raw()) + i * row,
                            static_cast<const std::byte*>(from.value.raw()) + kept[i] * row,
                            row) == 0);
    } else {
      REQUIRE(same_bytes(nt.tensor, from.value));
    }
  }

  // Keeping everything gives the teacher back: the same logits, bitwise.
  spec = {};
  spec.expert_rule = train::ExpertRule::first;
  plan = train::plan_student(teacher_config, spec);
  ParamSet copy_params(3, teacher_config.dtype);
  Transformer copy(train::student_config(teacher_config, plan), copy_params);
  for (const io::NamedTensor& nt : train::student_params(teacher_params, teacher_config, plan)) {
    copy_params.at(nt.name).value.copy_from(nt.tensor);
    copy_params.at(nt.name).refresh_compute();
  }
  Tensor ids = test::random_ids({2, teacher_config.seq}, 5, 256);
  REQUIRE(same_bytes(copy.logits(ids), teacher.logits(ids)));
}

TEST_CASE("distill: the student starts at the teacher's weights (f32 and bf16 masters)",
          "[distill]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      test::ScratchDir dir("distill-init");
      const std::string teacher = make_teacher(dir, 20, dtype);
      train::DistillConfig dc;
      dc.teacher = teacher;  // every layer and expert kept: the student is the teacher
      train::Distiller d(dc, tiny_train(5, 1e-7), distill_provenance());
      REQUIRE(d.evaluate() == d.evaluate_teacher());
      // A step with a negligible learning rate keeps it there (fresh random fp32 masters would
      // replace the weights at the first step).
      d.step();
      REQUIRE(d.evaluate() == Approx(d.evaluate_teacher()).epsilon(1e-3));
    }
  }
}

TEST_CASE("distill: a short deterministic run lowers the KD loss, the output loads and scores",
          "[distill]") {
  test::ScratchDir dir("distill-run");
  const std::string teacher = make_teacher(dir, 200);  // trained enough that its layers matter
  train::DistillConfig dc;
  dc.teacher = teacher;
  dc.student.layers = 2;
  dc.student.experts = {2};
  dc.alpha = 0.2;
  dc.temperature = 2.0;
  dc.kd_schedule =
      train::KdSchedule::step;  // full KD weight throughout: the KD term alone is what falls
  const int64_t steps = 40;
  dc.kd_stop_step = steps;
  auto run = [&](std::vector<double>& kd, std::vector<double>& loss) {
    auto d = std::make_unique<train::Distiller>(dc, tiny_train(steps), distill_provenance());
    while (d->trainer().steps_done() < steps) {
      train::DistillStep s = d->step();
      REQUIRE(s.kd_weight == Approx(0.8));
      REQUIRE(s.train.forward.loss == Approx(0.2 * s.ce + 0.8 * s.kd).epsilon(1e-6));
      kd.push_back(s.kd);
      loss.push_back(s.train.forward.loss);
    }
    return d;
  };
  std::vector<double> kd, loss, kd2, loss2;
  auto d = run(kd, loss);
  REQUIRE(d->plan().layers == std::vector<int64_t>{1, 3});
  auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += v[i];
    return s / static_cast<double>(to - from);
  };
  const double first = mean(kd, 0, 8), last = mean(kd, kd.size() - 8, kd.size());
  INFO("KD loss " << first << " -> " << last);
  REQUIRE(last < 0.5 * first);
  // Deterministic: the same run again gives the same losses, bitwise.
  auto again = run(kd2, loss2);
  REQUIRE(kd2 == kd);
  REQUIRE(loss2 == loss);

  // The output is a normal checkpoint that records how the student was made.
  const std::string path = d->save(dir / "student");
  infer::LoadedModel m = infer::load_model(path);
  REQUIRE(to_json(m.config) == to_json(d->student_config()));
  REQUIRE(m.config.layers == 2);
  REQUIRE(m.config.experts_per_layer == std::vector<int64_t>{2, 2});
  REQUIRE(m.provenance.tool == "moe-distill");
  io::Checkpoint ckpt = io::load_checkpoint(path, false);
  REQUIRE(ckpt.train_config.at("distill").at("kept_layers") == nlohmann::json({1, 3}));
  REQUIRE(ckpt.train_config.at("distill").at("kept_experts").size() == 2);
  REQUIRE(ckpt.train_config.at("distill").at("teacher") == teacher);
  REQUIRE(ckpt.train_config.at("steps") == steps);
  // It scores as the trained student does.
  std::vector<int32_t> tokens = io::load_tokens(test::fortunes_path("linux"));
  io::BatchSampler sampler(&tokens, m.config.seq, 3, false);
  Tensor ids, targets;
  sampler.next(4, ids, targets);
  const double loaded = m.model->evaluate(ids, targets).loss;
  REQUIRE(loaded == d->trainer().model().evaluate(ids, targets).loss);
  REQUIRE(loaded < std::log(256.0) - 1.0);  // learned something: well below uniform over bytes
}

TEST_CASE("distill: missing teacher, bigger student, bad alpha/T, out-of-vocabulary data",
          "[distill]") {
  test::ScratchDir dir("distill-errors");
  const std::string teacher = make_teacher(dir, 5);
  train::DistillConfig dc;
  dc.teacher = dir / "no-such.h5";
  REQUIRE_THAT(test::error_of([&] { train::Distiller d(dc, tiny_train(2), {}); }),
               Catch::Contains("teacher checkpoint '" + dc.teacher + "' does not exist"));
  dc.teacher = teacher;
  auto usage = [&](const train::DistillConfig& c) {
    try {
      train::Distiller d(c, tiny_train(2), {});
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no usage error)");
  };
  train::DistillConfig bigger = dc;
  bigger.student.layers = 6;
  REQUIRE_THAT(usage(bigger), Catch::Contains("--student-layers 6 is more than the teacher's 4"));
  bigger = dc;
  bigger.student.experts = {8};
  REQUIRE_THAT(usage(bigger), Catch::Contains("more than the 4 experts"));
  train::DistillConfig bad = dc;
  bad.alpha = 1.5;
  REQUIRE_THAT(usage(bad), Catch::Contains("--kd-alpha"));
  bad = dc;
  bad.temperature = 0;
  REQUIRE_THAT(usage(bad), Catch::Contains("--kd-temperature"));
  REQUIRE_THAT(test::error_of([] { train::parse_kd_schedule("cosine"); }),
               Catch::Contains("--kd-schedule"));
  // Token ids the teacher's byte vocabulary does not have.
  std::vector<int32_t> ids(400);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 300);
  const std::string wide = dir / "wide.u16";
  io::save_tokens(wide, ids);
  train::TrainConfig tc = tiny_train(2);
  tc.data = wide;
  REQUIRE_THAT(test::error_of([&] { train::Distiller d(dc, tc, {}); }),
               Catch::Contains("vocabulary of 256"));
}

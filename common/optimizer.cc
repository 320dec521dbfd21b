#include "common/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace summa {
namespace {

absl::Status NonNegative(const char* what, double v) {
  if (!std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", v, " must be finite and not negative"));
  }
  return absl::OkStatus();
}

absl::Status UnitInterval(const char* what, double v) {
  if (!(v >= 0 && v < 1)) return absl::InvalidArgumentError(absl::StrCat(what, " ", v, " must be in [0, 1)"));
  return absl::OkStatus();
}

class Sgd final : public Optimizer {
 public:
  explicit Sgd(OptimizerOptions o) : Optimizer(std::move(o)) {}

  std::vector<std::string> SlotNames() const override {
    if (options().momentum == 0) return {};
    return {"momentum_buffer"};
  }

  void Apply(uint64_t t, double learning_rate, absl::Span<float> weights,
             absl::Span<const absl::Span<float>> slots, absl::Span<const float> grad_sum,
             int64_t num_examples) const override {
    if (num_examples <= 0) return;
    const float scale = static_cast<float>(1.0 / static_cast<double>(num_examples));
    const float lr = static_cast<float>(learning_rate);
    const float wd = static_cast<float>(options().weight_decay);
    const float mu = static_cast<float>(options().momentum);
    const size_t n = weights.size();
    float* w = weights.data();
    const float* g = grad_sum.data();
    if (mu == 0.0f) {
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] * scale + wd * w[i]);
      return;
    }
    float* v = slots[0].data();
    const bool nesterov = options().nesterov;
    for (size_t i = 0; i < n; ++i) {
      const float d = g[i] * scale + wd * w[i];
      v[i] = mu * v[i] + d;
      w[i] -= lr * (nesterov ? d + mu * v[i] : v[i]);
    }
  }

 private:
  std::string DescribeRule() const override {
    const OptimizerOptions& o = options();
    return absl::StrCat("sgd(lr=", o.learning_rate, ", momentum=", o.momentum,
                        o.nesterov ? ", nesterov" : "", ", weight_decay=", o.weight_decay, ")");
  }
};

// Adam as torch.optim.Adam / AdamW compute it (single-tensor path): moments updated with the
// gradient, bias corrections in double, denominator sqrt(v) / sqrt(1 - b2^t) + eps.
class Adam final : public Optimizer {
 public:
  explicit Adam(OptimizerOptions o) : Optimizer(std::move(o)) {}

  std::vector<std::string> SlotNames() const override { return {"exp_avg", "exp_avg_sq"}; }

  void Apply(uint64_t t, double learning_rate, absl::Span<float> weights,
             absl::Span<const absl::Span<float>> slots, absl::Span<const float> grad_sum,
             int64_t num_examples) const override {
    if (num_examples <= 0) return;
    const OptimizerOptions& o = options();
    const float scale = static_cast<float>(1.0 / static_cast<double>(num_examples));
    const double lr = learning_rate;
    const double step = static_cast<double>(t + 1);
    // 1 - beta in double, then float, as PyTorch's Python scalars are (1.0f - 0.999f is 1e-5 off).
    const float one_minus_b1 = static_cast<float>(1.0 - o.beta1);
    const float b2 = static_cast<float>(o.beta2), one_minus_b2 = static_cast<float>(1.0 - o.beta2);
    const float step_size = static_cast<float>(lr / (1.0 - std::pow(o.beta1, step)));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, step)));
    const float eps = static_cast<float>(o.eps);
    const bool decoupled = name() == "adamw";
    const float wd = static_cast<float>(o.weight_decay);
    const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
    float* w = weights.data();
    float* m = slots[0].data();
    float* v = slots[1].data();
    const float* g = grad_sum.data();
    for (size_t i = 0; i < weights.size(); ++i) {
      float grad = g[i] * scale;
      if (decoupled) {
        w[i] *= decay;
      } else {
        grad += wd * w[i];
      }
      m[i] += one_minus_b1 * (grad - m[i]);
      v[i] = v[i] * b2 + one_minus_b2 * grad * grad;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      w[i] -= step_size * (m[i] / denom);
    }
  }

 private:
  std::string DescribeRule() const override {
    const OptimizerOptions& o = options();
    return absl::StrCat(name(), "(lr=", o.learning_rate, ", betas=(", o.beta1, ", ", o.beta2,
                        "), eps=", o.eps, ", weight_decay=", o.weight_decay, ")");
  }
};

// Adagrad as torch.optim.Adagrad computes it (single-tensor path, lr_decay 0): sum += g^2,
// w -= lr * g / (sqrt(sum) + eps), L2 decay added to the gradient. The embedding tables' row-wise
// Adagrad (server/core/embedding_table.h) is this rule on the rows a step touched.
class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(OptimizerOptions o) : Optimizer(std::move(o)) {}

  std::vector<std::string> SlotNames() const override { return {"sum"}; }

  void Apply(uint64_t, double learning_rate, absl::Span<float> weights,
             absl::Span<const absl::Span<float>> slots, absl::Span<const float> grad_sum,
             int64_t num_examples) const override {
    if (num_examples <= 0) return;
    const float scale = static_cast<float>(1.0 / static_cast<double>(num_examples));
    const float lr = static_cast<float>(learning_rate);
    const float eps = static_cast<float>(options().eps);
    const float wd = static_cast<float>(options().weight_decay);
    float* w = weights.data();
    float* sum = slots[0].data();
    const float* g = grad_sum.data();
    for (size_t i = 0; i < weights.size(); ++i) {
      const float grad = g[i] * scale + wd * w[i];
      sum[i] += grad * grad;
      w[i] -= lr * (grad / (std::sqrt(sum[i]) + eps));
    }
  }

 private:
  std::string DescribeRule() const override {
    const OptimizerOptions& o = options();
    return absl::StrCat("adagrad(lr=", o.learning_rate, ", eps=", o.eps, ", weight_decay=", o.weight_decay, ")");
  }
};

}  // namespace

absl::StatusOr<LrSchedule> ParseLrSchedule(const std::string& name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "step") return LrSchedule::kStep;
  if (name == "cosine") return LrSchedule::kCosine;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown learning-rate schedule '", name, "': use constant, step or cosine"));
}

const char* LrScheduleName(LrSchedule schedule) {
  switch (schedule) {
    case LrSchedule::kConstant: return "constant";
    case LrSchedule::kStep: return "step";
    case LrSchedule::kCosine: return "cosine";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<const Optimizer>> Optimizer::Create(const OptimizerOptions& o) {
  if (!std::isfinite(o.learning_rate) || o.learning_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate ", o.learning_rate, " must be finite and not negative"));
  }
  if (absl::Status s = NonNegative("weight decay", o.weight_decay); !s.ok()) return s;
  switch (o.schedule) {
    case LrSchedule::kConstant: break;
    case LrSchedule::kStep:
      if (o.step_size < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("the step schedule needs --lr_step_size >= 1, got ", o.step_size));
      }
      if (absl::Status s = NonNegative("the step schedule's gamma", o.gamma); !s.ok()) return s;
      break;
    case LrSchedule::kCosine:
      if (o.warmup_steps < 0 || o.total_steps <= o.warmup_steps) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the cosine schedule needs 0 <= --lr_warmup_steps < --lr_total_steps, got ",
            o.warmup_steps, " and ", o.total_steps));
      }
      break;
  }
  if (o.name == "sgd") {
    if (absl::Status s = UnitInterval("momentum", o.momentum); !s.ok()) return s;
    if (o.nesterov && o.momentum == 0) {
      return absl::InvalidArgumentError("nesterov momentum needs a momentum above 0");
    }
    return std::unique_ptr<const Optimizer>(new Sgd(o));
  }
  if (o.name == "adam" || o.name == "adamw") {
    if (absl::Status s = UnitInterval("beta1", o.beta1); !s.ok()) return s;
    if (absl::Status s = UnitInterval("beta2", o.beta2); !s.ok()) return s;
    if (!std::isfinite(o.eps) || o.eps <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("eps ", o.eps, " must be finite and positive"));
    }
    return std::unique_ptr<const Optimizer>(new Adam(o));
  }
  if (o.name == "adagrad") {
    if (!std::isfinite(o.eps) || o.eps <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("eps ", o.eps, " must be finite and positive"));
    }
    return std::unique_ptr<const Optimizer>(new Adagrad(o));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", o.name, "': use sgd, adam, adamw or adagrad"));
}

double Optimizer::LearningRate(uint64_t t) const {
  const OptimizerOptions& o = options_;
  switch (o.schedule) {
    case LrSchedule::kConstant: return o.learning_rate;
    case LrSchedule::kStep:
      return o.learning_rate * std::pow(o.gamma, static_cast<double>(t / static_cast<uint64_t>(o.step_size)));
    case LrSchedule::kCosine: {
      const double step = static_cast<double>(t);
      if (step < o.warmup_steps) return o.learning_rate * (step + 1) / o.warmup_steps;
      if (step >= o.total_steps) return 0.0;
      const double progress = (step - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
      return 0.5 * o.learning_rate * (1.0 + std::cos(M_PI * progress));
    }
  }
  return o.learning_rate;
}

std::string Optimizer::Describe() const {
  const OptimizerOptions& o = options_;
  std::string schedule = LrScheduleName(o.schedule);
  if (o.schedule == LrSchedule::kStep) {
    absl::StrAppend(&schedule, "(step_size=", o.step_size, ", gamma=", o.gamma, ")");
  } else if (o.schedule == LrSchedule::kCosine) {
    absl::StrAppend(&schedule, "(warmup_steps=", o.warmup_steps, ", total_steps=", o.total_steps, ")");
  }
  return absl::StrCat(DescribeRule(), ", lr schedule ", schedule);
}

}  // namespace summa

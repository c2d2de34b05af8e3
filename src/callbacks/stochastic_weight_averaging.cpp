#include "fulgor/callbacks/stochastic_weight_averaging.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "fulgor/callbacks/weight_averaging.h"
#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"

namespace fulgor {

namespace {

std::vector<double> swa_rates_for(const torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs) {
  const size_t groups = optimizer.param_groups().size();
  if (swa_lrs.size() == 1) return std::vector<double>(groups, swa_lrs[0]);
  if (swa_lrs.size() != groups)
    throw ConfigError(fmt::format(
        "swa_lr must have the same length as optimizer.param_groups: swa_lr has {}, optimizer.param_groups has {}",
        swa_lrs.size(), groups));
  return swa_lrs;
}

}  // namespace

SWALR::SWALR(torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs, int64_t anneal_epochs,
             const std::string& anneal_strategy)
    : LRScheduler(optimizer),
      swa_lrs_(swa_rates_for(optimizer, std::move(swa_lrs))),
      anneal_epochs_(anneal_epochs),
      cosine_(anneal_strategy == "cos") {
  if (anneal_strategy != "cos" && anneal_strategy != "linear")
    throw ConfigError(fmt::format("anneal_strategy must by one of 'cos' or 'linear', instead got {}", anneal_strategy));
  if (anneal_epochs < 0)
    throw ConfigError(fmt::format("anneal_epochs must be equal or greater than 0, got {}", anneal_epochs));
  initial_step();
}

double SWALR::anneal(double t) const { return cosine_ ? (1 - std::cos(M_PI * t)) / 2 : t; }

// torch's SWALR.get_lr, operation for operation: the rate the annealing
// started from is recovered from the current one.
std::vector<double> SWALR::get_lr() {
  int64_t step = step_count_ - 1;
  if (anneal_epochs_ == 0) step = std::max<int64_t>(1, step);
  const auto span = static_cast<double>(std::max<int64_t>(1, anneal_epochs_));
  const double prev_alpha = anneal(std::max(0.0, std::min(1.0, static_cast<double>(step - 1) / span)));
  const double alpha = anneal(std::max(0.0, std::min(1.0, static_cast<double>(step) / span)));
  std::vector<double> lrs = current_lrs();
  for (size_t i = 0; i < lrs.size(); ++i) {
    const double swa_lr = swa_lrs_[i];
    const double initial = prev_alpha == 1 ? swa_lr : (lrs[i] - prev_alpha * swa_lr) / (1 - prev_alpha);
    lrs[i] = swa_lr * alpha + initial * (1 - alpha);
  }
  return lrs;
}

// ---- update_bn ---------------------------------------------------------------

namespace {

// Resets a BatchNorm layer of kind BN and unsets its momentum; records how
// to put the momentum back.
template <typename BN>
bool take_batch_norm(torch::nn::Module& m, std::vector<std::function<void()>>& restore) {
  auto* bn = dynamic_cast<BN*>(&m);
  if (bn == nullptr) return false;
  if (!bn->options.track_running_stats()) return true;
  bn->reset_running_stats();
  const auto momentum = bn->options.momentum();
  bn->options.momentum(c10::nullopt);
  restore.emplace_back([bn, momentum] { bn->options.momentum(momentum); });
  return true;
}

bool take(torch::nn::Module& m, std::vector<std::function<void()>>& restore) {
  return take_batch_norm<torch::nn::BatchNorm1dImpl>(m, restore) ||
         take_batch_norm<torch::nn::BatchNorm2dImpl>(m, restore) ||
         take_batch_norm<torch::nn::BatchNorm3dImpl>(m, restore);
}

bool has_batch_norm(const torch::nn::Module& model) {
  auto is_bn = [](const torch::nn::Module& m) {
    return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
           dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m);
  };
  if (is_bn(model)) return true;
  for (const auto& m : model.modules(/*include_self=*/false))
    if (is_bn(*m)) return true;
  return false;
}

}  // namespace

bool update_bn(torch::nn::Module& model, const std::function<void()>& forward_pass) {
  std::vector<std::function<void()>> restore;
  // modules(include_self) would need the model held by a shared_ptr.
  take(model, restore);
  for (const auto& m : model.modules(/*include_self=*/false)) take(*m, restore);
  if (restore.empty()) return false;
  const bool was_training = model.is_training();
  model.train();
  {
    torch::NoGradGuard no_grad;
    forward_pass();
  }
  for (auto& r : restore) r();
  model.train(was_training);
  return true;
}

// ---- StochasticWeightAveraging ---------------------------------------------

StochasticWeightAveraging::StochasticWeightAveraging(StochasticWeightAveragingOptions options)
    : options_(std::move(options)) {
  const char* start_error = "swa_epoch_start should be a >0 integer or a float between 0 and 1.";
  if (const auto* epoch = std::get_if<int64_t>(&options_.swa_epoch_start); epoch && *epoch < 1)
    throw ConfigError(fmt::format("{} Got {}", start_error, *epoch));
  if (const auto* share = std::get_if<double>(&options_.swa_epoch_start); share && !(*share >= 0 && *share <= 1))
    throw ConfigError(fmt::format("{} Got {}", start_error, *share));
  const bool positive = std::all_of(options_.swa_lrs.begin(), options_.swa_lrs.end(), [](double lr) { return lr > 0; });
  if (options_.swa_lrs.empty() || !positive)
    throw ConfigError(fmt::format("The `swa_lrs` should a positive float, or a list of positive floats; got [{}]",
                                  fmt::join(options_.swa_lrs, ", ")));
  if (options_.annealing_strategy != "cos" && options_.annealing_strategy != "linear")
    throw ConfigError(fmt::format("annealing_strategy must by one of 'cos' or 'linear', instead got {}",
                                  options_.annealing_strategy));
  if (options_.annealing_epochs < 0)
    throw ConfigError(
        fmt::format("annealing_epochs must be equal or greater than 0, got {}", options_.annealing_epochs));
}

StochasticWeightAveraging::~StochasticWeightAveraging() = default;

int64_t StochasticWeightAveraging::swa_start() const { return std::max<int64_t>(swa_epoch_start_ - 1, 0); }

bool StochasticWeightAveraging::in_swa(int64_t epoch) const {
  return swa_start() <= epoch && (max_epochs_ == -1 || epoch <= max_epochs_ - 1);
}

void StochasticWeightAveraging::setup(Trainer&, ModuleBase&, const std::string& stage) {
  if (stage != "fit") return;
  // A new fit starts afresh; a resume's state is loaded after this.
  average_.clear();
  n_averaged_ = 0;
  latest_update_epoch_ = -1;
  scheduler_.reset();
  scheduler_state_.reset();
}

void StochasticWeightAveraging::on_fit_start(Trainer& trainer, ModuleBase& module) {
  if (trainer.optimizers().size() != 1)
    throw ConfigError(fmt::format("SWA currently works with 1 `optimizer`; configure_optimizers returned {}",
                                  trainer.optimizers().size()));
  if (!trainer.lr_schedulers().empty())
    throw ConfigError(
        "StochasticWeightAveraging sets the learning rates with SWALR: configure_optimizers must return no scheduler "
        "(fulgor cannot swap a module's scheduler for SWALR at swa_epoch_start, as Lightning does)");
  max_epochs_ = trainer.max_epochs();
  if (const auto* share = std::get_if<double>(&options_.swa_epoch_start)) {
    if (max_epochs_ == -1)
      throw ConfigError(
          "SWA with `swa_epoch_start` as a float is not supported when `max_epochs=-1`. Please provide "
          "`swa_epoch_start` as an integer.");
    swa_epoch_start_ = static_cast<int64_t>(static_cast<double>(max_epochs_) * *share);
  } else {
    swa_epoch_start_ = std::get<int64_t>(options_.swa_epoch_start);
  }
  if (has_batch_norm(module) && !options_.bn_forward)
    throw ConfigError(
        "StochasticWeightAveraging: the module has batch-norm layers, whose statistics must be recomputed for the "
        "averaged weights: set bn_forward to a function running the module's forward over the training data");
}

void StochasticWeightAveraging::start_swa(Trainer& trainer) {
  auto& optimizer = *trainer.optimizers().front();
  scheduler_ =
      std::make_unique<SWALR>(optimizer, options_.swa_lrs, options_.annealing_epochs, options_.annealing_strategy);
  if (scheduler_state_) scheduler_->load_state_dict(*scheduler_state_);
}

// Lightning's update_parameters, on the parameters alone.
void StochasticWeightAveraging::update_average(const ModuleBase& module) {
  torch::NoGradGuard no_grad;
  const auto parameters = module.parameters();
  const AverageFunction average = swa_average();
  if (average_.empty())
    for (const auto& p : parameters)
      average_.push_back(torch::empty_like(p, p.options().device(options_.device.value_or(p.device()))));
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor value = parameters[i].detach().to(average_[i].device());
    average_[i].copy_(n_averaged_ == 0 ? value : average(average_[i], value, n_averaged_));
  }
  ++n_averaged_;
}

void StochasticWeightAveraging::transfer_average(ModuleBase& module) const {
  torch::NoGradGuard no_grad;
  const auto parameters = module.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) parameters[i].detach().copy_(average_[i]);
}

// A fit resumed in the middle of an averaging epoch does not start that epoch
// again (Note [Resuming mid-epoch] in src/loops/fit_loop.cpp): SWALR takes
// its state back now, after the optimizer's, and sets the epoch's rates.
void StochasticWeightAveraging::on_train_start(Trainer& trainer, ModuleBase&) {
  if (scheduler_state_ && !scheduler_ && in_swa(trainer.current_epoch())) start_swa(trainer);
}

void StochasticWeightAveraging::on_train_epoch_start(Trainer& trainer, ModuleBase& module) {
  const int64_t epoch = trainer.current_epoch();
  if (!in_swa(epoch)) return;
  if (!scheduler_) start_swa(trainer);
  if (epoch > latest_update_epoch_) {
    update_average(module);
    latest_update_epoch_ = epoch;
  }
}

// Lightning's SWALR is an epoch-interval scheduler of the Trainer's.
void StochasticWeightAveraging::on_train_epoch_end(Trainer&, ModuleBase&) {
  if (scheduler_) scheduler_->step();
}

void StochasticWeightAveraging::on_train_end(Trainer& trainer, ModuleBase& module) {
  if (average_.empty()) return;
  if (max_epochs_ != -1 && trainer.current_epoch() - 1 != max_epochs_ - 1) return;
  transfer_average(module);
  if (options_.bn_forward) update_bn(module, [&] { options_.bn_forward(module); });
}

nlohmann::json StochasticWeightAveraging::state_dict() const {
  nlohmann::json scheduler = scheduler_ ? scheduler_->state_dict() : nlohmann::json();
  return {{"n_averaged", n_averaged_}, {"latest_update_epoch", latest_update_epoch_}, {"scheduler_state", scheduler}};
}

void StochasticWeightAveraging::load_state_dict(const nlohmann::json& state) {
  n_averaged_ = state.at("n_averaged").get<int64_t>();
  latest_update_epoch_ = state.at("latest_update_epoch").get<int64_t>();
  const auto& scheduler = state.at("scheduler_state");
  if (!scheduler.is_null()) scheduler_state_ = scheduler;
}

bool StochasticWeightAveraging::save_tensors(Trainer&, ModuleBase&, torch::serialize::OutputArchive& archive) {
  if (average_.empty()) return false;
  // Copies: the average changes before the file is complete, at the next epoch's start.
  for (size_t i = 0; i < average_.size(); ++i) archive.write("average_" + std::to_string(i), average_[i].clone());
  return true;
}

void StochasticWeightAveraging::load_tensors(Trainer&, ModuleBase& module, torch::serialize::InputArchive& archive) {
  const auto parameters = module.parameters();
  average_.clear();
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::Tensor t;
    if (!archive.try_read("average_" + std::to_string(i), t) || t.sizes() != parameters[i].sizes())
      throw CheckpointError(fmt::format(
          "StochasticWeightAveraging: the checkpoint's averaged parameter {} is missing or has another shape", i));
    average_.push_back(t.to(options_.device.value_or(parameters[i].device())));
  }
}

}  // namespace fulgor

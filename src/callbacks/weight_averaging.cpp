#include "fulgor/callbacks/weight_averaging.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <utility>

#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"

namespace fulgor {

AverageFunction swa_average() {
  return [](const torch::Tensor& averaged, const torch::Tensor& current, int64_t n) {
    return averaged + (current - averaged) / static_cast<double>(n + 1);
  };
}

AverageFunction ema_average(double decay) {
  if (!(decay >= 0.0 && decay <= 1.0))
    throw ConfigError(fmt::format("ema_average: decay={}: expected a number in [0, 1]", decay));
  return [decay](const torch::Tensor& averaged, const torch::Tensor& current, int64_t) {
    return decay * averaged + (1 - decay) * current;
  };
}

AveragedModel::AveragedModel(const torch::nn::Module& module, AverageFunction average, bool use_buffers,
                             std::optional<torch::Device> device)
    : n_parameters_(module.parameters().size()),
      average_(average ? std::move(average) : swa_average()),
      use_buffers_(use_buffers) {
  torch::NoGradGuard no_grad;
  for (const auto& t : module_tensors(module, "AveragedModel"))
    tensors_.push_back(t.detach().clone().to(device ? *device : t.device()));
}

std::vector<torch::Tensor> AveragedModel::module_tensors(const torch::nn::Module& module, const char* what) const {
  std::vector<torch::Tensor> all = module.parameters();
  for (const auto& b : module.buffers()) all.push_back(b);
  if (tensors_.empty()) return all;
  if (all.size() != tensors_.size() || module.parameters().size() != n_parameters_)
    throw ConfigError(fmt::format("{}: the module has {} parameters and buffers; the averaged model has {}", what,
                                  all.size(), tensors_.size()));
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].sizes() != tensors_[i].sizes())
      throw ConfigError(fmt::format("{}: the module's tensor {} has shape [{}]; the averaged one has [{}]", what, i,
                                    fmt::join(all[i].sizes(), ", "), fmt::join(tensors_[i].sizes(), ", ")));
  return all;
}

void AveragedModel::update_parameters(const torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  const auto current = module_tensors(module, "AveragedModel::update_parameters");
  for (size_t i = 0; i < current.size(); ++i) {
    torch::Tensor& averaged = tensors_[i];
    const torch::Tensor value = current[i].detach().to(averaged.device());
    const bool averages = n_averaged_ > 0 && averaged.is_floating_point() && (i < n_parameters_ || use_buffers_);
    averaged.copy_(averages ? average_(averaged, value, n_averaged_) : value);
  }
  ++n_averaged_;
}

void AveragedModel::swap(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  const auto current = module_tensors(module, "AveragedModel::swap");
  for (size_t i = 0; i < current.size(); ++i) {
    torch::Tensor kept = current[i].detach().clone();
    current[i].detach().copy_(tensors_[i]);
    tensors_[i].copy_(kept);
  }
}

void AveragedModel::copy_to(torch::nn::Module& module) const {
  torch::NoGradGuard no_grad;
  const auto current = module_tensors(module, "AveragedModel::copy_to");
  for (size_t i = 0; i < current.size(); ++i) current[i].detach().copy_(tensors_[i]);
}

void AveragedModel::copy_from(const torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  const auto current = module_tensors(module, "AveragedModel::copy_from");
  for (size_t i = 0; i < current.size(); ++i) tensors_[i].copy_(current[i].detach());
}

WeightAveraging::WeightAveraging(WeightAveragingOptions options) : options_(std::move(options)) {}

bool WeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t>) {
  return step_idx.has_value();
}

void WeightAveraging::make_average(const ModuleBase& module) {
  average_.emplace(module, options_.average, options_.use_buffers, options_.device);
}

// Lightning makes its AveragedModel when fit sets up; fulgor's modules may
// make their layers in configure_model, after setup, so the copy waits for
// them: made from the restored weights (load_tensors) or at on_fit_start.
void WeightAveraging::setup(Trainer&, ModuleBase&, const std::string& stage) {
  fitting_ = stage == "fit";
  if (fitting_) average_.reset();
}

void WeightAveraging::on_fit_start(Trainer&, ModuleBase& module) {
  if (!average_) make_average(module);
}

void WeightAveraging::on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor&, int64_t) {
  // Lightning's step_idx: zero-based, the step just taken; a batch that
  // only accumulated gradients took none.
  const int64_t step = trainer.global_step();
  if (step > latest_update_step_ && should_update(step - 1, std::nullopt)) {
    average_->update_parameters(module);
    latest_update_step_ = step;
  }
}

void WeightAveraging::on_train_epoch_end(Trainer& trainer, ModuleBase& module) {
  const int64_t epoch = trainer.current_epoch();
  if (epoch > latest_update_epoch_ && should_update(std::nullopt, epoch)) {
    average_->update_parameters(module);
    latest_update_epoch_ = epoch;
  }
}

void WeightAveraging::on_train_end(Trainer&, ModuleBase& module) { average_->copy_to(module); }

// Only while fitting: a later validate() on weights loaded from a checkpoint
// must not swap in the average of an earlier fit.
void WeightAveraging::on_validation_epoch_start(Trainer&, ModuleBase& module) {
  if (fitting_ && average_) average_->swap(module);
}

void WeightAveraging::on_validation_epoch_end(Trainer&, ModuleBase& module) {
  if (fitting_ && average_) average_->swap(module);
}

nlohmann::json WeightAveraging::state_dict() const { return {{"latest_update_step", latest_update_step_}}; }

void WeightAveraging::load_state_dict(const nlohmann::json& state) {
  latest_update_step_ = state.at("latest_update_step").get<int64_t>();
}

void WeightAveraging::swap_checkpoint_weights(ModuleBase& module) {
  if (average_) average_->swap(module);
}

// Lightning's on_save_checkpoint: the module's own weights as
// "current_model_state", the averaging's state (its n_averaged) beside them;
// the averaged weights are the checkpoint's model (swap_checkpoint_weights).
namespace {
// Module::save's layout, of copies: an archive refers to the tensors written
// into it, and the module's are swapped with the average while the
// checkpoint is written.
void save_copy(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) archive.write(p.key(), p.value().detach().clone());
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    archive.write(b.key(), b.value().detach().clone(), /*is_buffer=*/true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive nested;
    save_copy(*child.value(), nested);
    archive.write(child.key(), nested);
  }
}
}  // namespace

bool WeightAveraging::save_tensors(Trainer&, ModuleBase& module, torch::serialize::OutputArchive& archive) {
  if (!average_) return false;
  torch::serialize::OutputArchive current;
  save_copy(module, current);
  archive.write("current_model_state", current);
  archive.write("n_averaged", torch::tensor(average_->n_averaged(), torch::kLong));
  return true;
}

// Lightning's on_load_checkpoint: the module was loaded from the checkpoint's
// model, the average; it takes its own weights back. Outside fit the module
// keeps the averaged weights, which is what testing or predicting from the
// checkpoint wants.
void WeightAveraging::load_tensors(Trainer&, ModuleBase& module, torch::serialize::InputArchive& archive) {
  if (!fitting_) return;
  torch::serialize::InputArchive current;
  torch::Tensor n_averaged;
  if (!archive.try_read("current_model_state", current) || !archive.try_read("n_averaged", n_averaged))
    throw CheckpointError("WeightAveraging: the checkpoint's tensors lack current_model_state or n_averaged");
  make_average(module);
  average_->set_n_averaged(n_averaged.item<int64_t>());
  detail::load_module_state(module, current, "WeightAveraging's current_model_state");
}

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options)
    : WeightAveraging({options.device, options.use_buffers, ema_average(options.decay)}), ema_(std::move(options)) {}

bool EMAWeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) {
  if (step_idx) {
    const bool started = !ema_.update_starting_at_step || *step_idx >= *ema_.update_starting_at_step;
    const bool due = ema_.update_every_n_steps > 0 && *step_idx % ema_.update_every_n_steps == 0;
    if (started && due) return true;
  }
  return epoch_idx && ema_.update_starting_at_epoch && *epoch_idx >= *ema_.update_starting_at_epoch;
}

}  // namespace fulgor

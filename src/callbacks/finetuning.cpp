#include "fulgor/callbacks/finetuning.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"

namespace fulgor {

namespace {

// torch's _BatchNorm: what LibTorch has of it.
torch::nn::BatchNormOptions* batch_norm_options(torch::nn::Module& m) {
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&m)) return &bn->options;
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&m)) return &bn->options;
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&m)) return &bn->options;
  return nullptr;
}

// Module::modules() includes the module itself only when a shared_ptr owns
// it, which a module the user made on the stack is not.
void collect_modules(torch::nn::Module& m, std::vector<torch::nn::Module*>& out) {
  out.push_back(&m);
  for (const auto& child : m.children()) collect_modules(*child, out);
}

bool same_tensor(const torch::Tensor& a, const torch::Tensor& b) {
  return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
}

}  // namespace

std::vector<torch::nn::Module*> BaseFinetuning::flatten_modules(torch::nn::Module& module) {
  std::vector<torch::nn::Module*> all, result;
  collect_modules(module, all);
  for (auto* m : all)
    if (m->children().empty() || !m->parameters(/*recurse=*/false).empty()) result.push_back(m);
  return result;
}

std::vector<torch::Tensor> BaseFinetuning::filter_params(torch::nn::Module& module, bool train_bn, bool requires_grad) {
  std::vector<torch::Tensor> params;
  for (auto* m : flatten_modules(module)) {
    if (batch_norm_options(*m) && !train_bn) continue;
    for (const auto& p : m->parameters(/*recurse=*/false))
      if (p.requires_grad() == requires_grad) params.push_back(p);
  }
  return params;
}

void BaseFinetuning::make_trainable(torch::nn::Module& module) {
  for (auto* m : flatten_modules(module)) {
    if (auto* bn = batch_norm_options(*m)) bn->track_running_stats(true);
    for (auto& p : m->parameters(/*recurse=*/false)) p.set_requires_grad(true);
  }
}

void BaseFinetuning::freeze_module(torch::nn::Module& module) {
  if (auto* bn = batch_norm_options(module)) bn->track_running_stats(false);
  for (auto& p : module.parameters(/*recurse=*/false)) p.set_requires_grad(false);
}

void BaseFinetuning::freeze(torch::nn::Module& module, bool train_bn) {
  for (auto* m : flatten_modules(module)) {
    if (batch_norm_options(*m) && train_bn)
      make_trainable(*m);
    else
      freeze_module(*m);
  }
}

std::vector<torch::Tensor> BaseFinetuning::filter_on_optimizer(const torch::optim::Optimizer& optimizer,
                                                               const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> left;
  for (const auto& p : params) {
    bool present = false;
    for (const auto& group : optimizer.param_groups())
      present = present || std::any_of(group.params().begin(), group.params().end(),
                                       [&](const torch::Tensor& q) { return same_tensor(p, q); });
    if (!present) left.push_back(p);
  }
  return left;
}

void BaseFinetuning::unfreeze_and_add_param_group(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                                  std::optional<double> lr, double initial_denom_lr, bool train_bn) {
  make_trainable(module);
  const double params_lr = lr ? *lr : optimizer.param_groups().at(0).options().get_lr();
  const double denom_lr = lr ? 1.0 : initial_denom_lr;
  const auto params = filter_on_optimizer(optimizer, filter_params(module, train_bn, true));
  if (params.empty()) return;
  auto options = optimizer.defaults().clone();
  options->set_lr(params_lr / denom_lr);
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(params, std::move(options)));
}

nlohmann::json BaseFinetuning::state_dict() const {
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [idx, g] : groups_) groups[std::to_string(idx)] = g;
  return {{"internal_optimizer_metadata", groups}};
}

void BaseFinetuning::load_state_dict(const nlohmann::json& state) {
  restarting_ = true;
  groups_.clear();
  for (const auto& [idx, g] : state.at("internal_optimizer_metadata").items()) groups_[std::stoul(idx)] = g;
}

void BaseFinetuning::setup(Trainer&, ModuleBase& module, const std::string&) { freeze_before_training(module); }

// Lightning's restore of the groups made in the previous fit: here the groups
// past those configure_optimizers made, their parameters found by name.
void BaseFinetuning::on_fit_start(Trainer& trainer, ModuleBase& module) {
  if (!restarting_) return;
  restarting_ = false;
  const auto named = module.named_parameters();
  const auto& optimizers = trainer.optimizers();
  for (const auto& [idx, groups] : groups_) {
    if (idx >= optimizers.size()) continue;
    auto& optimizer = *optimizers[idx];
    for (size_t g = optimizer.param_groups().size(); g < groups.size(); ++g) {
      std::vector<torch::Tensor> params;
      for (const auto& name : groups[g].at("params")) {
        const auto* p = named.find(name.get<std::string>());
        if (!p)
          throw CheckpointError(
              fmt::format("{}: the checkpoint's parameter group {} of optimizer {} names '{}', "
                          "which the module does not have",
                          state_key(), g, idx, name.get<std::string>()));
        p->set_requires_grad(true);
        params.push_back(*p);
      }
      auto options = optimizer.defaults().clone();
      options->set_lr(groups[g].at("lr").get<double>());
      optimizer.add_param_group(torch::optim::OptimizerParamGroup(params, std::move(options)));
    }
  }
}

void BaseFinetuning::on_train_epoch_start(Trainer& trainer, ModuleBase& module) {
  const auto& optimizers = trainer.optimizers();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const size_t before = optimizers[i]->param_groups().size();
    finetune_function(module, trainer.current_epoch(), *optimizers[i]);
    store(module, i, before, *optimizers[i]);
  }
}

// Lightning's _store: all groups the first time, then the groups added since.
void BaseFinetuning::store(const ModuleBase& module, size_t optimizer_idx, size_t groups_before,
                           const torch::optim::Optimizer& optimizer) {
  const auto named = module.named_parameters();
  auto describe = [&](const torch::optim::OptimizerParamGroup& group) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& p : group.params())
      for (const auto& item : named)
        if (same_tensor(item.value(), p)) names.push_back(item.key());
    return nlohmann::json{{"params", names}, {"lr", group.options().get_lr()}};
  };
  const auto& groups = optimizer.param_groups();
  auto it = groups_.find(optimizer_idx);
  if (it == groups_.end()) {
    auto& all = groups_[optimizer_idx] = nlohmann::json::array();
    for (const auto& g : groups) all.push_back(describe(g));
  } else {
    for (size_t g = groups_before; g < groups.size(); ++g) it->second.push_back(describe(groups[g]));
  }
}

BackboneFinetuning::BackboneFinetuning(BackboneFinetuningOptions options) : options_(std::move(options)) {
  if (!options_.lambda_func)
    throw ConfigError("BackboneFinetuning: lambda_func is empty; expected a function of the epoch");
}

namespace {
torch::nn::Module& backbone_of(ModuleBase& module) {
  for (const auto& child : module.named_children())
    if (child.key() == "backbone") return *child.value();
  throw ConfigError(
      "BackboneFinetuning: the module should have a child module named \"backbone\" (register_module(\"backbone\", "
      "...)); it has none");
}
}  // namespace

void BackboneFinetuning::freeze_before_training(ModuleBase& module) { freeze(backbone_of(module)); }

void BackboneFinetuning::finetune_function(ModuleBase& module, int64_t epoch, torch::optim::Optimizer& optimizer) {
  const double current_lr = optimizer.param_groups().at(0).options().get_lr();
  if (epoch == options_.unfreeze_backbone_at_epoch) {
    const double initial = options_.backbone_initial_lr.value_or(current_lr * options_.backbone_initial_ratio_lr);
    previous_backbone_lr_ = initial;
    unfreeze_and_add_param_group(backbone_of(module), optimizer, initial, options_.initial_denom_lr, options_.train_bn);
  } else if (epoch > options_.unfreeze_backbone_at_epoch && previous_backbone_lr_) {
    double next = options_.lambda_func(epoch + 1) * *previous_backbone_lr_;
    if (options_.should_align && next > current_lr) next = current_lr;
    optimizer.param_groups().back().options().set_lr(next);
    previous_backbone_lr_ = next;
  }
}

nlohmann::json BackboneFinetuning::state_dict() const {
  auto state = BaseFinetuning::state_dict();
  state["previous_backbone_lr"] = previous_backbone_lr_ ? nlohmann::json(*previous_backbone_lr_) : nlohmann::json();
  return state;
}

void BackboneFinetuning::load_state_dict(const nlohmann::json& state) {
  const auto& lr = state.at("previous_backbone_lr");
  previous_backbone_lr_ = lr.is_null() ? std::nullopt : std::optional<double>(lr.get<double>());
  BaseFinetuning::load_state_dict(state);
}

}  // namespace fulgor

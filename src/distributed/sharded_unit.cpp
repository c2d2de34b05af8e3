#include "fulgor/distributed/sharded_unit.h"

#include <torch/autograd.h>
#include <torch/custom_class.h>

#include "parameter_shards.h"

namespace fulgor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the autograd functions keep of the unit until backward.
struct UnitHandle : torch::CustomClassHolder {
  explicit UnitHandle(std::shared_ptr<detail::UnitSharding> unit) : unit(std::move(unit)) {}
  std::shared_ptr<detail::UnitSharding> unit;
};

void keep(AutogradContext* ctx, std::shared_ptr<detail::UnitSharding> unit) {
  ctx->saved_data["unit"] = c10::IValue::make_capsule(c10::make_intrusive<UnitHandle>(std::move(unit)));
}

detail::UnitSharding& unit_of(AutogradContext* ctx) {
  return *static_cast<UnitHandle*>(ctx->saved_data["unit"].toCapsule().get())->unit;
}

// An identity autograd function on a unit's tensors whose backward first
// tells the unit (Note [Fully sharded units]): on its inputs, autograd runs
// it once the unit's backward has given the inputs' gradients
// (backward_ends); on its outputs, before the unit's backward
// (backward_begins).
template <void (detail::UnitSharding::*Tell)()>
struct UnitStep : torch::autograd::Function<UnitStep<Tell>> {
  static variable_list forward(AutogradContext* ctx, std::shared_ptr<detail::UnitSharding> unit,
                               at::TensorList tensors) {
    keep(ctx, std::move(unit));
    return variable_list(tensors.begin(), tensors.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list gradients) {
    (unit_of(ctx).*Tell)();
    gradients.insert(gradients.begin(), torch::Tensor());  // for the unit argument
    return gradients;
  }
};
using AfterUnitBackward = UnitStep<&detail::UnitSharding::backward_ends>;
using BeforeUnitBackward = UnitStep<&detail::UnitSharding::backward_begins>;

// `tensors` with those that need a gradient replaced by `Step`'s outputs.
template <typename Step>
std::vector<torch::Tensor> route(const std::shared_ptr<detail::UnitSharding>& unit,
                                 std::vector<torch::Tensor> tensors) {
  if (!torch::GradMode::is_enabled()) return tensors;
  std::vector<torch::Tensor> routed;
  for (const auto& t : tensors)
    if (t.defined() && t.requires_grad()) routed.push_back(t);
  if (routed.empty()) return tensors;
  routed = Step::apply(unit, at::TensorList(routed));
  size_t next = 0;
  for (auto& t : tensors)
    if (t.defined() && t.requires_grad()) t = routed[next++];
  return tensors;
}

}  // namespace

// The unit holds the module's own parameters, buffers and submodules under
// their names, not the module under a name of its own: its parameters' names
// stay the unwrapped module's.
ShardedUnit::ShardedUnit(std::shared_ptr<torch::nn::Module> module)
    : torch::nn::Module("fulgor::Sharded<" + module->name() + ">"), module_(std::move(module)) {
  for (const auto& item : module_->named_parameters(/*recurse=*/false))
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  for (const auto& item : module_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : module_->named_children()) register_module(item.key(), item.value());
}

void ShardedUnit::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

void ShardedUnit::pretty_print(std::ostream& stream) const {
  stream << "fulgor::Sharded(";
  module_->pretty_print(stream);
  stream << ")";
}

std::vector<torch::Tensor> ShardedUnit::before_forward(std::vector<torch::Tensor> inputs) {
  sharding_->forward_begins();
  return route<AfterUnitBackward>(sharding_, std::move(inputs));
}

std::vector<torch::Tensor> ShardedUnit::after_forward(std::vector<torch::Tensor> outputs, bool routed) {
  outputs = route<BeforeUnitBackward>(sharding_, std::move(outputs));
  sharding_->forward_ends(routed);
  return outputs;
}

}  // namespace fulgor

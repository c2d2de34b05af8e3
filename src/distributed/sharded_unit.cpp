#include "fulgor/distributed/sharded_unit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <functional>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "fulgor/core/error.h"
#include "fulgor/detail/compat.h"

#include "distributed/parameter_shards.h"

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

// A forward pass as the unit runs it: the tensors it returns, from the
// tensors among its arguments.
using Run = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// What a forward pass depends on besides its inputs and parameters: the
// random generators' states and autocast's, on the CPU and on the device of
// the unit's tensors (where it has a generator, and autocast).
class PassState {
 public:
  // The state of the moment, for `tensors`' devices.
  explicit PassState(const std::vector<torch::Tensor>& tensors) {
    std::vector<c10::DeviceType> types{c10::DeviceType::CPU};
    generators_.push_back({at::detail::getDefaultCPUGenerator(), {}});
    for (const auto& t : tensors)
      if (t.defined() && !t.is_cpu()) {
        types.push_back(t.device().type());
        try {
          generators_.push_back({at::globalContext().defaultGenerator(t.device()), {}});
        } catch (const c10::Error&) {
          // no generator on that device: nothing random to replay there
        }
        break;
      }
    for (auto& [generator, state] : generators_) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state();
    }
    for (c10::DeviceType type : types)
      if (detail::compat::autocast_supported(type)) {
        const auto [enabled, dtype] = detail::compat::autocast_state(type);
        autocasts_.push_back({type, enabled, dtype});
      }
  }
  // The state of the moment, for the same generators and device types.
  PassState now() const {
    PassState now = *this;
    for (auto& [generator, state] : now.generators_) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state();
    }
    for (auto& autocast : now.autocasts_)
      std::tie(autocast.enabled, autocast.dtype) = detail::compat::autocast_state(autocast.type);
    return now;
  }
  void put_in_place() const {
    for (const auto& [generator, state] : generators_) {
      at::Generator g = generator;
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(state);
    }
    for (const auto& autocast : autocasts_)
      detail::compat::set_autocast(autocast.type, autocast.enabled, autocast.dtype);
  }

 private:
  struct Autocast {
    c10::DeviceType type;
    bool enabled;
    c10::ScalarType dtype;
  };
  std::vector<std::pair<at::Generator, torch::Tensor>> generators_;
  std::vector<Autocast> autocasts_;
};

// `state` in place for as long as it lives, within one level of autocast
// nesting (whose end clears autocast's cache of casted weights, as Python's
// autocast does); the state of the moment back after.
class InPlace {
 public:
  explicit InPlace(const PassState& state) : before_(state.now()) {
    state.put_in_place();
    detail::compat::autocast_enter();
  }
  ~InPlace() {
    detail::compat::autocast_exit();
    before_.put_in_place();
  }
  InPlace(const InPlace&) = delete;
  InPlace& operator=(const InPlace&) = delete;

 private:
  PassState before_;
};

// What a checkpointed forward keeps for backward besides its tensors.
struct Replay : torch::CustomClassHolder {
  Run again;
  size_t inputs = 0;  // the tensors after them are the unit's parameters
  std::optional<PassState> state;
};

// Note [Checkpointed units]
// PyTorch's checkpoint (torch/utils/checkpoint.py), in C++, as an autograd
// function whose inputs are the unit's tensor inputs and its parameters:
//   - forward runs the unit without keeping its activations (a custom
//     function's forward runs without grad mode), and keeps the inputs, the
//     parameters and what the pass depends on besides them (PassState:
//     preserve_rng_state, and the autocast state checkpoint records too);
//   - backward runs the unit again, under that state, with grad mode, on the
//     inputs detached, and differentiates its outputs for the inputs and the
//     parameters. The parameters' gradients are this function's gradients
//     for them, which autograd accumulates: so the first unit, whose inputs
//     need no gradient, has them too, and torch::autograd::grad works through
//     the unit (PyTorch's reentrant variant calls backward instead, and
//     needs an input that requires a gradient).
// Under FULL_SHARD the function sits between the unit's steps (Note [Fully
// sharded units]): BeforeUnitBackward gathers the parameters before this
// backward runs again, and AfterUnitBackward reduces their gradients after
// it (their accumulation runs first: it has the highest priority).
struct Recompute : torch::autograd::Function<Recompute> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Replay> replay, const Run* first,
                               at::TensorList tensors) {
    const std::vector<torch::Tensor> all(tensors.begin(), tensors.end());
    replay->state.emplace(all);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(all);
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    return (*first)(std::vector<torch::Tensor>(all.begin(), all.begin() + static_cast<ptrdiff_t>(replay->inputs)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list gradients);
};

variable_list Recompute::backward(AutogradContext* ctx, variable_list gradients) {
  auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
  const variable_list saved = ctx->get_saved_variables();
  std::vector<torch::Tensor> inputs(saved.begin(), saved.begin() + static_cast<ptrdiff_t>(replay->inputs));
  for (auto& t : inputs)
    if (t.defined()) t = t.detach().requires_grad_(t.requires_grad());
  std::vector<torch::Tensor> outputs;
  {
    const InPlace first_pass(*replay->state);
    torch::AutoGradMode grad_mode(true);
    outputs = replay->again(inputs);
  }
  std::vector<torch::Tensor> differentiated, given, wrt;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].defined() && outputs[i].requires_grad() && gradients[i].defined()) {
      differentiated.push_back(outputs[i]);
      given.push_back(gradients[i]);
    }
  std::vector<size_t> asked;  // the indices in `saved` of `wrt`
  for (size_t i = 0; i < saved.size(); ++i) {
    const torch::Tensor& t = i < inputs.size() ? inputs[i] : saved[i];
    if (t.defined() && t.requires_grad()) {
      wrt.push_back(t);
      asked.push_back(i);
    }
  }
  variable_list result(2 + saved.size());  // none for the replay and `first`
  if (differentiated.empty() || wrt.empty()) return result;
  const variable_list computed = torch::autograd::grad(differentiated, wrt, given, /*retain_graph=*/false,
                                                       /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t k = 0; k < asked.size(); ++k) result[2 + asked[k]] = computed[k];
  return result;
}

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
ShardedUnit::ShardedUnit(std::shared_ptr<torch::nn::Module> module, ShardedOptions options)
    : torch::nn::Module("fulgor::Sharded<" + module->name() + ">"), module_(std::move(module)), options_(options) {
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
  if (!sharding_) return inputs;
  sharding_->forward_begins();
  if (const auto dtype = sharding_->compute_dtype())  // Note [Sharded mixed precision]
    for (auto& t : inputs)
      if (t.defined() && t.is_floating_point()) t = t.to(*dtype);
  return route<AfterUnitBackward>(sharding_, std::move(inputs));
}

std::vector<torch::Tensor> ShardedUnit::after_forward(std::vector<torch::Tensor> outputs, bool routed) {
  if (!sharding_) return outputs;
  outputs = route<BeforeUnitBackward>(sharding_, std::move(outputs));
  sharding_->forward_ends(routed);
  return outputs;
}

bool ShardedUnit::checkpoints(bool replayable) const {
  if (!options_.checkpoint_activations || !torch::GradMode::is_enabled()) return false;
  if (!replayable)
    throw ConfigError(fmt::format(
        "{}: checkpoint_activations runs the forward again in backward, which needs arguments that can be copied "
        "(no non-const references) and a result of tensors (a tensor, a tuple or a vector of them)",
        name()));
  return true;
}

std::vector<torch::Tensor> ShardedUnit::checkpointed(const std::vector<torch::Tensor>& inputs, const Run& first,
                                                     Run again) {
  auto replay = c10::make_intrusive<Replay>();
  replay->again = std::move(again);
  replay->inputs = inputs.size();
  std::vector<torch::Tensor> tensors = inputs;
  for (const auto& p : parameters())
    if (p.requires_grad()) tensors.push_back(p);
  return Recompute::apply(replay, &first, at::TensorList(tensors));
}

}  // namespace fulgor

#include "fulgor/interop/optimizer_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "detail/demangle.h"
#include "fulgor/detail/compat.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/optim/step_kernels.h"

// Note [torch.optim state in LibTorch]
// torch.optim's SGD, Adam and AdamW and LibTorch's compute the same step
// (LibTorch's optim/*.cpp follow torch/optim/*.py's single-tensor path, the
// one torch.optim takes on the CPU): SGD's first momentum step copies the
// gradient, later ones scale by (1 - dampening); Adam's bias corrections are
// 1 - beta^step with the step counted before the update; AdamW decays the
// weights by lr * weight_decay first. What differs is how the state is kept:
// - torch.optim numbers the parameters 0, 1, ... across param_groups in
//   order; LibTorch keys its state by the parameter's TensorImpl.
// - torch.optim (1.12 and later) keeps Adam's `step` as a float32 scalar
//   tensor (an int before); LibTorch as an int64. A step count is exact in a
//   float up to 2^24, far beyond any run.
// - SGD without momentum keeps `momentum_buffer: None` in torch 1.13 and no
//   state from 2.x; LibTorch keeps none either way.
// - torch.optim's `maximize`, `capturable` and `differentiable` have no
//   LibTorch counterpart: only maximize changes the step, so only
//   maximize=True is refused. `foreach` and `fused` are fulgor::Adam's,
//   AdamW's and SGD's StepKernels: exported as they are set (None for
//   LibTorch's own optimizers), and not imported, since they choose how a
//   step is computed, not what it computes: an optimizer keeps its own.

namespace fulgor {
namespace {

using Dict = c10::impl::GenericDict;

enum class Kind { sgd, adam, adamw };

Kind kind_of(const torch::optim::Optimizer& optimizer, const std::string& source) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return Kind::sgd;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return Kind::adamw;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return Kind::adam;
  throw InteropError(fmt::format("{}: a {} cannot take torch.optim state; accepted: torch::optim::SGD, Adam, AdamW",
                                 source, detail::demangle(typeid(optimizer).name())));
}

c10::IValue entry(const Dict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  if (it == dict.end()) throw InteropError(fmt::format("{} has no \"{}\"", where, key));
  return it->value();
}

Dict dict_at(const Dict& dict, const std::string& key, const std::string& where) {
  c10::IValue value = entry(dict, key, where);
  if (!value.isGenericDict())
    throw InteropError(fmt::format("{}'s \"{}\" is a {}, not a dict", where, key, value.tagKind()));
  return value.toGenericDict();
}

double number(const Dict& dict, const std::string& key, const std::string& where) {
  c10::IValue value = entry(dict, key, where);
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  if (value.isBool()) return value.toBool() ? 1.0 : 0.0;
  if (value.isTensor() && value.toTensor().numel() == 1) return value.toTensor().item<double>();
  throw InteropError(fmt::format("{}'s \"{}\" is a {}, not a number", where, key, value.tagKind()));
}

bool flag(const Dict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  return it != dict.end() && !it->value().isNone() && number(dict, key, where) != 0.0;
}

std::pair<double, double> betas(const Dict& group, const std::string& where) {
  c10::IValue value = entry(group, "betas", where);
  std::vector<c10::IValue> items;
  if (value.isTuple()) items = value.toTupleRef().elements().vec();
  if (value.isList()) items = value.toListRef().vec();
  if (items.size() != 2 || !(items[0].isDouble() || items[0].isInt()) || !(items[1].isDouble() || items[1].isInt()))
    throw InteropError(fmt::format("{}'s \"betas\" is not a pair of numbers", where));
  return {items[0].toScalar().toDouble(), items[1].toScalar().toDouble()};
}

// The group's hyper-parameters as LibTorch options of the optimizer's kind.
std::unique_ptr<torch::optim::OptimizerOptions> group_options(Kind kind, const torch::optim::OptimizerOptions& current,
                                                              const Dict& group, const std::string& where) {
  if (flag(group, "maximize", where))
    throw InteropError(fmt::format("{} has maximize=True, which LibTorch's optimizers lack; accepted: False", where));
  if (kind == Kind::sgd) {
    auto options = std::make_unique<torch::optim::SGDOptions>(static_cast<const torch::optim::SGDOptions&>(current));
    options->lr(number(group, "lr", where)).momentum(number(group, "momentum", where));
    options->dampening(number(group, "dampening", where)).weight_decay(number(group, "weight_decay", where));
    options->nesterov(flag(group, "nesterov", where));
    return options;
  }
  if (kind == Kind::adam && flag(group, "decoupled_weight_decay", where))
    throw InteropError(fmt::format("{} has decoupled_weight_decay=True: AdamW's step; use torch::optim::AdamW", where));
  // A pair rather than a structured binding: C++17 lambdas cannot capture those (clang refuses them).
  const std::pair<double, double> beta = betas(group, where);
  auto set = [&](auto& options) {
    options.lr(number(group, "lr", where))
        .betas(std::make_tuple(beta.first, beta.second))
        .eps(number(group, "eps", where));
    options.weight_decay(number(group, "weight_decay", where)).amsgrad(flag(group, "amsgrad", where));
  };
  if (kind == Kind::adamw) {
    auto options =
        std::make_unique<torch::optim::AdamWOptions>(static_cast<const torch::optim::AdamWOptions&>(current));
    set(*options);
    return options;
  }
  auto options = std::make_unique<torch::optim::AdamOptions>(static_cast<const torch::optim::AdamOptions&>(current));
  set(*options);
  return options;
}

// A copy of the state's tensor `key`, shaped as `param` and on its device
// and dtype; undefined when the state holds None or, unless `required`,
// nothing.
torch::Tensor state_tensor(const Dict& state, const std::string& key, const torch::Tensor& param, bool required,
                           const std::string& where) {
  auto it = state.find(key);
  if (it == state.end() || it->value().isNone()) {
    if (required) throw InteropError(fmt::format("{} has no \"{}\"", where, key));
    return {};
  }
  if (!it->value().isTensor())
    throw InteropError(fmt::format("{}'s \"{}\" is a {}, not a tensor", where, key, it->value().tagKind()));
  const torch::Tensor& t = it->value().toTensor();
  if (t.sizes() != param.sizes())
    throw InteropError(fmt::format("{}'s \"{}\" has shape [{}], the parameter [{}]", where, key,
                                   fmt::join(t.sizes(), ", "), fmt::join(param.sizes(), ", ")));
  return t.detach().to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

std::unique_ptr<torch::optim::OptimizerParamState> param_state(Kind kind, const Dict& state, const torch::Tensor& param,
                                                               bool amsgrad, const std::string& where) {
  if (kind == Kind::sgd) {
    torch::Tensor buffer = state_tensor(state, "momentum_buffer", param, false, where);
    if (!buffer.defined()) return nullptr;
    auto out = std::make_unique<torch::optim::SGDParamState>();
    out->momentum_buffer(buffer);
    return out;
  }
  const double step = number(state, "step", where);
  if (!(step >= 0) || step != std::floor(step))
    throw InteropError(fmt::format("{}'s \"step\" is {}; accepted: a count of steps, 0 or more", where, step));
  auto fill = [&](auto& out) {
    out.step(static_cast<int64_t>(step));
    out.exp_avg(state_tensor(state, "exp_avg", param, true, where));
    out.exp_avg_sq(state_tensor(state, "exp_avg_sq", param, true, where));
    if (amsgrad) out.max_exp_avg_sq(state_tensor(state, "max_exp_avg_sq", param, true, where));
  };
  if (kind == Kind::adamw) {
    auto out = std::make_unique<torch::optim::AdamWParamState>();
    fill(*out);
    return out;
  }
  auto out = std::make_unique<torch::optim::AdamParamState>();
  fill(*out);
  return out;
}

bool amsgrad_of(const torch::optim::OptimizerOptions& options, Kind kind) {
  if (kind == Kind::adam) return static_cast<const torch::optim::AdamOptions&>(options).amsgrad();
  if (kind == Kind::adamw) return static_cast<const torch::optim::AdamWOptions&>(options).amsgrad();
  return false;
}

// What one param group becomes, built whole before anything is changed.
struct ImportedGroup {
  std::unique_ptr<torch::optim::OptimizerOptions> options;
  std::vector<std::pair<torch::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
};

ImportedGroup import_group(Kind kind, torch::optim::OptimizerParamGroup& into, const Dict& group, const Dict& states,
                           const std::string& where) {
  ImportedGroup out;
  out.options = group_options(kind, into.options(), group, where);
  c10::IValue ids = entry(group, "params", where);
  if (!ids.isList())
    throw InteropError(fmt::format("{}'s \"params\" is a {}, not a list of ids", where, ids.tagKind()));
  const auto& params = into.params();
  // A view of the list's elements, which `ids` keeps alive.
  const c10::ArrayRef<c10::IValue> id_list = ids.toListRef();
  if (id_list.size() != params.size())
    throw InteropError(
        fmt::format("{} has {} parameters, the optimizer's group {}", where, id_list.size(), params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::IValue& id = id_list[i];
    if (!id.isInt()) throw InteropError(fmt::format("{}'s parameter {} has id {}, not an int", where, i, id.tagKind()));
    auto it = states.find(id);
    // A distributed checkpoint keeps dict keys as strings ("0"), as Python's
    // DCP flattening does.
    if (it == states.end()) it = states.find(std::to_string(id.toInt()));
    std::unique_ptr<torch::optim::OptimizerParamState> state;
    if (it != states.end()) {
      if (!it->value().isGenericDict())
        throw InteropError(fmt::format("{}: the state of parameter {} is not a dict", where, id.toInt()));
      state = param_state(kind, it->value().toGenericDict(), params[i], amsgrad_of(*out.options, kind),
                          fmt::format("{}: the state of parameter {} (index {} of the group)", where, id.toInt(), i));
    }
    out.states.emplace_back(params[i], std::move(state));
  }
  return out;
}

}  // namespace

void import_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict,
                            const std::string& source) {
  const Kind kind = kind_of(optimizer, source);
  if (!state_dict.isGenericDict())
    throw InteropError(
        fmt::format("{}: the optimizer state is a {}, not torch.optim's state dict", source, state_dict.tagKind()));
  const Dict& dict = state_dict.toGenericDict();
  const Dict states = dict_at(dict, "state", source + ": the optimizer state");
  c10::IValue groups = entry(dict, "param_groups", source + ": the optimizer state");
  auto& into = optimizer.param_groups();
  const c10::ArrayRef<c10::IValue> group_list = groups.isList() ? groups.toListRef() : c10::ArrayRef<c10::IValue>();
  if (!groups.isList() || group_list.size() != into.size())
    throw InteropError(fmt::format("{}: the optimizer state has {} param_groups, the optimizer {}", source,
                                   group_list.size(), into.size()));
  std::vector<ImportedGroup> imported;
  for (size_t g = 0; g < into.size(); ++g) {
    const c10::IValue& group = group_list[g];
    const std::string where = fmt::format("{}: param_groups[{}]", source, g);
    if (!group.isGenericDict()) throw InteropError(fmt::format("{} is a {}, not a dict", where, group.tagKind()));
    imported.push_back(import_group(kind, into[g], group.toGenericDict(), states, where));
  }
  for (size_t g = 0; g < into.size(); ++g) {
    into[g].set_options(std::move(imported[g].options));
    for (auto& [param, state] : imported[g].states)
      detail::compat::set_optimizer_param_state(optimizer, param, std::move(state));
  }
}

std::vector<c10::IValue> optimizer_states_in(const c10::IValue& checkpoint) {
  if (!checkpoint.isGenericDict()) return {};
  const Dict& dict = checkpoint.toGenericDict();
  if (auto it = dict.find(std::string("optimizer_states")); it != dict.end() && it->value().isList())
    return it->value().toListRef().vec();
  if (auto it = dict.find(std::string("optimizer")); it != dict.end() && it->value().isGenericDict())
    return {it->value()};
  if (dict.contains(std::string("state")) && dict.contains(std::string("param_groups"))) return {checkpoint};
  return {};
}

namespace {

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// torch.optim's param_group: its hyper-parameters, then "params".
c10::impl::GenericDict exported_group(Kind kind, const torch::optim::OptimizerOptions& options,
                                      const StepKernels* kernels) {
  auto group = string_dict();
  if (kind == Kind::sgd) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
    group.insert("lr", o.lr());
    group.insert("momentum", o.momentum());
    group.insert("dampening", o.dampening());
    group.insert("weight_decay", o.weight_decay());
    group.insert("nesterov", o.nesterov());
  } else {
    auto fill = [&](const auto& o) {
      group.insert("lr", o.lr());
      group.insert("betas", c10::ivalue::Tuple::create(std::get<0>(o.betas()), std::get<1>(o.betas())));
      group.insert("eps", o.eps());
      group.insert("weight_decay", o.weight_decay());
      group.insert("amsgrad", o.amsgrad());
    };
    if (kind == Kind::adamw)
      fill(static_cast<const torch::optim::AdamWOptions&>(options));
    else
      fill(static_cast<const torch::optim::AdamOptions&>(options));
    group.insert("capturable", false);
  }
  // torch 1.13's SGD has no "fused"; its Adam and AdamW have, None by default.
  if (kind != Kind::sgd || (kernels && kernels->fused))
    group.insert("fused", kernels ? c10::IValue(kernels->fused) : c10::IValue());
  group.insert("maximize", false);
  group.insert("foreach", kernels && kernels->foreach ? c10::IValue(*kernels->foreach) : c10::IValue());
  group.insert("differentiable", false);
  return group;
}

torch::Tensor exported(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

// torch.optim's state of one parameter; empty where LibTorch keeps none.
c10::impl::GenericDict exported_state(Kind kind, const torch::optim::OptimizerParamState& state) {
  auto out = string_dict();
  if (kind == Kind::sgd) {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(state);
    if (s.momentum_buffer().defined()) out.insert("momentum_buffer", exported(s.momentum_buffer()));
    return out;
  }
  auto fill = [&](const auto& s) {
    out.insert("step", torch::tensor(static_cast<float>(s.step()), torch::kFloat32));
    out.insert("exp_avg", exported(s.exp_avg()));
    out.insert("exp_avg_sq", exported(s.exp_avg_sq()));
    if (s.max_exp_avg_sq().defined()) out.insert("max_exp_avg_sq", exported(s.max_exp_avg_sq()));
  };
  if (kind == Kind::adamw)
    fill(static_cast<const torch::optim::AdamWParamState&>(state));
  else
    fill(static_cast<const torch::optim::AdamParamState&>(state));
  return out;
}

}  // namespace

c10::IValue export_optimizer_state(const torch::optim::Optimizer& optimizer) {
  const Kind kind = kind_of(optimizer, "export_optimizer_state");
  c10::impl::GenericDict states(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t id = 0;
  for (const auto& group : optimizer.param_groups()) {
    auto exported_group_dict = exported_group(kind, group.options(), step_kernels_of(optimizer));
    c10::impl::GenericList ids(c10::AnyType::get());
    for (const torch::Tensor& param : group.params()) {
      if (const auto* state = detail::compat::optimizer_param_state(optimizer, param)) {
        auto dict = exported_state(kind, *state);
        if (!dict.empty()) states.insert(id, dict);
      }
      ids.push_back(id++);
    }
    exported_group_dict.insert("params", ids);
    groups.push_back(exported_group_dict);
  }
  auto out = string_dict();
  out.insert("state", states);
  out.insert("param_groups", groups);
  return out;
}

void import_optimizer_state(torch::optim::Optimizer& optimizer, const std::filesystem::path& path, size_t index) {
  const std::string source = "'" + path.string() + "'";
  std::vector<c10::IValue> states = optimizer_states_in(torch_load(path));
  if (index >= states.size())
    throw InteropError(
        fmt::format("{} holds {} optimizer states (Lightning's \"optimizer_states\", an \"optimizer\", "
                    "or torch.optim's state dict itself); asked for number {}",
                    source, states.size(), index));
  import_optimizer_state(optimizer, states[index], source);
}

}  // namespace fulgor

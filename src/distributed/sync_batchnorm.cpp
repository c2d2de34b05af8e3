#include "fulgor/distributed/sync_batchnorm.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/distributed/strategy.h"

namespace fulgor {
namespace {

// Note [SyncBatchNorm's arithmetic]
// PyTorch's SyncBatchNorm (torch/nn/modules/_functions.py) calls
// batch_norm_stats, batch_norm_gather_stats_with_counts and the
// batch_norm_backward kernels, which exist for CUDA only; the same formulas
// are written here with ordinary tensor operations, so that every accelerator
// (and gloo on the CPU) runs them. As PyTorch: each rank's (mean, biased
// variance, count) per channel are all-gathered, since the ranks' counts may
// differ, and combined with the counts as weights; the backward all-reduces
// the sums of dy and of dy * (x - mean), the only terms through which one
// rank's input moves another's output. Reduced-precision inputs are
// normalized in float32.

torch::ScalarType compute_type(const torch::Tensor& input) {
  return input.is_floating_point() && c10::elementSize(input.scalar_type()) >= 4 ? input.scalar_type() : torch::kFloat;
}

// The dimensions a BatchNorm reduces: all but the channels.
std::vector<int64_t> reduced_dims(const torch::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against an (N, C, ...) input.
torch::Tensor per_channel(const torch::Tensor& values, const torch::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = values.numel();
  return values.view(shape);
}

struct GlobalStats {
  torch::Tensor mean, var;  // the biased variance
  double count = 0;
};

GlobalStats global_stats(const torch::Tensor& input, ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  const int64_t channels = input.size(1);
  const torch::Tensor x = input.detach().to(compute_type(input));
  const int64_t count = channels > 0 ? x.numel() / channels : 0;
  // An empty batch still takes part in the collective, with a count of zero.
  torch::Tensor local = torch::zeros({2 * channels + 1}, x.options());
  if (count > 0) {
    const auto dims = reduced_dims(x);
    local = torch::cat({x.mean(dims), x.var(dims, /*unbiased=*/false), torch::full({1}, double(count), x.options())});
  }
  const torch::Tensor all = torch::stack(group.all_gather(local));
  const torch::Tensor means = all.narrow(1, 0, channels), vars = all.narrow(1, channels, channels);
  const torch::Tensor counts = all.narrow(1, 2 * channels, 1);
  GlobalStats stats;
  stats.count = counts.sum().item<double>();
  stats.mean = (means * counts).sum(0) / stats.count;
  stats.var = ((vars + (means - stats.mean).pow(2)) * counts).sum(0) / stats.count;
  return stats;
}

struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(ProcessGroup g) : group(std::move(g)) {}
  ProcessGroup group;
};

// Normalizes with statistics already made global; its backward reduces the
// gradient terms over the ranks (Note [SyncBatchNorm's arithmetic]).
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& mean,
                               const torch::Tensor& invstd, double count, ProcessGroup group) {
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
    const torch::Tensor x = input.to(mean.scalar_type());
    torch::Tensor y = (x - per_channel(mean, x)) * per_channel(invstd, x);
    if (weight.defined()) y = y * per_channel(weight.to(y.scalar_type()), y) + per_channel(bias.to(y.scalar_type()), y);
    return y.to(input.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    const torch::Tensor dy = grad_outputs[0].to(mean.scalar_type());
    const torch::Tensor xmu = input.to(mean.scalar_type()) - per_channel(mean, dy);
    const auto dims = reduced_dims(dy);
    torch::Tensor sum_dy = dy.sum(dims), sum_dy_xmu = (dy * xmu).sum(dims);
    torch::Tensor grad_input, grad_weight, grad_bias;
    // This rank's share: data-parallel training averages them.
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = sum_dy.numel();
      torch::Tensor sums = torch::cat({sum_dy, sum_dy_xmu});
      auto capsule = c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule());
      capsule->group.all_reduce(sums, ReduceOp::sum);
      const torch::Tensor mean_dy = sums.narrow(0, 0, channels) / count;
      const torch::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / count;
      const torch::Tensor scale = weight.defined() ? invstd * weight.to(invstd.scalar_type()) : invstd;
      grad_input =
          (dy - per_channel(mean_dy, dy) - xmu * per_channel(invstd.pow(2) * mean_dy_xmu, dy)) * per_channel(scale, dy);
      grad_input = grad_input.to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options) : NormImplBase(options) {}

void SyncBatchNormImpl::set_process_group(std::optional<ProcessGroup> group) { group_ = std::move(group); }

void SyncBatchNormImpl::_check_input_dim(const torch::Tensor& input) {
  if (input.dim() < 2)
    throw ConfigError(fmt::format("SyncBatchNorm expected at least 2D input (got {}D input)", input.dim()));
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  _check_input_dim(input);
  // BatchNorm's own bookkeeping (torch::nn::BatchNormImplBase::forward).
  double factor = options.momentum().has_value() ? *options.momentum() : 0.0;
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  std::optional<ProcessGroup> group =
      is_training() ? (group_ ? group_ : detail::default_process_group()) : std::nullopt;
  if (!group || group->size() < 2)
    return torch::batch_norm(input, weight, bias, running_mean, running_var,
                             is_training() || !options.track_running_stats(), factor, options.eps(),
                             at::globalContext().userEnabledCuDNN());

  const torch::Tensor x = input.contiguous();
  const GlobalStats stats = global_stats(x, *group);
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    const torch::Tensor unbiased = stats.var * (stats.count / (stats.count - 1));
    running_mean.mul_(1 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
    running_var.mul_(1 - factor).add_(unbiased.to(running_var.scalar_type()), factor);
  }
  const torch::Tensor invstd = (stats.var + options.eps()).rsqrt();
  // g++ 14 finds an out-of-bounds copy in the std::vector<bool> that
  // LibTorch's Function::apply reserves for the inputs: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
  return SyncBatchNormFunction::apply(x, weight, bias, stats.mean, invstd, stats.count, *group);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "fulgor::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum().has_value())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ")";
}

// Note [Replacing a submodule]
// Module::replace_module changes what a module's tree (parameters(),
// named_modules(), its state) holds, not a typed member of its class, which
// its forward calls; Sequential and ModuleDict call their own lists, which
// are changed too. So a BatchNorm may be replaced only when nothing else holds
// it: its use count is that of the tree's references to it.
struct SyncBatchNormConversion {
  using ModulePtr = std::shared_ptr<torch::nn::Module>;

  struct Replacement {
    torch::nn::Module* parent;
    std::string name;
    ModulePtr old_module, new_module;
  };

  std::optional<ProcessGroup> group;
  std::vector<Replacement> replacements;

  static std::string join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }

  // The references to a child besides its parent's registry: its own list in
  // a Sequential or ModuleDict, none in another module.
  static long container_references(torch::nn::Module& parent) {
    return dynamic_cast<torch::nn::SequentialImpl*>(&parent) || dynamic_cast<torch::nn::ModuleDictImpl*>(&parent) ? 1
                                                                                                                  : 0;
  }

  template <typename BatchNormImpl>
  static std::shared_ptr<SyncBatchNormImpl> sync_of(BatchNormImpl& bn) {
    auto sync = std::make_shared<SyncBatchNormImpl>(bn.options);
    torch::NoGradGuard no_grad;
    const std::pair<torch::Tensor*, const torch::Tensor*> state[] = {
        {&sync->weight, &bn.weight},
        {&sync->bias, &bn.bias},
        {&sync->running_mean, &bn.running_mean},
        {&sync->running_var, &bn.running_var},
        {&sync->num_batches_tracked, &bn.num_batches_tracked}};
    for (const auto& [to, from] : state)
      if (from->defined()) {
        to->set_data(from->detach().clone());
        if (to->is_floating_point()) to->set_requires_grad(from->requires_grad());
      }
    sync->train(bn.is_training());
    return sync;
  }

  // A SyncBatchNorm for `child` when it is a BatchNorm, else nullptr.
  static std::shared_ptr<SyncBatchNormImpl> sync_for(torch::nn::Module& child) {
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&child)) return sync_of(*bn);
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&child)) return sync_of(*bn);
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&child)) return sync_of(*bn);
    return nullptr;
  }

  void collect(torch::nn::Module& parent, const std::string& prefix) {
    // A copy of the registry: one more reference to each child while it lives.
    const auto children = parent.named_children();
    for (const auto& item : children) {
      const ModulePtr& child = item.value();
      const std::string path = join(prefix, item.key());
      std::shared_ptr<SyncBatchNormImpl> sync = sync_for(*child);
      if (!sync) {
        collect(*child, path);
        continue;
      }
      const bool in_list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent) != nullptr;
      if (in_list || child.use_count() > 2 + container_references(parent))
        throw ConfigError(fmt::format(
            "convert_sync_batchnorm cannot replace '{}' ({}): {}, which would go on calling the BatchNorm. Declare "
            "it as fulgor::SyncBatchNorm (a BatchNorm outside data-parallel training), or register it only as a "
            "child (register_module without keeping the holder), in a torch::nn::Sequential or a "
            "torch::nn::ModuleDict",
            path, child->name(),
            in_list ? "it is in a torch::nn::ModuleList, whose list cannot be changed in place"
                    : "it is held outside the module tree as well, e.g. by a typed member of its parent's class"));
      sync->group_ = group;
      sync->replaced_ = child;
      replacements.push_back({&parent, item.key(), child, sync});
    }
  }

  static void swap(torch::nn::Module& parent, const std::string& name, const ModulePtr& from, const ModulePtr& to) {
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
      for (auto& entry : *seq)
        if (entry.ptr() == from) entry = to_any(to);
      parent.replace_module(name, to);
    } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
      dict->update({{name, to}});
    } else {
      parent.replace_module(name, to);
    }
  }

  // A Sequential calls its modules through AnyModule, which needs the type.
  static torch::nn::AnyModule to_any(const ModulePtr& module) {
    if (auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(module)) return torch::nn::AnyModule(sync);
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) return torch::nn::AnyModule(bn);
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) return torch::nn::AnyModule(bn);
    return torch::nn::AnyModule(std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module));
  }

  // Gives `sync`'s state and mode back to the BatchNorm it replaced.
  static void restore(SyncBatchNormImpl& sync, torch::nn::Module& original) {
    torch::NoGradGuard no_grad;
    auto params = original.named_parameters(/*recurse=*/false);
    auto buffers = original.named_buffers(/*recurse=*/false);
    for (const auto& item : sync.named_parameters(/*recurse=*/false))
      if (item.value().defined()) params[item.key()].set_data(item.value().detach().clone());
    for (const auto& item : sync.named_buffers(/*recurse=*/false))
      if (item.value().defined()) buffers[item.key()].set_data(item.value().detach().clone());
    original.train(sync.is_training());
  }

  static size_t revert(torch::nn::Module& parent) {
    size_t count = 0;
    const auto children = parent.named_children();
    for (const auto& item : children) {
      auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(item.value());
      if (!sync || !sync->replaced_) {
        count += revert(*item.value());
        continue;
      }
      ModulePtr original = std::move(sync->replaced_);
      restore(*sync, *original);
      swap(parent, item.key(), item.value(), original);
      ++count;
    }
    return count;
  }
};

size_t convert_sync_batchnorm(torch::nn::Module& module, std::optional<ProcessGroup> group) {
  SyncBatchNormConversion conversion{std::move(group), {}};
  conversion.collect(module, "");
  for (const auto& r : conversion.replacements)
    SyncBatchNormConversion::swap(*r.parent, r.name, r.old_module, r.new_module);
  return conversion.replacements.size();
}

size_t revert_sync_batchnorm(torch::nn::Module& module) { return SyncBatchNormConversion::revert(module); }

}  // namespace fulgor

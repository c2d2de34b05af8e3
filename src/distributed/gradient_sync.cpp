#include "fulgor/distributed/gradient_sync.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "distributed/process_group_state.h"

namespace fulgor {
namespace {

// The first bucket is small so that the first all_reduce starts early, as in PyTorch's DDP.
constexpr int64_t kFirstBucketBytes = int64_t(1) << 20;

}  // namespace

// Named, not file-local: Impl, a member of a class with linkage, holds it.
namespace detail {

// Note [Parameters some rank did not reach]
// A pass may leave a parameter without a gradient on one rank (a branch it
// did not take; gradients are set to none before each pass) and give it one
// on another, possibly all zeros. As PyTorch's DDP does (the reducer's
// globally unused parameters), every rank then gives it the averaged
// gradient, zeros included: an optimizer steps a parameter with a gradient
// (by its momentum, say) and skips one without, so the ranks would part
// otherwise. Which ranks had a gradient travels in the bucket itself: after
// the parameters' gradients, one element per parameter, 1 where this rank
// has one, whose mean is nonzero exactly when some rank had one (the rule
// ParameterShards::reduce_bucket follows for the sharded strategies).
struct GradientBucket {
  std::vector<size_t> params;  // indices into Impl::params, in the order they are packed
  std::vector<int64_t> offsets;
  int64_t gradient_numel = 0;  // the gradients' elements; the flags follow
  torch::Tensor flat;
  size_t pending = 0;
  bool launched = false;
  c10::intrusive_ptr<c10d::Work> work;
};

}  // namespace detail

struct GradientSynchronizer::Impl {
  const ProcessGroup::State* state = nullptr;
  std::vector<torch::Tensor> params;
  std::vector<detail::GradientBucket> buckets;  // in launch order
  std::vector<size_t> bucket_of;
  std::vector<bool> ready;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;

  std::mutex mutex;        // hooks run on the autograd engine's threads
  std::string check_step;  // non-empty: the next synchronized step compares the gradients
  bool sync = true;
  bool in_step = false;  // a synchronized backward has produced gradients not yet finished
  size_t next_bucket = 0;
  int64_t reductions = 0;

  void make_buckets(int64_t cap);
  void hook(size_t index);
  bool rehook();
  void on_gradient(size_t index);
  void launch_ready_buckets(bool all);
  bool finish();
};

namespace {

// Runs after a parameter's gradient has been accumulated into its grad.
class AccumulateHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulateHook(std::function<void()> on_gradient) : on_gradient_(std::move(on_gradient)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    on_gradient_();
    return outputs;
  }

 private:
  std::function<void()> on_gradient_;
};

// The parameters that take gradients, with their names.
std::pair<std::vector<std::string>, std::vector<torch::Tensor>> trainable_parameters(const torch::nn::Module& module) {
  std::pair<std::vector<std::string>, std::vector<torch::Tensor>> result;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (p.value().defined() && p.value().requires_grad()) {
      result.first.push_back(p.key());
      result.second.push_back(p.value());
    }
  return result;
}

// The integers with the bits of a tensor's elements (Note [Ranks in step]).
torch::Tensor bit_patterns(torch::Tensor t) {
  if (t.is_complex()) t = torch::view_as_real(t);
  t = t.detach().contiguous().reshape({-1});
  switch (t.element_size()) {
    case 8:
      return t.view(torch::kInt64);
    case 4:
      return t.view(torch::kInt32);
    case 2:
      return t.view(torch::kInt16);
    default:
      return t.view(torch::kUInt8);
  }
}

// Two integers per tensor, its elements' bit patterns summed plainly and
// weighted by position, in chunks so that a large tensor needs little memory
// beside it; an undefined tensor counts as zeros.
torch::Tensor fingerprint(const std::vector<torch::Tensor>& tensors) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sums;
  for (const torch::Tensor& t : tensors) {
    torch::Tensor plain = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64).device(t.device()));
    torch::Tensor weighted = plain.clone();
    if (t.defined()) {
      const torch::Tensor bits = bit_patterns(t);
      for (int64_t start = 0; start < bits.numel(); start += kChunk) {
        const torch::Tensor chunk = bits.narrow(0, start, std::min(kChunk, bits.numel() - start)).to(torch::kInt64);
        plain += chunk.sum();
        weighted += (chunk * torch::arange(start + 1, start + 1 + chunk.numel(), chunk.options())).sum();
      }
    }
    sums.push_back(plain.cpu());
    sums.push_back(weighted.cpu());
  }
  return torch::cat(sums);
}

// Throws DistributedError when `tensors` are not bit-equal over the ranks.
void compare_over_ranks(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                        const std::vector<std::string>& names, const std::string& what, const std::string& hint) {
  const torch::Tensor local = fingerprint(tensors).to(group.device());
  torch::Tensor high = local.clone(), low = local.clone();
  group.all_reduce(high, ReduceOp::max);
  group.all_reduce(low, ReduceOp::min);
  const torch::Tensor differs = high.ne(low).view({-1, 2}).any(1).cpu();
  const int64_t count = differs.sum().item<int64_t>();
  if (count == 0) return;
  const int64_t first = differs.nonzero()[0][0].item<int64_t>();
  throw DistributedError(fmt::format("{} differ across the {} ranks ({} of {}, the first '{}'): {}", what, group.size(),
                                     count, tensors.size(), names.at(first), hint));
}

// Every rank must hold the same model, or the buckets would not line up.
void check_same_model(ProcessGroup& group, const std::vector<torch::Tensor>& params) {
  int64_t elements = 0;
  for (const torch::Tensor& p : params) elements += p.numel();
  const auto shape_of_model = [&] {
    return torch::tensor({static_cast<int64_t>(params.size()), elements},
                         torch::TensorOptions().dtype(torch::kInt64).device(group.device()));
  };
  torch::Tensor largest = shape_of_model(), smallest = shape_of_model();
  group.all_reduce(largest, ReduceOp::max);
  group.all_reduce(smallest, ReduceOp::min);
  if (!largest.equal(smallest))
    throw DistributedError(fmt::format(
        "the ranks' modules differ: rank {} has {} parameters with {} elements, while the ranks hold between {} and {} "
        "parameters and {} and {} elements; every rank must build the same model",
        group.rank(), params.size(), elements, smallest[0].item<int64_t>(), largest[0].item<int64_t>(),
        smallest[1].item<int64_t>(), largest[1].item<int64_t>()));
}

}  // namespace

void GradientSynchronizer::Impl::hook(size_t i) {
  std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(params[i]);
  if (!accumulator)
    throw ConfigError(fmt::format("parameter {} is not a leaf tensor, so its gradient cannot be synchronized", i));
  hook_keys[i] = accumulator->add_post_hook(std::make_unique<AccumulateHook>([this, i] { on_gradient(i); }));
  accumulators[i] = std::move(accumulator);
}

// Note [A parameter's storage replaced]: whether any hook had to move.
bool GradientSynchronizer::Impl::rehook() {
  bool moved = false;
  for (size_t i = 0; i < params.size(); ++i) {
    if (torch::autograd::impl::grad_accumulator(params[i]) == accumulators[i]) continue;
    accumulators[i]->del_post_hook(hook_keys[i]);
    hook(i);
    moved = true;
  }
  return moved;
}

void GradientSynchronizer::Impl::on_gradient(size_t index) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!sync) return;
  if (ready[index])
    throw ConfigError(
        fmt::format("parameter {} received a second gradient in one synchronized step: call "
                    "finish_backward() (or use backward()) after each backward pass",
                    index));
  ready[index] = true;
  in_step = true;
  --buckets[bucket_of[index]].pending;
  launch_ready_buckets(/*all=*/false);
}

void GradientSynchronizer::Impl::launch_ready_buckets(bool all) {
  torch::NoGradGuard no_grad;
  for (; next_bucket < buckets.size() && (all || buckets[next_bucket].pending == 0); ++next_bucket) {
    detail::GradientBucket& bucket = buckets[next_bucket];
    std::vector<double> has_gradient(bucket.params.size());
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const torch::Tensor& param = params[bucket.params[k]];
      torch::Tensor slice = bucket.flat.narrow(0, bucket.offsets[k], param.numel());
      const torch::Tensor& grad = param.grad();
      has_gradient[k] = grad.defined();
      if (grad.defined())
        slice.copy_(grad.reshape({-1}));
      else
        slice.zero_();
    }
    bucket.flat.narrow(0, bucket.gradient_numel, static_cast<int64_t>(has_gradient.size()))
        .copy_(torch::tensor(has_gradient, torch::kFloat64));
    bucket.flat.div_(state->size);
    std::vector<torch::Tensor> tensors{bucket.flat};
    c10d::AllreduceOptions options;
    options.timeout = state->timeout;
    bucket.work = state->group->allreduce(tensors, options);
    bucket.launched = true;
    ++reductions;
  }
}

// Whether the step was a synchronized one.
bool GradientSynchronizer::Impl::finish() {
  std::lock_guard<std::mutex> lock(mutex);
  if (sync && rehook()) in_step = true;
  if (!in_step) return sync;
  // Parameters that got no gradient in this pass still take part, as zeros,
  // so that every rank issues the same collectives.
  launch_ready_buckets(/*all=*/true);
  torch::NoGradGuard no_grad;
  for (detail::GradientBucket& bucket : buckets) {
    state->wait(bucket.work);
    torch::Tensor some_rank_had;  // Note [Parameters some rank did not reach]; read once, where needed
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      torch::Tensor& param = params[bucket.params[k]];
      torch::Tensor mean = bucket.flat.narrow(0, bucket.offsets[k], param.numel()).view(param.sizes());
      if (param.grad().defined()) {
        param.mutable_grad().copy_(mean);
        continue;
      }
      if (!some_rank_had.defined())
        some_rank_had =
            bucket.flat.narrow(0, bucket.gradient_numel, static_cast<int64_t>(bucket.params.size())).ne(0).cpu();
      if (some_rank_had[static_cast<int64_t>(k)].item<bool>()) param.mutable_grad() = mean.clone();
    }
    bucket.work.reset();
    bucket.launched = false;
    bucket.pending = bucket.params.size();
  }
  std::fill(ready.begin(), ready.end(), false);
  next_bucket = 0;
  in_step = false;
  return true;
}

// See Note [Gradient buckets].
void GradientSynchronizer::Impl::make_buckets(int64_t cap) {
  bucket_of.assign(params.size(), 0);
  int64_t bucket_bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const torch::Tensor& p = params[i];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t limit = buckets.size() == 1 ? std::min(kFirstBucketBytes, cap) : cap;
    const bool fits = !buckets.empty() && bucket_bytes + bytes <= limit;
    const torch::Tensor* first = buckets.empty() ? nullptr : &params[buckets.back().params.front()];
    if (!fits || first->scalar_type() != p.scalar_type() || first->device() != p.device()) {
      buckets.emplace_back();
      bucket_bytes = 0;
    }
    detail::GradientBucket& bucket = buckets.back();
    bucket.offsets.push_back(bucket_bytes / static_cast<int64_t>(p.element_size()));
    bucket.params.push_back(i);
    bucket_bytes += bytes;
    bucket_of[i] = buckets.size() - 1;
  }
  for (detail::GradientBucket& bucket : buckets) {
    const torch::Tensor& first = params[bucket.params.front()];
    for (size_t index : bucket.params) bucket.gradient_numel += params[index].numel();
    const auto flags = static_cast<int64_t>(bucket.params.size());
    bucket.flat = torch::empty({bucket.gradient_numel + flags}, first.options().requires_grad(false));
    bucket.pending = bucket.params.size();
  }
}

GradientSynchronizer::GradientSynchronizer(ProcessGroup group, torch::nn::Module& module, GradientSyncOptions options)
    : group_(std::move(group)), options_(options), module_(&module), impl_(std::make_unique<Impl>()) {
  if (options_.bucket_cap_mb <= 0)
    throw ConfigError(fmt::format("bucket_cap_mb {} is not accepted: it must be positive", options_.bucket_cap_mb));
  Impl& impl = *impl_;
  impl.state = &detail::ProcessGroupAccess::state(group_);
  impl.params = trainable_parameters(module).second;
  if (impl.params.empty())
    throw ConfigError("gradient synchronization is not accepted for a module without parameters that require grad");
  for (const torch::Tensor& b : module.buffers(/*recurse=*/true))
    if (b.defined()) buffers_.push_back(b);

  check_same_model(group_, impl.params);
  group_.broadcast_module(module);

  impl.make_buckets(static_cast<int64_t>(options_.bucket_cap_mb * (1 << 20)));
  impl.ready.assign(impl.params.size(), false);

  impl.accumulators.resize(impl.params.size());
  impl.hook_keys.resize(impl.params.size());
  for (size_t i = 0; i < impl.params.size(); ++i) impl.hook(i);
  impl.check_step = "set-up";
}

GradientSynchronizer::~GradientSynchronizer() {
  for (size_t i = 0; i < impl_->accumulators.size(); ++i) impl_->accumulators[i]->del_post_hook(impl_->hook_keys[i]);
  // A step left unfinished (an error between backward and finish_backward)
  // leaves its buckets' all_reduce running on the backend's threads. It is
  // waited for, or it would still run when the process exits and tear down
  // under it (std::terminate); its failure is no news then.
  for (detail::GradientBucket& bucket : impl_->buckets) {
    if (!bucket.work) continue;
    try {
      impl_->state->wait(bucket.work);
    } catch (const std::exception&) {
    }
  }
}

void GradientSynchronizer::before_forward() {
  if (sync() && options_.broadcast_buffers && !buffers_.empty()) group_.broadcast(buffers_);
}

void GradientSynchronizer::backward(const torch::Tensor& loss) {
  loss.backward();
  finish_backward();
}

void GradientSynchronizer::finish_backward() {
  bool synchronized = false;
  impl_->state->run("gradient all_reduce", [&] { synchronized = impl_->finish(); });
  if (!synchronized || impl_->check_step.empty()) return;
  // The module's parameters as they are now: one replaced since set-up got
  // no synchronized gradient, and its gradient differs.
  const auto [names, params] = trainable_parameters(*module_);
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) grads.push_back(p.grad());
  const std::string when = std::exchange(impl_->check_step, "");
  compare_over_ranks(group_, grads, names,
                     fmt::format("the averaged gradients of the first synchronized step after {}", when),
                     "their synchronization did not reach every parameter, and training on would take the ranks "
                     "apart");
}

void GradientSynchronizer::check_in_step(const std::string& when) {
  const auto [names, params] = trainable_parameters(*module_);
  compare_over_ranks(group_, params, names, fmt::format("the parameters after {}", when),
                     "every rank must hold the same model (load the same checkpoint on every rank)");
}

void GradientSynchronizer::check_next_step(const std::string& when) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->check_step = when;
}

bool GradientSynchronizer::pending() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->in_step;
}

bool GradientSynchronizer::sync() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->sync;
}

void GradientSynchronizer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sync = sync;
}

int64_t GradientSynchronizer::bucket_count() const { return static_cast<int64_t>(impl_->buckets.size()); }

int64_t GradientSynchronizer::reductions_started() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->reductions;
}

}  // namespace fulgor

#include "fulgor/distributed/gradient_sync.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>

#include "process_group_state.h"

namespace fulgor {
namespace {

// The first bucket is small so that the first all_reduce starts early, as in PyTorch's DDP.
constexpr int64_t kFirstBucketBytes = int64_t(1) << 20;

}  // namespace

// Named, not file-local: Impl, a member of a class with linkage, holds it.
namespace detail {

struct GradientBucket {
  std::vector<size_t> params;  // indices into Impl::params, in the order they are packed
  std::vector<int64_t> offsets;
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

  std::mutex mutex;  // hooks run on the autograd engine's threads
  bool sync = true;
  bool in_step = false;  // a synchronized backward has produced gradients not yet finished
  size_t next_bucket = 0;
  int64_t reductions = 0;

  void on_gradient(size_t index);
  void launch_ready_buckets(bool all);
  void finish();
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

}  // namespace

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
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const torch::Tensor& param = params[bucket.params[k]];
      torch::Tensor slice = bucket.flat.narrow(0, bucket.offsets[k], param.numel());
      const torch::Tensor& grad = param.grad();
      if (grad.defined())
        slice.copy_(grad.reshape({-1}));
      else
        slice.zero_();
    }
    bucket.flat.div_(state->size);
    std::vector<torch::Tensor> tensors{bucket.flat};
    c10d::AllreduceOptions options;
    options.timeout = state->timeout;
    bucket.work = state->group->allreduce(tensors, options);
    bucket.launched = true;
    ++reductions;
  }
}

void GradientSynchronizer::Impl::finish() {
  std::lock_guard<std::mutex> lock(mutex);
  if (!in_step) return;
  // Parameters that got no gradient in this pass still take part, as zeros,
  // so that every rank issues the same collectives.
  launch_ready_buckets(/*all=*/true);
  torch::NoGradGuard no_grad;
  for (detail::GradientBucket& bucket : buckets) {
    state->wait(bucket.work);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      torch::Tensor& param = params[bucket.params[k]];
      torch::Tensor mean = bucket.flat.narrow(0, bucket.offsets[k], param.numel()).view(param.sizes());
      if (param.grad().defined())
        param.mutable_grad().copy_(mean);
      else if (mean.ne(0).any().item<bool>())
        param.mutable_grad() = mean.clone();
    }
    bucket.work.reset();
    bucket.launched = false;
    bucket.pending = bucket.params.size();
  }
  std::fill(ready.begin(), ready.end(), false);
  next_bucket = 0;
  in_step = false;
}

GradientSynchronizer::GradientSynchronizer(ProcessGroup group, torch::nn::Module& module, GradientSyncOptions options)
    : group_(std::move(group)), options_(options), impl_(std::make_unique<Impl>()) {
  if (options_.bucket_cap_mb <= 0)
    throw ConfigError(fmt::format("bucket_cap_mb {} is not accepted: it must be positive", options_.bucket_cap_mb));
  Impl& impl = *impl_;
  impl.state = &detail::ProcessGroupAccess::state(group_);
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true))
    if (p.defined() && p.requires_grad()) impl.params.push_back(p);
  if (impl.params.empty())
    throw ConfigError("gradient synchronization is not accepted for a module without parameters that require grad");
  for (const torch::Tensor& b : module.buffers(/*recurse=*/true))
    if (b.defined()) buffers_.push_back(b);

  // Every rank must hold the same model, or the buckets would not line up.
  int64_t elements = 0;
  for (const torch::Tensor& p : impl.params) elements += p.numel();
  const auto shape_of_model = [&] {
    return torch::tensor({static_cast<int64_t>(impl.params.size()), elements},
                         torch::TensorOptions().dtype(torch::kInt64).device(group_.device()));
  };
  torch::Tensor largest = shape_of_model(), smallest = shape_of_model();
  group_.all_reduce(largest, ReduceOp::max);
  group_.all_reduce(smallest, ReduceOp::min);
  if (!largest.equal(smallest))
    throw DistributedError(fmt::format(
        "the ranks' modules differ: rank {} has {} parameters with {} elements, while the ranks hold between {} and {} "
        "parameters and {} and {} elements; every rank must build the same model",
        group_.rank(), impl.params.size(), elements, smallest[0].item<int64_t>(), largest[0].item<int64_t>(),
        smallest[1].item<int64_t>(), largest[1].item<int64_t>()));
  group_.broadcast_module(module);

  // See Note [Gradient buckets].
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb * (1 << 20));
  impl.bucket_of.assign(impl.params.size(), 0);
  int64_t bucket_bytes = 0;
  for (size_t i = impl.params.size(); i-- > 0;) {
    const torch::Tensor& p = impl.params[i];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t limit = impl.buckets.size() == 1 ? std::min(kFirstBucketBytes, cap) : cap;
    const bool fits = !impl.buckets.empty() && bucket_bytes + bytes <= limit;
    const torch::Tensor* first = impl.buckets.empty() ? nullptr : &impl.params[impl.buckets.back().params.front()];
    if (!fits || first->scalar_type() != p.scalar_type() || first->device() != p.device()) {
      impl.buckets.emplace_back();
      bucket_bytes = 0;
    }
    detail::GradientBucket& bucket = impl.buckets.back();
    bucket.offsets.push_back(bucket_bytes / static_cast<int64_t>(p.element_size()));
    bucket.params.push_back(i);
    bucket_bytes += bytes;
    impl.bucket_of[i] = impl.buckets.size() - 1;
  }
  for (detail::GradientBucket& bucket : impl.buckets) {
    const torch::Tensor& first = impl.params[bucket.params.front()];
    int64_t numel = 0;
    for (size_t index : bucket.params) numel += impl.params[index].numel();
    bucket.flat = torch::empty({numel}, first.options().requires_grad(false));
    bucket.pending = bucket.params.size();
  }
  impl.ready.assign(impl.params.size(), false);

  for (size_t i = 0; i < impl.params.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(impl.params[i]);
    if (!accumulator)
      throw ConfigError(fmt::format("parameter {} is not a leaf tensor, so its gradient cannot be synchronized", i));
    impl.hook_keys.push_back(accumulator->add_post_hook(
        std::make_unique<AccumulateHook>([state = impl_.get(), i] { state->on_gradient(i); })));
    impl.accumulators.push_back(std::move(accumulator));
  }
}

GradientSynchronizer::~GradientSynchronizer() {
  for (size_t i = 0; i < impl_->accumulators.size(); ++i) impl_->accumulators[i]->del_post_hook(impl_->hook_keys[i]);
}

void GradientSynchronizer::before_forward() {
  if (sync() && options_.broadcast_buffers && !buffers_.empty()) group_.broadcast(buffers_);
}

void GradientSynchronizer::backward(const torch::Tensor& loss) {
  loss.backward();
  finish_backward();
}

void GradientSynchronizer::finish_backward() {
  impl_->state->run("gradient all_reduce", [&] { impl_->finish(); });
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

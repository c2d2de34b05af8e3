#include "fulgor/metrics/metric.h"

#include <torch/torch.h>

#include <algorithm>

#include "fulgor/distributed/process_group.h"

namespace fulgor::metrics {

size_t Metric::add_state(torch::Tensor initial, Merge merge) {
  State s;
  s.initial = initial.to(device_);
  s.value = merge == Merge::sum ? s.initial.clone() : torch::Tensor();
  s.merge = merge;
  states_.push_back(std::move(s));
  return states_.size() - 1;
}

void Metric::append(size_t i, torch::Tensor values) { states_[i].parts.push_back(values.detach().reshape({-1})); }

void Metric::begin_update(const torch::Tensor& input) {
  if (input.device() != device_) to(input.device());
  ++update_count_;
}

void Metric::to(torch::Device device) {
  for (State& s : states_) {
    s.initial = s.initial.to(device);
    if (s.value.defined()) s.value = s.value.to(device);
    for (torch::Tensor& part : s.parts) part = part.to(device);
  }
  if (batch_value_.defined()) batch_value_ = batch_value_.to(device);
  device_ = device;
}

void Metric::reset() {
  for (State& s : states_) {
    if (s.merge == Merge::sum) s.value = s.initial.clone();
    s.parts.clear();
  }
  batch_value_ = torch::Tensor();
  update_count_ = 0;
}

std::vector<torch::Tensor> Metric::local_states() const {
  std::vector<torch::Tensor> result;
  for (const State& s : states_) {
    if (s.merge == Merge::sum) {
      result.push_back(s.value);
    } else {
      std::vector<torch::Tensor> parts = s.parts;
      parts.insert(parts.begin(), s.initial);  // gives the dtype when there are no parts
      result.push_back(torch::cat(parts));
    }
  }
  return result;
}

torch::Tensor Metric::compute() const {
  torch::NoGradGuard no_grad;
  return compute_from(local_states());
}

torch::Tensor Metric::compute(ProcessGroup& group) const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> states = local_states();
  for (size_t i = 0; i < states.size(); ++i) {
    // Collectives take tensors on the group's device; copies leave this
    // rank's own state as it is.
    torch::Tensor local = states[i].to(group.device()).clone();
    if (states_[i].merge == Merge::sum) {
      group.all_reduce(local, ReduceOp::sum);
      states[i] = local.to(device_);
      continue;
    }
    // Ranks hold lists of different lengths: gather the lengths, pad every
    // list to the longest, gather, and cut the padding off again (as
    // torchmetrics' gather_all_tensors).
    const auto lengths = group.all_gather(torch::full({1}, local.size(0), local.options().dtype(torch::kLong)));
    std::vector<int64_t> sizes;
    for (const torch::Tensor& n : lengths) sizes.push_back(n.item<int64_t>());
    const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
    if (longest == 0) continue;  // nothing anywhere: the empty list stands
    torch::Tensor padded = torch::zeros({longest}, local.options());
    padded.narrow(0, 0, local.size(0)).copy_(local);
    std::vector<torch::Tensor> gathered = group.all_gather(padded);
    for (size_t r = 0; r < gathered.size(); ++r) gathered[r] = gathered[r].narrow(0, 0, sizes[r]);
    states[i] = torch::cat(gathered).to(device_);
  }
  return compute_from(states);
}

torch::Tensor Metric::forward_with(const std::function<void()>& update) {
  std::vector<State> accumulated = states_;
  const int64_t count = update_count_;
  const torch::Tensor previous_value = batch_value_;
  reset();
  try {
    update();
  } catch (...) {
    // Inputs update() refused leave the metric as it was.
    states_ = std::move(accumulated);
    update_count_ = count;
    batch_value_ = previous_value;
    throw;
  }
  {
    torch::NoGradGuard no_grad;
    batch_value_ = compute_from(local_states());
  }
  // The batch's state joins what came before it, on the device update()
  // left the state on.
  for (size_t i = 0; i < states_.size(); ++i) {
    State& s = states_[i];
    const State& before = accumulated[i];
    if (s.merge == Merge::sum) {
      s.value.add_(before.value.to(device_));
    } else {
      std::vector<torch::Tensor> parts;
      for (const torch::Tensor& part : before.parts) parts.push_back(part.to(device_));
      parts.insert(parts.end(), s.parts.begin(), s.parts.end());
      s.parts = std::move(parts);
    }
  }
  update_count_ += count;
  return batch_value_;
}

}  // namespace fulgor::metrics

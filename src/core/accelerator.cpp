#include "fulgor/core/accelerator.h"

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "detail/tensor_moves.h"
#include "fulgor/core/error.h"

namespace fulgor {

std::vector<torch::Device> Accelerator::parse_devices(const Devices& devices) const {
  Availability a = availability();
  if (!a.available) throw DeviceError(fmt::format("accelerator '{}' is not available: {}", name(), a.reason));
  // "auto" is a count, as in Lightning, where the accelerator's
  // auto_device_count() stands in for it.
  const Devices selected = devices.is_auto() ? Devices(auto_device_count()) : devices;
  std::vector<torch::Device> result;
  for (int64_t index : parse_device_indices(selected, device_count(), name())) result.push_back(device(index));
  return result;
}

// LibTorch's CPU tensors are on `cpu`, never `cpu:0`: a CPU-backed
// accelerator's devices must compare equal to where its tensors are.
torch::Device Accelerator::device(int64_t index) const {
  if (device_type() == torch::kCPU) return torch::Device(torch::kCPU);
  return torch::Device(device_type(), static_cast<torch::DeviceIndex>(index));
}

void Accelerator::setup_device(const DeviceSetup&) {}

// Note [Moving parameters in place]
// Optimizers and user code hold the module's parameter tensors, so a move must
// change those tensors rather than replace them. torch::nn::Module::to does this
// with set_data, which refuses a destination whose TensorImpl type differs
// (PrivateUse1 devices, for example). Then the moved tensor's metadata and
// storage are copied into the existing TensorImpl with shallow_copy_from,
// which is what set_data itself does once its check passes; it is only safe for
// plain dense tensors on both sides, which is checked first.
void detail::move_in_place(const Accelerator& accelerator, const torch::Tensor& tensor, torch::Device device,
                           const std::string& what) {
  if (!tensor.defined() || tensor.device() == device) return;
  torch::NoGradGuard no_grad;
  torch::Tensor moved = accelerator.move_tensor(tensor, device, /*non_blocking=*/false);
  if (at::_has_compatible_shallow_copy_type(tensor, moved)) {
    tensor.set_data(moved);
    return;
  }
  auto plain = [](const torch::Tensor& t) {
    return t.layout() == torch::kStrided && !t.is_quantized() && !t.is_nested() && t.has_storage();
  };
  if (!plain(tensor) || !plain(moved))
    throw DeviceError(
        fmt::format("accelerator '{}' cannot move {} to {}: only dense strided tensors can be moved "
                    "in place to this device type",
                    accelerator.name(), what, device.str()));
  tensor.unsafeGetTensorImpl()->shallow_copy_from(moved.getIntrusivePtr());
}

// Note [Optimizer state on the device]
// A checkpoint's optimizer states are read onto the CPU, and an optimizer
// keeps its state in types of its own, which no interface walks. Loading
// makes those states hold the very tensors of the archive they were read
// from, so walking the archive and moving each of its tensors in place moves
// the optimizer's state, whatever the optimizer.
void detail::move_archive_tensors(torch::serialize::InputArchive& archive, const Accelerator& accelerator,
                                  torch::Device device, const std::string& where) {
  for (const auto& key : archive.keys()) {
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested)) {
      move_archive_tensors(nested, accelerator, device, where + "/" + key);
      continue;
    }
    c10::IValue value;
    if (!archive.try_read(key, value)) continue;
    if (value.isTensor()) {
      move_in_place(accelerator, value.toTensor(), device, where + "/" + key);
    } else if (value.isTensorList()) {
      for (const torch::Tensor& t : value.toTensorVector()) move_in_place(accelerator, t, device, where + "/" + key);
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toListRef())
        if (element.isTensor()) move_in_place(accelerator, element.toTensor(), device, where + "/" + key);
    }
  }
}

void Accelerator::move_module(torch::nn::Module& module, torch::Device device) const {
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    detail::move_in_place(*this, item.value(), device, "parameter " + item.key());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    detail::move_in_place(*this, item.value(), device, "buffer " + item.key());
}

torch::Tensor Accelerator::move_tensor(const torch::Tensor& tensor, torch::Device device, bool non_blocking) const {
  return tensor.to(device, non_blocking);
}

bool Accelerator::set_benchmark(bool) const { return false; }

void Accelerator::synchronize(torch::Device device) const {
  if (!c10::impl::hasDeviceGuardImpl(device.type())) return;
  const auto* guard = c10::impl::getDeviceGuardImpl(device.type());
  guard->synchronizeStream(guard->getStream(device));
}

std::vector<std::string> Accelerator::supported_precisions() const { return precisions_with({}); }

// The names are Precision's (src/precision/precision.cpp), spelled here because the
// accelerator is the layer below it; a test keeps the two in step.
std::vector<std::string> Accelerator::precisions_with(std::initializer_list<torch::ScalarType> reduced) {
  std::vector<std::string> prefixes;
  for (torch::ScalarType type : reduced) {
    if (type == torch::kHalf)
      prefixes.emplace_back("16");
    else if (type == torch::kBFloat16)
      prefixes.emplace_back("bf16");
    else
      throw ConfigError(fmt::format(
          "precisions_with: {} is not a reduced floating-point type; accepted: Half, BFloat16", c10::toString(type)));
  }
  std::vector<std::string> names = {"32-true", "64-true"};
  for (const auto& prefix : prefixes) names.push_back(prefix + "-mixed");
  for (const auto& prefix : prefixes) names.push_back(prefix + "-true");
  return names;
}

std::map<std::string, int64_t> Accelerator::memory_stats(torch::Device) const { return {}; }

bool Accelerator::is_out_of_memory(const std::exception& error) const {
  return dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr;
}

namespace {
// The device's default generator (a handle sharing it), or an undefined one
// where LibTorch has none for the device.
at::Generator default_generator(torch::Device device) {
  try {
    return at::globalContext().defaultGenerator(device);
  } catch (const c10::Error&) {
    return {};
  }
}
}  // namespace

void Accelerator::manual_seed(uint64_t seed) const {
  std::vector<torch::Device> seeded;
  const int64_t count = device_count();
  for (int64_t index = 0; index < count; ++index) {
    const torch::Device each = device(index);
    // A CPU-backed accelerator's devices are all the one CPU device.
    if (std::find(seeded.begin(), seeded.end(), each) != seeded.end()) continue;
    seeded.push_back(each);
    at::Generator generator = default_generator(each);
    if (!generator.defined()) continue;
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed);
  }
}

torch::Tensor Accelerator::get_rng_state(torch::Device device) const {
  at::Generator generator = default_generator(device);
  if (!generator.defined()) return {};
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void Accelerator::set_rng_state(torch::Device device, const torch::Tensor& state) const {
  if (!state.defined()) return;
  at::Generator generator = default_generator(device);
  if (!generator.defined())
    throw DeviceError(
        fmt::format("accelerator '{}' has no random generator on {} to restore a state into", name(), device.str()));
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace fulgor

#include "checkpoint/rng.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <string>

#include "checkpoint/loaded.h"
#include "fulgor/core/accelerator.h"

namespace fulgor::detail {

torch::Tensor cpu_rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

void restore_rng(LoadedCheckpoint& ckpt, const char* cpu_key, Accelerator& accelerator, const c10::Device& device) {
  torch::Tensor state;
  if (ckpt.archive->try_read(cpu_key, state)) set_cpu_rng_state(state);
  torch::Tensor device_state;
  // A device generator's state fits only the generator of the accelerator
  // that saved it: resuming elsewhere (saved on the CPU, resumed on an xpu)
  // leaves the device's generator as it is.
  const bool same_accelerator = ckpt.meta.value("accelerator", std::string()) == accelerator.name();
  if (std::string(cpu_key) == "rng_cpu" && same_accelerator && ckpt.archive->try_read("rng_device", device_state))
    accelerator.set_rng_state(device, device_state);
}

}  // namespace fulgor::detail

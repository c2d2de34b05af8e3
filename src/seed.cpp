#include "fulgor/seed.h"

#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <mutex>
#include <string>

#include "fulgor/registry.h"

namespace fulgor {
namespace {

void seed_cpu_generator(uint64_t seed) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

}  // namespace

uint64_t seed_everything(uint64_t seed) {
  seed_cpu_generator(seed);
  auto& registry = AcceleratorRegistry::instance();
  for (const std::string& name : registry.names()) {
    const std::unique_ptr<Accelerator> accelerator = registry.create(name);
    if (accelerator->is_available()) accelerator->manual_seed(seed);
  }
  return seed;
}

void seed_accelerator(const Accelerator& accelerator, uint64_t seed) {
  seed_cpu_generator(seed);
  accelerator.manual_seed(seed);
}

}  // namespace fulgor

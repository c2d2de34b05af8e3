#include "fulgor/config/seed.h"

#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

void seed_cpu_generator(uint64_t seed) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

// The seed seed_everything last set, once global_seed_set_.
std::atomic<uint64_t> global_seed_{0};
std::atomic<bool> global_seed_set_{false};

}  // namespace

std::optional<uint64_t> global_seed() {
  if (!global_seed_set_.load()) return std::nullopt;
  return global_seed_.load();
}

void check_seed(uint64_t seed, const char* what) {
  if (seed > kMaxSeed)
    throw ConfigError(fmt::format("{}={}: out of range; expected a seed from 0 to {} (2^32 - 1), as Lightning's", what,
                                  seed, kMaxSeed));
}

uint64_t seed_everything(uint64_t seed) {
  check_seed(seed, "seed_everything");
  global_seed_.store(seed);
  global_seed_set_.store(true);
  seed_cpu_generator(seed);
  auto& registry = AcceleratorRegistry::instance();
  for (const std::string& name : registry.names()) {
    const std::unique_ptr<Accelerator> accelerator = registry.create(name);
    if (accelerator->is_available()) accelerator->manual_seed(seed);
  }
  return seed;
}

void seed_accelerator(const Accelerator& accelerator, uint64_t seed) {
  check_seed(seed, "seed");
  seed_cpu_generator(seed);
  accelerator.manual_seed(seed);
}

}  // namespace fulgor

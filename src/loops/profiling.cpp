#include "loops/profiling.h"

#include <fmt/format.h>

namespace fulgor::detail {

namespace {

// Lightning names the module by its class's own name, without its module
// path: "fulgor::examples::Net" is "Net".
std::string class_name(const std::string& qualified) {
  const auto template_start = qualified.find('<');
  const auto last_scope = qualified.rfind("::", template_start);
  return last_scope == std::string::npos ? qualified : qualified.substr(last_scope + 2);
}

// Distinct addresses standing for the two strategies in the cache's keys.
const char kStrategies[2] = {};

}  // namespace

SimpleProfiler::Action& Profiling::callback_hook(const Callback& cb, const char* hook) {
  return cached(&cb, hook, [&] { return fmt::format("[Callback]{}.{}", cb.state_key(), hook); });
}

SimpleProfiler::Action& Profiling::module_hook(const ModuleBase& module, const char* hook) {
  return cached(&module, hook, [&] { return fmt::format("[LightningModule]{}.{}", class_name(module.name()), hook); });
}

SimpleProfiler::Action& Profiling::strategy_hook(bool ddp, const char* hook) {
  return cached(&kStrategies[ddp ? 1 : 0], hook,
                [&] { return fmt::format("[Strategy]{}.{}", ddp ? "DDPStrategy" : "SingleDeviceStrategy", hook); });
}

SimpleProfiler::Action& Profiling::stage(const char* name) {
  return cached(nullptr, name, [&] { return std::string(name); });
}

}  // namespace fulgor::detail

#include "fulgor/core/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "fulgor/core/error.h"
#include "core/registry_access.h"

namespace fulgor {
namespace {

std::string known_names(const std::vector<std::string>& names) {
  return fmt::format("{} (or \"auto\", \"gpu\")", fmt::join(names, ", "));
}

// Highest priority first; the name breaks ties so the order is stable.
template <typename Entries>
void sort_by_priority(Entries& entries) {
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.name < b.name;
  });
}

}  // namespace

AcceleratorRegistry& AcceleratorRegistry::storage() {
  // Never destroyed: accelerators may be looked up from other static destructors.
  static auto* registry = new AcceleratorRegistry();
  return *registry;
}

AcceleratorRegistry& AcceleratorRegistry::instance() {
  detail::load_plugins_from_environment();
  detail::throw_load_time_errors();
  return storage();
}

void AcceleratorRegistry::add(const std::string& name, AcceleratorFactory factory, RegisterOptions options) {
  if (name.empty() || name == "auto" || name == "gpu")
    throw RegistryError(
        fmt::format("cannot register an accelerator named '{}': the name must be non-empty and "
                    "neither \"auto\" nor \"gpu\"",
                    name));
  if (!factory) throw RegistryError(fmt::format("cannot register accelerator '{}' without a factory", name));
  std::vector<Entry> one;
  one.push_back(make_entry(name, std::move(factory), std::move(options)));
  std::string clash = add_all(std::move(one));
  if (!clash.empty()) throw RegistryError(clash + "; pass override to replace it");
}

AcceleratorRegistry::Entry AcceleratorRegistry::make_entry(const std::string& name, AcceleratorFactory factory,
                                                           RegisterOptions options) {
  Entry entry;
  entry.name = name;
  entry.factory = std::move(factory);
  entry.options = std::move(options);
  const std::unique_ptr<Accelerator> probe = instantiate(entry);
  entry.priority = probe->priority();
  entry.description = probe->description();
  return entry;
}

std::unique_ptr<Accelerator> AcceleratorRegistry::instantiate(const Entry& entry) {
  std::unique_ptr<Accelerator> accelerator = entry.factory();
  if (!accelerator) throw RegistryError(fmt::format("the factory of accelerator '{}' made no accelerator", entry.name));
  accelerator->name_ = entry.name;
  return accelerator;
}

std::string AcceleratorRegistry::add_all(std::vector<Entry> entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries) {
    if (entry.options.override) continue;
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == entry.name; });
    if (it != entries_.end())
      return fmt::format("accelerator '{}' is already registered (by {})", entry.name,
                         it->options.origin.empty() ? "an earlier registration" : it->options.origin);
  }
  for (Entry& entry : entries) {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == entry.name; });
    if (it != entries_.end())
      *it = std::move(entry);
    else
      entries_.push_back(std::move(entry));
  }
  return {};
}

bool AcceleratorRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

bool AcceleratorRegistry::contains(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
}

std::vector<std::string> AcceleratorRegistry::names() const {
  std::vector<std::string> result;
  for (const Entry& e : snapshot()) result.push_back(e.name);
  std::sort(result.begin(), result.end());
  return result;
}

std::vector<AcceleratorRegistry::Entry> AcceleratorRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

std::string AcceleratorRegistry::resolve(const std::string& name) const {
  // Factories run outside the lock: an accelerator's constructor or
  // availability check may load a runtime that registers accelerators.
  std::vector<Entry> entries = snapshot();
  if (name != "auto" && name != "gpu") {
    if (std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.name == name; })) return name;
    throw RegistryError(fmt::format("unknown accelerator '{}'; registered: {}", name, known_names(names())));
  }
  sort_by_priority(entries);
  std::vector<std::string> unavailable, cpu_backed;
  for (const Entry& entry : entries) {
    std::unique_ptr<Accelerator> accelerator = instantiate(entry);
    if (name == "gpu" && accelerator->device_type() == torch::kCPU) {
      cpu_backed.push_back(entry.name);
      continue;
    }
    Availability availability = accelerator->availability();
    if (availability.available) return entry.name;
    unavailable.push_back(fmt::format("{}: {}", entry.name, availability.reason));
  }
  // "gpu" passes over the accelerators whose tensors live on the CPU (a
  // simulator plugin too), which the message names so that none seems lost.
  if (!cpu_backed.empty())
    unavailable.push_back(fmt::format("skipped, as their device type is the CPU: {}", fmt::join(cpu_backed, ", ")));
  throw RegistryError(fmt::format("accelerator '{}' found no available {}accelerator{}{}", name,
                                  name == "gpu" ? "non-CPU " : "", unavailable.empty() ? "" : "; ",
                                  fmt::join(unavailable, "; ")));
}

std::unique_ptr<Accelerator> AcceleratorRegistry::create(const std::string& name) const {
  const std::string resolved = resolve(name);
  for (const Entry& entry : snapshot())
    if (entry.name == resolved) return instantiate(entry);
  throw RegistryError(fmt::format("accelerator '{}' was removed while it was being created", resolved));
}

std::vector<AcceleratorInfo> AcceleratorRegistry::describe() const {
  std::vector<Entry> entries = snapshot();
  sort_by_priority(entries);
  std::vector<AcceleratorInfo> result;
  for (const Entry& entry : entries) {
    std::unique_ptr<Accelerator> accelerator = instantiate(entry);
    Availability availability = accelerator->availability();
    AcceleratorInfo info;
    info.name = entry.name;
    info.description = entry.description;
    info.priority = entry.priority;
    info.origin = entry.options.origin;
    info.available = availability.available;
    info.reason = availability.reason;
    info.device_count = availability.available ? accelerator->device_count() : 0;
    info.distributed_backend = accelerator->distributed_backend();
    result.push_back(std::move(info));
  }
  return result;
}

AcceleratorInfo AcceleratorRegistry::describe(const std::string& name) const {
  const std::string resolved = resolve(name);
  for (AcceleratorInfo& info : describe())
    if (info.name == resolved) return info;
  throw RegistryError(fmt::format("accelerator '{}' was removed while it was being described", resolved));
}

std::unique_ptr<Accelerator> make_accelerator(const std::string& name) {
  return AcceleratorRegistry::instance().create(name);
}

}  // namespace fulgor

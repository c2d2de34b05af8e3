#pragma once

// Internals shared by the registry and the plugin loader.

#include <string>
#include <vector>

#include "fulgor/core/registry.h"

namespace fulgor::detail {

struct RegistryAccess {
  using Entry = AcceleratorRegistry::Entry;
  static Entry make_entry(const std::string& name, AcceleratorFactory factory, RegisterOptions options) {
    return AcceleratorRegistry::make_entry(name, std::move(factory), std::move(options));
  }
  static std::string add_all(std::vector<Entry> entries) {
    return AcceleratorRegistry::storage().add_all(std::move(entries));
  }
};

/// Loads the libraries FULGOR_ACCELERATOR_PLUGINS lists, once they all succeed.
void load_plugins_from_environment();

/// Throws RegistryError when a library registered badly outside the plugin
/// loader (a duplicate name, another plugin ABI), where nothing could be thrown.
void throw_load_time_errors();

}  // namespace fulgor::detail

#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/export.h"
#include "fulgor/core/version.h"

namespace fulgor {
namespace detail {
struct RegistryAccess;
}

using AcceleratorFactory = std::function<std::unique_ptr<Accelerator>()>;

/// How an accelerator is registered. Its priority and description are the
/// class's own (Accelerator::priority, Accelerator::description).
struct RegisterOptions {
  bool override = false;  ///< replace an accelerator already registered under the name
  std::string origin;     ///< where it came from (a library path); filled in when empty
};

/// What the registry knows and can find out about one accelerator.
struct AcceleratorInfo {
  std::string name;
  std::string description;
  int priority = 0;
  std::string origin;
  bool available = false;
  std::string reason;  ///< why it is unavailable; empty when available
  int64_t device_count = 0;
  std::string distributed_backend;
};

/// The process-wide table of accelerators by name.
///
/// There is exactly one per process, inside libfulgor, however many shared
/// libraries register into it. Every method is thread-safe. Built-in
/// accelerators and plugins register at load time with REGISTER_ACCELERATOR;
/// the libraries listed in FULGOR_ACCELERATOR_PLUGINS (separated by ':') are
/// loaded the first time instance() is called.
///
/// Two names select rather than name an accelerator:
///   "auto"  the available accelerator of highest priority (built-ins:
///           cuda 400 > xpu 300 > npu 200 > cpu 0; plugins give their own)
///   "gpu"   the available accelerator of highest priority whose device type
///           is not the CPU
class FULGOR_API AcceleratorRegistry {
 public:
  /// The registry, after loading the plugins FULGOR_ACCELERATOR_PLUGINS names.
  /// Throws PluginError when one of them fails to load.
  static AcceleratorRegistry& instance();

  /// Registers `factory` under `name`; it is called once now to read the
  /// accelerator's priority and description. Throws RegistryError when the
  /// name is taken and options.override is false, naming where the earlier
  /// one came from.
  void add(const std::string& name, AcceleratorFactory factory, RegisterOptions options = {});
  /// Removes `name`; returns whether it was registered.
  bool remove(const std::string& name);
  bool contains(const std::string& name) const;
  /// Registered names, sorted.
  std::vector<std::string> names() const;

  /// The registered name `name` stands for: itself, or the choice "auto" and
  /// "gpu" make. Throws RegistryError for unknown names, listing the known ones.
  std::string resolve(const std::string& name) const;
  /// A fresh instance of the accelerator `name` (or "auto", "gpu") stands
  /// for, whose name() is the registered name.
  std::unique_ptr<Accelerator> create(const std::string& name) const;

  /// Every registered accelerator, highest priority first, availability included.
  std::vector<AcceleratorInfo> describe() const;
  AcceleratorInfo describe(const std::string& name) const;

  AcceleratorRegistry(const AcceleratorRegistry&) = delete;
  AcceleratorRegistry& operator=(const AcceleratorRegistry&) = delete;

 private:
  AcceleratorRegistry() = default;
  friend struct detail::RegistryAccess;

  struct Entry {
    std::string name;
    AcceleratorFactory factory;
    RegisterOptions options;
    int priority = 0;  // read from the class when registered
    std::string description;
  };
  // An entry for `factory`, with the priority and description of the
  // accelerator it makes. Throws RegistryError when it makes none.
  static Entry make_entry(const std::string& name, AcceleratorFactory factory, RegisterOptions options);
  // A fresh instance of `entry`'s accelerator, named.
  static std::unique_ptr<Accelerator> instantiate(const Entry& entry);
  // The registry without the plugin loading instance() does first.
  static AcceleratorRegistry& storage();
  // Adds all or, when a name is taken, none; returns the taken name's message.
  std::string add_all(std::vector<Entry> entries);
  std::vector<Entry> snapshot() const;

  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

/// Shorthand for AcceleratorRegistry::instance().create(name).
FULGOR_API std::unique_ptr<Accelerator> make_accelerator(const std::string& name);

/// Loads an accelerator plugin: a shared library that registers accelerators
/// with REGISTER_ACCELERATOR. Returns the names it registered. Loading the same
/// library again returns the same names. Throws PluginError naming the file when
/// it is missing, is not a loadable shared library, was built for another plugin
/// ABI version, registers nothing, or registers a name already taken; then
/// nothing it registered is kept.
FULGOR_API std::vector<std::string> load_accelerator_plugin(const std::string& path);

// What the macros and templates of public headers call inside the library:
// exported, unlike detail (Note [Exported symbols] in fulgor/core/export.h).
namespace impl {

using AcceleratorCreator = std::unique_ptr<Accelerator> (*)();

// Called by REGISTER_ACCELERATOR during static initialisation. `abi_version`
// is the plugin ABI the caller was compiled with and is checked before
// anything else is used. Never throws: problems surface when the plugin loader
// or the first registry lookup reports them.
FULGOR_API void register_accelerator_at_load(int abi_version, const char* name, AcceleratorCreator creator) noexcept;

struct AcceleratorRegistration {
  AcceleratorRegistration(int abi_version, const char* name, AcceleratorCreator creator) noexcept {
    register_accelerator_at_load(abi_version, name, creator);
  }
};

}  // namespace impl
}  // namespace fulgor

#define FULGOR_DETAIL_CONCAT_(a, b) a##b
#define FULGOR_DETAIL_CONCAT(a, b) FULGOR_DETAIL_CONCAT_(a, b)

// Registers with an explicit ABI version; REGISTER_ACCELERATOR is what code uses.
#define FULGOR_DETAIL_REGISTER_ACCELERATOR(abi_version, name, Class)                                                   \
  static const ::fulgor::impl::AcceleratorRegistration FULGOR_DETAIL_CONCAT(fulgor_accelerator_at_load_, __COUNTER__)( \
      abi_version, name, []() -> std::unique_ptr<::fulgor::Accelerator> { return std::make_unique<Class>(); })

/// Registers accelerator class `Class` (default-constructible, cheap to
/// construct) under the string `name` when its library loads: the name users
/// select it by, and its instances' name(). Description and priority come from
/// the class. Use once per accelerator, at namespace scope in a .cpp file:
///
///   REGISTER_ACCELERATOR("myaccel", MyAccelerator);
#define REGISTER_ACCELERATOR(name, Class) FULGOR_DETAIL_REGISTER_ACCELERATOR(FULGOR_PLUGIN_ABI_VERSION, name, Class)

#pragma once

// The table of c10d collective backends fulgor can build a process group on,
// by the name an Accelerator's distributed_backend() returns. c10d's C++ API
// has no name -> backend factory of its own (Python's Backend.register_backend
// is Python-only), so fulgor keeps one. Accelerator plugins that bring their
// own collective library declare it here with REGISTER_DISTRIBUTED_BACKEND.

#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/detail/compat.h"

namespace fulgor {

/// What a backend factory gets to build one rank's backend.
struct FULGOR_API DistributedBackendContext {
  c10::intrusive_ptr<c10d::Store> store;  ///< the job's rendezvous store (a c10d::TCPStore)
  int rank = 0;
  int world_size = 1;
  torch::Device device{torch::kCPU};    ///< the device this rank trains on
  std::string master_addr;              ///< host of the rendezvous store
  std::chrono::milliseconds timeout{};  ///< for every collective
};

/// Makes the backend: in LibTorch 2.x a c10d::Backend (e.g. ProcessGroupGloo),
/// in 1.13 a c10d::ProcessGroup (see Note [c10d backends across versions]).
/// Throws (anything) when it cannot; fulgor reports the message.
using DistributedBackendFactory =
    std::function<c10::intrusive_ptr<detail::compat::CollectiveBackend>(const DistributedBackendContext& context)>;

/// Registers `factory` under `name` ("xccl", "hccl"); replaces an earlier one
/// of the same name, so a plugin can supply a better implementation of a
/// built-in. Thread-safe.
FULGOR_API void register_distributed_backend(const std::string& name, DistributedBackendFactory factory);
/// Whether `name` is registered.
FULGOR_API bool has_distributed_backend(const std::string& name);
/// Registered names, sorted. Built in: "gloo" (where LibTorch has it) and
/// "nccl" (where LibTorch was built with USE_C10D_NCCL).
FULGOR_API std::vector<std::string> distributed_backend_names();
/// Throws ConfigError listing the known names when `name` is not registered.
FULGOR_API void require_distributed_backend(const std::string& name);
/// Builds the backend `name` stands for. Throws ConfigError listing the known
/// names when `name` is unknown, DistributedError when the factory fails.
FULGOR_API c10::intrusive_ptr<detail::compat::CollectiveBackend> make_distributed_backend(
    const std::string& name, const DistributedBackendContext& context);

namespace detail {
struct DistributedBackendRegistration {
  DistributedBackendRegistration(const char* name, DistributedBackendFactory factory) {
    register_distributed_backend(name, std::move(factory));
  }
};
}  // namespace detail
}  // namespace fulgor

#define FULGOR_DETAIL_DB_CONCAT_(a, b) a##b
#define FULGOR_DETAIL_DB_CONCAT(a, b) FULGOR_DETAIL_DB_CONCAT_(a, b)

/// Registers a collective backend when its library loads, at namespace scope
/// in a .cpp file. `factory` is anything callable as DistributedBackendFactory:
///
///   REGISTER_DISTRIBUTED_BACKEND("xccl", [](const fulgor::DistributedBackendContext& c) {
///     return c10::make_intrusive<c10d::ProcessGroupXCCL>(c.store, c.rank, c.world_size);
///   });
#define REGISTER_DISTRIBUTED_BACKEND(name, factory)                                      \
  static const ::fulgor::detail::DistributedBackendRegistration FULGOR_DETAIL_DB_CONCAT( \
      fulgor_distributed_backend_at_load_, __COUNTER__)(name, ::fulgor::DistributedBackendFactory(factory))

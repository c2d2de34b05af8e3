#pragma once

// Note [One LibTorch]
// Every difference between the LibTorch versions fulgor supports (1.13 and
// 2.x) is answered here, so that the rest of the code reads as if there were
// one LibTorch. Add a function here rather than a version check elsewhere.

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <string>

#define FULGOR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace c10d {
class Backend;
class ProcessGroup;
class Store;
}  // namespace c10d

namespace fulgor::detail::compat {

/// Whether this LibTorch lets a library name the PrivateUse1 device type and
/// register its hooks (2.1 and later).
constexpr bool kHasNamedPrivateUse1 = FULGOR_TORCH_AT_LEAST(2, 1);

/// The name PrivateUse1 was renamed to, or "" when no backend renamed it (and
/// always "" where renaming does not exist).
std::string privateuse1_backend_name();

// ---- c10d (distributed) -------------------------------------------------------

// Note [c10d backends across versions]
// In 1.13 a collective backend (ProcessGroupGloo, ProcessGroupNCCL) *is* a
// c10d::ProcessGroup. From 2.0 on it is a c10d::Backend, and a ProcessGroup
// routes each device type's tensors to one of the Backends it holds. fulgor's
// backend factories return a CollectiveBackend, and make_process_group turns
// one into the ProcessGroup that fulgor and c10d's Reducer talk to.
#if FULGOR_TORCH_AT_LEAST(2, 0)
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

/// Whether this LibTorch was built with c10d's gloo and NCCL backends.
bool has_gloo();
bool has_nccl();

/// A TCPStore client for `host:port`; the server too when `is_server`, which
/// then waits for `world_size` clients. Operations fail after `timeout`.
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                               std::chrono::milliseconds timeout);

/// gloo over TCP, listening on the address `hostname` resolves to, or on the
/// network interface `interface` when that is not empty.
c10::intrusive_ptr<CollectiveBackend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, const std::string& hostname,
                                                        const std::string& interface,
                                                        std::chrono::milliseconds timeout);
/// NCCL; only callable where has_nccl().
c10::intrusive_ptr<CollectiveBackend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, std::chrono::milliseconds timeout);

/// The ProcessGroup that sends tensors of `device_type` (and of the CPU, where
/// the backend takes them) to `backend`, registered under `backend_name`.
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, const std::string& backend_name,
                                                          c10::intrusive_ptr<CollectiveBackend> backend,
                                                          c10::DeviceType device_type);

}  // namespace fulgor::detail::compat

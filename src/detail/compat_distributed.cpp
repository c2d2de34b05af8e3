// The c10d half of Note [One LibTorch]: see Note [c10d backends across versions].

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "fulgor/detail/compat.h"
#include "fulgor/core/error.h"

namespace fulgor::detail::compat {

bool has_gloo() {
#ifdef USE_C10D_GLOO
  return true;
#else
  return false;
#endif
}

bool has_nccl() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = static_cast<std::size_t>(world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
#if FULGOR_TORCH_AT_LEAST(2, 2)
  // From 2.4 on the server defaults to libuv, which distribution builds may
  // lack ("use_libuv was requested but PyTorch was build without libuv
  // support"); the classic server works in every build.
  options.useLibUV = false;
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

c10::intrusive_ptr<CollectiveBackend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, const std::string& hostname,
                                                        const std::string& interface,
                                                        std::chrono::milliseconds timeout) {
#ifdef USE_C10D_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(interface.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(hostname)
                                               : c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)hostname, (void)interface, (void)timeout;
  throw DeviceError("this LibTorch was built without c10d's gloo backend (USE_C10D_GLOO)");
#endif
}

c10::intrusive_ptr<CollectiveBackend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw DeviceError("this LibTorch was built without c10d's NCCL backend (USE_C10D_NCCL)");
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, const std::string& backend_name,
                                                          c10::intrusive_ptr<CollectiveBackend> backend,
                                                          c10::DeviceType device_type) {
#if FULGOR_TORCH_AT_LEAST(2, 0)
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  const auto type = c10d::ProcessGroup::strToBackendType(backend_name);
  group->setDefaultBackend(type);
  group->setBackend(device_type, type, backend);
  // gloo also reduces host tensors, as Python's init_process_group sets it up.
  if (backend_name == "gloo" && device_type != c10::DeviceType::CPU)
    group->setBackend(c10::DeviceType::CPU, type, backend);
  group->setGroupName("fulgor");
  return group;
#else
  // The backend is the process group.
  (void)store, (void)rank, (void)size, (void)backend_name, (void)device_type;
  return backend;
#endif
}

}  // namespace fulgor::detail::compat

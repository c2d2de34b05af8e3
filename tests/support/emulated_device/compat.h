// The LibTorch version differences the emulated devices meet, kept here so the
// rest of the emulation reads as if there were one LibTorch.
#pragma once

#include <ATen/native/CPUFallback.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <cstddef>

#define FULGOR_EMULATED_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fulgor::emulated::compat {

// c10::Allocator::allocate lost its const and gained copy_data as a pure
// virtual (both in 2.3); subclasses implement allocate_bytes instead.
class Allocator : public c10::Allocator {
 public:
#if FULGOR_EMULATED_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(std::size_t bytes) override { return allocate_bytes(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(std::size_t bytes) const override { return allocate_bytes(bytes); }
#endif

 protected:
  virtual c10::DataPtr allocate_bytes(std::size_t bytes) const = 0;
};

// 2.x added stream creation, event synchronization and device-wide
// synchronization to the guard interface, with defaults that throw. Host
// memory is always in sync, so they are no-ops here. Gated on 2.6, where they
// were checked; on 2.0 to 2.5 the interface's throwing defaults remain.
class DeviceGuardImpl : public c10::impl::DeviceGuardImplInterface {
 public:
#if FULGOR_EMULATED_TORCH_AT_LEAST(2, 6)
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(c10::DeviceIndex /*device_index*/) const override {}
#endif
};

// Newer releases can refuse to run view operators on the CPU, where the
// result would be a copy that silently stops aliasing its input; 1.13 always
// copies.
inline void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
#if FULGOR_EMULATED_TORCH_AT_LEAST(2, 3)
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
#else
  at::native::cpu_fallback(op, stack);
#endif
}

}  // namespace fulgor::emulated::compat

// Emulated accelerator runtimes for tests: a device type whose tensors live in
// host memory but go through LibTorch's dispatcher as if they were on a real
// accelerator.
//
// The same code is compiled into one shared library per emulated device type
// (libfulgor_emulated_xpu.so, libfulgor_emulated_npu.so). Each library's own
// file registers the pieces below for its device type from static
// initializers, so loading the library with dlopen is all it takes, exactly
// as for a vendor runtime.
//
// Note [Emulated device execution]
// Only the operators that create, alias, resize or copy memory run natively
// on the emulated device (register_native_kernels). Everything else reaches
// the boxed fallback, which moves the arguments to the CPU, runs the CPU
// kernel and copies the results back to the device of the first device
// argument. Because the device's memory is host memory, moving to and from
// the CPU is a memcpy through a CPU tensor that aliases the device storage.
// View operators must never take the fallback: they would return a copy and
// silently stop aliasing their input. Arguments on two devices of the same
// type are refused there, as a real accelerator would. A few operators run
// their CPU kernel directly on the device memory instead (run_on_host_memory
// in emulated_device.cpp): those whose composite kernels would reach an
// operator unknown devices cannot run, and one that updates arguments its
// schema does not mark as written.
//
// Note [Emulated device count]
// FULGOR_EMULATED_DEVICE_COUNT (default 2, at most kMaxDevices) is read once,
// when the library is loaded. An invalid value gives zero devices, and every
// attempt to use a device then names the bad value, because the guard's
// deviceCount must not throw.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstddef>
#include <cstdint>

#include "compat.h"

namespace fulgor::emulated {

constexpr int kMaxDevices = 16;

// The number of emulated devices of each type, see Note [Emulated device count].
int device_count() noexcept;

// Throws, naming FULGOR_EMULATED_DEVICE_COUNT, unless index is a device that
// exists.
void check_device_index(c10::DeviceType type, c10::DeviceIndex index);

// Host memory, tagged with the current device of its type and counted per
// device (see memory_allocated).
class Allocator final : public compat::Allocator {
 public:
  explicit Allocator(c10::DeviceType type);
  c10::DeleterFnPtr raw_deleter() const override;

 protected:
  c10::DataPtr allocate_bytes(std::size_t bytes) const override;

 private:
  c10::DeviceType type_;
};

// The current device is per thread, as on real accelerator runtimes. Streams
// and events are no-ops: work on host memory is finished when the kernel
// returns.
class DeviceGuardImpl : public compat::DeviceGuardImpl {
 public:
  explicit DeviceGuardImpl(c10::DeviceType type) : type_(type) {}

  c10::DeviceType type() const override { return type_; }
  c10::Device exchangeDevice(c10::Device device) const override;
  c10::Device getDevice() const override;
  void setDevice(c10::Device device) const override;
  void uncheckedSetDevice(c10::Device device) const noexcept override;
  c10::Stream getStream(c10::Device device) const noexcept override;
  c10::Stream getDefaultStream(c10::Device device) const override;
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool is_high_priority) const override;
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override;
  c10::DeviceIndex deviceCount() const noexcept override;
  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device_index,
              c10::EventFlag flag) const override;
  void block(void* event, const c10::Stream& stream) const override;
  bool queryEvent(void* event) const override;
  bool queryStream(const c10::Stream& stream) const override;
  void synchronizeStream(const c10::Stream& stream) const override;

 private:
  c10::DeviceType type_;
};

// C10_REGISTER_GUARD_IMPL default-constructs the implementation it registers.
template <c10::DeviceType Type>
class DeviceGuardImplFor final : public DeviceGuardImpl {
 public:
  DeviceGuardImplFor() : DeviceGuardImpl(Type) {}
};

// Registers, on the library's dispatch key, the operators of
// Note [Emulated device execution] that cannot take the CPU fallback.
void register_native_kernels(torch::Library& library);

// Boxed fallbacks for every other operator. The second gives random operators
// without an explicit generator the default generator of their device rather
// than the CPU's, so that each device has its own RNG state.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void cpu_fallback_with_device_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Per device CPU generators: CPU kernels only accept CPU generators, so these
// report the CPU as their device. index -1 means the current device.
const at::Generator& default_generator(c10::DeviceType type, c10::DeviceIndex index);

// The device holding data, if it points into memory this library allocated.
c10::optional<c10::Device> device_of_pointer(const void* data);

// Resizes a storage in place, allocating on the storage's own device.
void resize_storage_bytes(c10::StorageImpl* storage, std::size_t bytes);

}  // namespace fulgor::emulated

// Memory statistics for tests. Each library answers only for its own device
// type (-1 otherwise), so look these up with dlsym on the library's handle.
extern "C" {
__attribute__((visibility("default"))) int fulgor_emulated_device_count();
__attribute__((visibility("default"))) int64_t fulgor_emulated_memory_allocated(int device_type, int index);
__attribute__((visibility("default"))) int64_t fulgor_emulated_memory_peak(int device_type, int index);
// Reads of device memory from the host so far (Note [Host reads] in emulated_device.cpp).
__attribute__((visibility("default"))) int64_t fulgor_emulated_host_reads();
}

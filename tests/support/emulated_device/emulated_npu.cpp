// The emulated runtime for c10::DeviceType::PrivateUse1, named "npu"; see
// emulated_device.h. Built for LibTorch 2.1 and later only, where a
// PrivateUse1 backend can be named and given hooks.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "emulated_device.h"

namespace fulgor::emulated {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;

// What LibTorch asks of an accelerator it does not know: the device count,
// the current device and, for RNG state, a default generator per device.
class NpuHooks final : public at::PrivateUse1HooksInterface {
 public:
  void init() const override {}

  bool hasPrimaryContext(c10::DeviceIndex index) const override { return index >= 0 && index < device_count(); }

  c10::DeviceIndex deviceCount() const override { return guard_.deviceCount(); }

  void setCurrentDevice(c10::DeviceIndex index) const override { guard_.setDevice(c10::Device(kNpu, index)); }

  c10::DeviceIndex getCurrentDevice() const override { return guard_.getDevice().index(); }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    return guard_.exchangeDevice(c10::Device(kNpu, index)).index();
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(kNpu, index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex /*index*/) const override {
    return at::make_generator<at::CPUGeneratorImpl>();
  }

  c10::Device getDeviceFromPtr(void* data) const override {
    const c10::optional<c10::Device> device = device_of_pointer(data);
    TORCH_CHECK(device.has_value(), "pointer ", data, " was not allocated on an emulated npu device");
    return *device;
  }

  // Device memory is host memory already.
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), bytes);
  }

 private:
  DeviceGuardImpl guard_{kNpu};
};

struct NpuRegistration {
  NpuRegistration() {
    c10::register_privateuse1_backend("npu");
    // Leaked: LibTorch keeps the pointer for the life of the process.
    at::RegisterPrivateUse1HooksInterface(new NpuHooks());
  }
};

const NpuRegistration registration;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, new Allocator(c10::DeviceType::PrivateUse1))

C10_REGISTER_GUARD_IMPL(PrivateUse1, DeviceGuardImplFor<c10::DeviceType::PrivateUse1>)

}  // namespace fulgor::emulated

TORCH_LIBRARY_IMPL(aten, PrivateUse1, library) { fulgor::emulated::register_native_kernels(library); }

// npu has hooks, so LibTorch can reach its per-device generators; random
// operators use them, making RNG state per device as on a real accelerator.
TORCH_LIBRARY_IMPL(_, PrivateUse1, library) {
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&fulgor::emulated::cpu_fallback_with_device_generators>());
}

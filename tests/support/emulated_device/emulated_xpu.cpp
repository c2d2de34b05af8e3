// The emulated runtime for c10::DeviceType::XPU; see emulated_device.h.
//
// XPU needs no backend name and no hooks. Random operators on it draw from
// the CPU's default generator, because nothing in LibTorch can reach a
// per-device XPU generator without a real XPU runtime's hooks.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "emulated_device.h"

namespace fulgor::emulated {

// Leaked: LibTorch keeps the pointer for the life of the process.
REGISTER_ALLOCATOR(c10::DeviceType::XPU, new Allocator(c10::DeviceType::XPU))

C10_REGISTER_GUARD_IMPL(XPU, DeviceGuardImplFor<c10::DeviceType::XPU>)

}  // namespace fulgor::emulated

TORCH_LIBRARY_IMPL(aten, XPU, library) { fulgor::emulated::register_native_kernels(library); }

TORCH_LIBRARY_IMPL(_, XPU, library) {
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&fulgor::emulated::cpu_fallback>());
}

#pragma once

// Note [One LibTorch]
// Every difference between the LibTorch versions fulgor supports (1.13 and
// 2.x) is answered here, so that the rest of the code reads as if there were
// one LibTorch. Add a function here rather than a version check elsewhere.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

/// The dtypes safetensors names that LibTorch 1.13 lacks ("U16", "U32",
/// "U64" from 2.3, "F8_E4M3", "F8_E5M2" from 2.1): the ScalarType where this
/// LibTorch has it, nothing where not.
std::optional<c10::ScalarType> newer_safetensors_dtype(const std::string& name);

/// Whether LibTorch can autocast on `device_type`.
bool autocast_supported(c10::DeviceType device_type);
/// Whether autocast is on for `device_type`, and its dtype. Requires
/// autocast_supported.
std::pair<bool, c10::ScalarType> autocast_state(c10::DeviceType device_type);
/// Turns autocast on `device_type` on or off, computing in `dtype`, and
/// returns the previous (enabled, dtype). Requires autocast_supported.
std::pair<bool, c10::ScalarType> set_autocast(c10::DeviceType device_type, bool enabled, c10::ScalarType dtype);
/// Enters or leaves one level of autocast nesting; leaving the outermost
/// level clears the cache of casted weights, as Python's autocast does.
void autocast_enter();
void autocast_exit();

/// GradScaler's two operations, with LibTorch's fused amp kernels where this
/// LibTorch has them for every device type (2.3 and later), else with the
/// same arithmetic in plain tensor operations.
///   unscale: grads *= inv_scale; found_inf = 1 if any grad has inf or NaN.
///   update:  back off and reset the tracker when found_inf, else count a good
///            step and grow the scale every `interval` good steps.
void unscale_grads(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& inv_scale);
void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t interval);
/// The key of `param`'s state in an optimizer's state map: the parameter's
/// TensorImpl, as a string in 1.13, as the pointer from 2.0 on.
inline auto optimizer_state_key(const torch::Tensor& param) {
#if FULGOR_TORCH_AT_LEAST(2, 0)
  return static_cast<void*>(param.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(param.unsafeGetTensorImpl());
#endif
}
/// An optimizer's state for `param`, or nullptr where it has none yet.
/// Inline, as the tests read optimizer states too.
inline torch::optim::OptimizerParamState* optimizer_param_state(const torch::optim::Optimizer& optimizer,
                                                                const torch::Tensor& param) {
  const auto& states = optimizer.state();
  auto it = states.find(optimizer_state_key(param));
  return it == states.end() ? nullptr : it->second.get();
}
/// Replaces the optimizer's state for `param` (nullptr: removes it).
inline void set_optimizer_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                                      std::unique_ptr<torch::optim::OptimizerParamState> state) {
  if (state)
    optimizer.state()[optimizer_state_key(param)] = std::move(state);
  else
    optimizer.state().erase(optimizer_state_key(param));
}

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
/// Whether c10d's gloo backend takes bfloat16 tensors (2.x; 1.13's refuses
/// them: "Invalid scalar type").
constexpr bool kGlooHasBFloat16 = FULGOR_TORCH_AT_LEAST(2, 0);

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

#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "fulgor/core/devices.h"
#include "fulgor/core/export.h"

namespace fulgor {

class AcceleratorRegistry;

/// Whether an accelerator can be used in this process, and why not.
struct Availability {
  bool available = false;
  std::string reason;  ///< empty when available
};

/// What the Trainer tells an accelerator as it sets up the device a process
/// trains on: the device, and where the process sits in its job.
struct DeviceSetup {
  torch::Device device{torch::kCPU};  ///< one of the devices parse_devices selected
  /// The device's index among the accelerator's devices: device.index() where
  /// the device has one; for a CPU-backed accelerator with several devices,
  /// the index its `devices` value gives this process (with the default
  /// parse_devices' rules: devices = "1,3" gives local rank 0 index 1 and
  /// local rank 1 index 3); 0 for one with a single device (the built-in CPU,
  /// whose processes share it).
  int64_t index = 0;
  int64_t local_rank = 0;        ///< the process among the job's processes on this machine
  int64_t local_world_size = 1;  ///< the job's processes on this machine
  int64_t rank = 0;              ///< the process in the job
  int64_t world_size = 1;        ///< the job's processes
};

/// Everything fulgor knows about a kind of device. One subclass is a whole
/// backend: the Trainer, strategies, precision and checkpoint code never name a
/// device, they ask the Accelerator.
///
/// Contract for implementers (see docs/accelerators.md):
///   - The class is registered under its name with REGISTER_ACCELERATOR; its
///     priority and description come from the class.
///   - The constructor is cheap and touches no device or runtime: the registry
///     constructs accelerators to list them. Work that can fail goes into
///     availability() (which must never throw) and setup_device().
///   - Methods taking a device get one of this accelerator's device type.
///   - An instance is used from one thread at a time; the registry hands out a
///     fresh instance to each caller.
class FULGOR_API Accelerator {
 public:
  virtual ~Accelerator() = default;

  // ---- Identity -------------------------------------------------------------

  /// The name the registry created this instance under (REGISTER_ACCELERATOR's
  /// or AcceleratorRegistry::add's), e.g. "cpu"; empty for an instance
  /// constructed directly.
  const std::string& name() const { return name_; }
  /// The LibTorch device type the accelerator's tensors live on.
  virtual torch::DeviceType device_type() const = 0;
  /// One sentence for `fulgor-info` and docs.
  virtual std::string description() const = 0;
  /// Rank in "auto" selection: the available accelerator with the highest
  /// priority wins. Built-ins: cuda 400, xpu 300, npu 200, cpu 0.
  virtual int priority() const { return 100; }

  // ---- Availability and devices ---------------------------------------------

  /// Whether the accelerator can run here; when not, the reason a user can act on.
  virtual Availability availability() const = 0;
  bool is_available() const { return availability().available; }
  /// How many devices exist (0 when unavailable).
  virtual int64_t device_count() const = 0;
  /// How many devices `devices = "auto"` uses: the default parse_devices
  /// selects the first auto_device_count() devices for it.
  virtual int64_t auto_device_count() const { return device_count(); }
  /// The devices a `devices` value selects, with Lightning's semantics for
  /// devices addressed by index (parse_device_indices), "auto" meaning the
  /// first auto_device_count() devices. Throws ConfigError naming the value
  /// and the device count when the value is not accepted, DeviceError when
  /// unavailable.
  virtual std::vector<torch::Device> parse_devices(const Devices& devices) const;
  /// The device with this index; for an accelerator whose device type is the
  /// CPU, LibTorch's one CPU device (which has no index) whatever the index.
  torch::Device device(int64_t index) const;

  // ---- Lifetime -------------------------------------------------------------

  /// Makes `setup.device` current for this process before training on it;
  /// called before the process joins a distributed job. `setup` also says
  /// which of the accelerator's devices the process drives (setup.index), for
  /// devices that LibTorch cannot tell apart (all of a CPU-backed simulator's).
  virtual void setup_device(const DeviceSetup& setup);
  /// Releases what setup_device took; called once when a loop ends.
  virtual void teardown() {}

  // ---- Moving data ----------------------------------------------------------

  /// Moves every parameter and buffer of `module` (recursively) onto `device`,
  /// keeping the same tensor objects so optimizers and references stay valid.
  /// Works for device types where torch::nn::Module::to cannot (PrivateUse1).
  virtual void move_module(torch::nn::Module& module, torch::Device device) const;
  /// Copies one tensor onto `device`; the hook for pinned or asynchronous copies.
  virtual torch::Tensor move_tensor(const torch::Tensor& tensor, torch::Device device, bool non_blocking) const;
  /// Whether host memory can be pinned for asynchronous copies to this device.
  virtual bool supports_pinned_memory() const { return false; }

  // ---- Execution ------------------------------------------------------------

  /// Blocks until all work queued on `device` has finished.
  virtual void synchronize(torch::Device device) const;

  /// Sets the device library's autotuning of its kernels, the Trainer's
  /// `benchmark` (cuDNN's benchmark flag on CUDA: each convolution's fastest
  /// algorithm timed on its first call). Returns whether the accelerator has
  /// such a setting; by default it has none, and nothing is set.
  virtual bool set_benchmark(bool enabled) const;

  /// The c10d backend name for distributed training ("gloo", "nccl", "xccl", "hccl").
  virtual std::string distributed_backend() const = 0;

  /// The device type LibTorch's autocast uses for this accelerator.
  virtual torch::DeviceType autocast_device_type() const { return device_type(); }
  /// The Trainer precisions ("32-true", "bf16-mixed", ...) this accelerator
  /// supports; by default precisions_with({}): "32-true" and "64-true".
  virtual std::vector<std::string> supported_precisions() const;

  // ---- Memory and RNG -------------------------------------------------------

  /// Memory statistics of `device`, name -> number (bytes unless the name
  /// says otherwise), for DeviceStatsMonitor; empty when there are none.
  virtual std::map<std::string, int64_t> memory_stats(torch::Device device) const;
  /// Whether `error` says that this accelerator's device (or the host, for
  /// the CPU) ran out of memory: what BatchSizeFinder backs off from. By
  /// default, LibTorch's c10::OutOfMemoryError, which caching allocators
  /// throw; an accelerator whose runtime reports it otherwise recognises
  /// that too. Must not throw.
  virtual bool is_out_of_memory(const std::exception& error) const;

  /// Seeds the default random generator of each of the accelerator's devices
  /// (the CPU's, where the device type is the CPU), so that random draws on
  /// them repeat: what the Trainer's `seed` option and seed_everything call.
  /// Devices LibTorch has no generator for are left alone: their random
  /// operators draw where the runtime takes them from, usually the CPU's
  /// generator, which the Trainer and seed_everything seed as well.
  virtual void manual_seed(uint64_t seed) const;

  /// The state of `device`'s default random generator, or an undefined tensor
  /// when the device draws from no generator of its own.
  virtual torch::Tensor get_rng_state(torch::Device device) const;
  /// Restores a state returned by get_rng_state.
  virtual void set_rng_state(torch::Device device, const torch::Tensor& state) const;

 protected:
  /// The precisions of a device that computes in float32 and float64 and in
  /// each reduced floating-point type of `reduced` (torch::kHalf,
  /// torch::kBFloat16): "32-true", "64-true", then "<type>-mixed" for each
  /// type in `reduced` in its order, then "<type>-true" for each ("16" for
  /// kHalf, "bf16" for kBFloat16). An override of supported_precisions()
  /// returns this, naming only the types its device adds. Throws ConfigError
  /// for another type.
  static std::vector<std::string> precisions_with(std::initializer_list<torch::ScalarType> reduced);

 private:
  friend class AcceleratorRegistry;  // names the instances it creates
  std::string name_;
};

}  // namespace fulgor

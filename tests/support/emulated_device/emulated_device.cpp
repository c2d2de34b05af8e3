#include "emulated_device.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/alloc_cpu.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fulgor::emulated {
namespace {

constexpr int kDefaultDeviceCount = 2;
constexpr int kNumDeviceTypes = static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);
constexpr const char* kDeviceCountVariable = "FULGOR_EMULATED_DEVICE_COUNT";

struct DeviceCountSetting {
  int count;
  std::string error;  // why count is 0 when the variable could not be parsed
};

DeviceCountSetting read_device_count() {
  const char* text = std::getenv(kDeviceCountVariable);
  if (text == nullptr || *text == '\0') {
    return {kDefaultDeviceCount, {}};
  }
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < 0 || value > kMaxDevices) {
    return {0, std::string(kDeviceCountVariable) + "='" + text + "' is not a whole number from 0 to " +
                   std::to_string(kMaxDevices)};
  }
  return {static_cast<int>(value), {}};
}

const DeviceCountSetting& device_count_setting() {
  static const DeviceCountSetting setting = read_device_count();
  return setting;
}

int type_slot(c10::DeviceType type) { return static_cast<int>(type); }

c10::DeviceIndex& current_index(c10::DeviceType type) {
  thread_local std::array<c10::DeviceIndex, kNumDeviceTypes> current{};
  return current[type_slot(type)];
}

// Every live allocation of this library, so that frees are counted on the
// device that allocated, and pointers can be traced back to their device.
class MemoryTable {
 public:
  void serve(c10::DeviceType type) {
    const std::lock_guard<std::mutex> lock(mutex_);
    served_[type_slot(type)] = true;
  }

  bool serves(c10::DeviceType type) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return served_[type_slot(type)];
  }

  void add(void* data, std::size_t bytes, c10::Device device) {
    const std::lock_guard<std::mutex> lock(mutex_);
    blocks_.insert_or_assign(reinterpret_cast<std::uintptr_t>(data), Block{bytes, device});
    DeviceMemory& memory = memory_[type_slot(device.type())][device.index()];
    memory.allocated += static_cast<int64_t>(bytes);
    memory.peak = std::max(memory.peak, memory.allocated);
  }

  void remove(void* data) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto found = blocks_.find(reinterpret_cast<std::uintptr_t>(data));
    TORCH_INTERNAL_ASSERT(found != blocks_.end(), "freeing memory the emulated device did not allocate");
    const Block& block = found->second;
    memory_[type_slot(block.device.type())][block.device.index()].allocated -= static_cast<int64_t>(block.bytes);
    blocks_.erase(found);
  }

  c10::optional<c10::Device> find(const void* data) const {
    const auto address = reinterpret_cast<std::uintptr_t>(data);
    const std::lock_guard<std::mutex> lock(mutex_);
    auto after = blocks_.upper_bound(address);
    if (after == blocks_.begin()) {
      return c10::nullopt;
    }
    const auto& [start, block] = *std::prev(after);
    if (address >= start + block.bytes) {
      return c10::nullopt;
    }
    return block.device;
  }

  // -1 for a device this library does not emulate.
  int64_t allocated(int type, int index) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return valid(type, index) ? memory_[type][index].allocated : -1;
  }

  int64_t peak(int type, int index) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return valid(type, index) ? memory_[type][index].peak : -1;
  }

 private:
  struct Block {
    std::size_t bytes;
    c10::Device device;
  };

  struct DeviceMemory {
    int64_t allocated = 0;
    int64_t peak = 0;
  };

  bool valid(int type, int index) const {
    return type >= 0 && type < kNumDeviceTypes && served_[type] && index >= 0 && index < device_count();
  }

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Block> blocks_;
  std::array<bool, kNumDeviceTypes> served_{};
  std::array<std::array<DeviceMemory, kMaxDevices>, kNumDeviceTypes> memory_{};
};

// Leaked: tensors may still be freed while static objects are destroyed.
MemoryTable& memory_table() {
  static MemoryTable* table = new MemoryTable();
  return *table;
}

void free_block(void* data) {
  if (data == nullptr) {
    return;
  }
  memory_table().remove(data);
  c10::free_cpu(data);
}

// Factory operators carry the target device; one without an index means the
// current device, as on CUDA.
c10::Device target_device(const c10::optional<c10::Device>& device) {
  TORCH_INTERNAL_ASSERT(device.has_value(), "an emulated device factory got no device");
  return device->has_index() ? *device : c10::Device(device->type(), current_index(device->type()));
}

c10::DispatchKeySet dispatch_keys(c10::Device device) {
  return c10::DispatchKeySet(c10::computeDispatchKey(c10::nullopt, c10::kStrided, device));
}

void check_strided(const c10::optional<c10::Layout>& layout) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::kStrided, "emulated devices only hold strided tensors, not ",
              c10::layout_or_default(layout));
}

// A CPU tensor over the same host memory as tensor, so that CPU kernels read
// and write the device tensor in place. It does not own the memory and must
// not outlive tensor.
at::Tensor host_alias(const at::Tensor& tensor) {
  if (tensor.device().is_cpu()) {
    return tensor;
  }
  TORCH_CHECK(memory_table().serves(tensor.device().type()), "the emulated device library cannot reach memory on ",
              tensor.device(), "; only the CPU and its own devices");
  const c10::Storage& storage = tensor.storage();
  c10::Storage host_storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(storage.nbytes()),
                            c10::DataPtr(storage.data_ptr().get(), c10::Device(c10::kCPU)),
                            /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
      std::move(host_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), tensor.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(tensor.sizes(), tensor.strides());
  alias.unsafeGetTensorImpl()->set_storage_offset(tensor.storage_offset());
  alias._set_conj(tensor.is_conj());
  alias._set_neg(tensor.is_neg());
  return alias;
}

at::Tensor empty_memory_format(at::IntArrayRef size, c10::optional<at::ScalarType> dtype,
                               c10::optional<at::Layout> layout, c10::optional<at::Device> device,
                               c10::optional<bool> /*pin_memory*/, c10::optional<at::MemoryFormat> memory_format) {
  check_strided(layout);
  const c10::Device target = target_device(device);
  const c10::DeviceGuard guard(target);
  return at::detail::empty_generic(size, c10::GetAllocator(target.type()), dispatch_keys(target),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, c10::optional<at::ScalarType> dtype,
                         c10::optional<at::Layout> layout, c10::optional<at::Device> device,
                         c10::optional<bool> /*pin_memory*/) {
  check_strided(layout);
  const c10::Device target = target_device(device);
  const c10::DeviceGuard guard(target);
  return at::detail::empty_strided_generic(size, stride, c10::GetAllocator(target.type()), dispatch_keys(target),
                                           c10::dtype_or_default(dtype));
}

// Note [Host reads]
// Reading device memory from the host (item(), a copy to the CPU) waits for
// the device on real hardware. Tests count them to check that the Trainer
// does not read per step what it can read once; the fallback's own copies,
// which real devices would not make, are not counted.
std::atomic<int64_t> host_reads{0};
thread_local bool in_fallback = false;

void count_host_read(const at::Tensor& to, const at::Tensor& from) {
  if (!in_fallback && to.device().is_cpu() && !from.device().is_cpu()) ++host_reads;
}

// copy_ is composite, but its composite kernel sends devices it does not know
// to _copy_from, except XPU on 2.6, which it sends to copy_stub, which has no
// XPU kernel in a build without XPU. Owning copy_ takes one path everywhere.
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
  count_host_read(self, src);
  host_alias(self).copy_(host_alias(src));
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  count_host_read(dst, self);
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

// The CPU implementations only manipulate sizes, strides and the storage's
// own allocator, so they serve once the allocation lands on the right device.
const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size, c10::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset, at::IntArrayRef size,
                               at::IntArrayRef stride) {
  const c10::DeviceGuard guard(source.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

// The CPU kernel would give self an empty CPU storage.
at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::GetAllocator(self.device().type()),
                       /*resizable=*/true);
  return self.set_(storage, 0, {0}, {});
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  if (!in_fallback) ++host_reads;
  return at::_local_scalar_dense(host_alias(self));
}

bool holds_generator(const c10::Argument& argument) { return c10::GeneratorType::get()->isSubtypeOf(*argument.type()); }

// The device the fallback will return results to (the first device tensor),
// after checking that no argument is on another device of the same type.
c10::optional<c10::Device> device_of_arguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  c10::optional<c10::Device> device;
  const auto visit = [&](const c10::IValue& value) {
    if (!value.isTensor() || !value.toTensor().defined()) {
      return;
    }
    const c10::Device found = value.toTensor().device();
    if (!memory_table().serves(found.type())) {
      return;
    }
    if (!device) {
      device = found;
    }
    TORCH_CHECK(*device == found,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, ",
                *device, " and ", found, " (in ", op.schema().name(), ")");
  };
  const std::size_t count = op.schema().arguments().size();
  for (std::size_t i = stack.size() - count; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        visit(element);
      }
    } else {
      visit(value);
    }
  }
  return device;
}

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool device_generators) {
  const c10::optional<c10::Device> device = device_of_arguments(op, *stack);
  if (device_generators && device) {
    const auto& arguments = op.schema().arguments();
    const std::size_t first = stack->size() - arguments.size();
    for (std::size_t i = 0; i < arguments.size(); ++i) {
      c10::IValue& value = (*stack)[first + i];
      if (value.isNone() && holds_generator(arguments[i])) {
        value = default_generator(device->type(), device->index());
      }
    }
  }
  const bool outer = in_fallback;
  in_fallback = true;
  struct Restore {
    bool value;
    ~Restore() { in_fallback = value; }
  } restore{outer};
  compat::cpu_fallback(op, stack);
}

// Runs op's CPU kernel on host aliases of its device arguments, then moves
// the results to the device. Unlike the fallback, which computes on copies and
// copies back only the arguments the schema marks as written, the kernel works
// on the device memory itself, so every update it makes lands there.
void run_on_host_memory(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::optional<c10::Device> device = device_of_arguments(op, *stack);
  const std::size_t arguments = op.schema().arguments().size();
  for (std::size_t i = stack->size() - arguments; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    if (value.isTensor() && value.toTensor().defined()) {
      value = host_alias(value.toTensor());
    }
  }
  op.callBoxed(stack);
  const std::size_t returns = op.schema().returns().size();
  for (std::size_t i = stack->size() - returns; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    if (device && value.isTensor() && value.toTensor().defined()) {
      value = value.toTensor().to(*device);
    }
  }
}

}  // namespace

int device_count() noexcept { return device_count_setting().count; }

void check_device_index(c10::DeviceType type, c10::DeviceIndex index) {
  const DeviceCountSetting& setting = device_count_setting();
  const std::string name = c10::DeviceTypeName(type, /*lower_case=*/true);
  TORCH_CHECK(setting.error.empty(), "there are no emulated ", name, " devices: ", setting.error);
  TORCH_CHECK(setting.count > 0, "there are no emulated ", name, " devices: ", kDeviceCountVariable, "=0");
  TORCH_CHECK(index >= 0 && index < setting.count, "emulated device ", name, ":", static_cast<int>(index),
              " does not exist: ", kDeviceCountVariable, "=", setting.count, " gives ", name, ":0 to ", name, ":",
              setting.count - 1);
}

// Constructed while the library loads, which is when the device count is read.
Allocator::Allocator(c10::DeviceType type) : type_(type) {
  device_count_setting();
  memory_table().serve(type);
}

c10::DeleterFnPtr Allocator::raw_deleter() const { return &free_block; }

c10::DataPtr Allocator::allocate_bytes(std::size_t bytes) const {
  const c10::Device device(type_, current_index(type_));
  check_device_index(type_, device.index());
  if (bytes == 0) {
    return {nullptr, nullptr, &free_block, device};
  }
  void* data = c10::alloc_cpu(bytes);
  memory_table().add(data, bytes, device);
  return {data, data, &free_block, device};
}

c10::Device DeviceGuardImpl::exchangeDevice(c10::Device device) const {
  const c10::Device previous = getDevice();
  setDevice(device);
  return previous;
}

c10::Device DeviceGuardImpl::getDevice() const { return c10::Device(type_, current_index(type_)); }

void DeviceGuardImpl::setDevice(c10::Device device) const {
  TORCH_CHECK(device.type() == type_, "the emulated ", c10::DeviceTypeName(type_, /*lower_case=*/true),
              " guard cannot select ", device);
  check_device_index(type_, device.index());
  current_index(type_) = device.index();
}

void DeviceGuardImpl::uncheckedSetDevice(c10::Device device) const noexcept { current_index(type_) = device.index(); }

c10::Stream DeviceGuardImpl::getStream(c10::Device device) const noexcept {
  return c10::Stream(c10::Stream::DEFAULT, device);
}

c10::Stream DeviceGuardImpl::getDefaultStream(c10::Device device) const {
  return c10::Stream(c10::Stream::DEFAULT, device);
}

c10::Stream DeviceGuardImpl::getStreamFromGlobalPool(c10::Device device, bool /*is_high_priority*/) const {
  return c10::Stream(c10::Stream::DEFAULT, device);
}

c10::Stream DeviceGuardImpl::exchangeStream(c10::Stream stream) const noexcept {
  return c10::Stream(c10::Stream::DEFAULT, stream.device());
}

c10::DeviceIndex DeviceGuardImpl::deviceCount() const noexcept { return static_cast<c10::DeviceIndex>(device_count()); }

void DeviceGuardImpl::record(void** /*event*/, const c10::Stream& /*stream*/, c10::DeviceIndex /*device_index*/,
                             c10::EventFlag /*flag*/) const {}

void DeviceGuardImpl::block(void* /*event*/, const c10::Stream& /*stream*/) const {}

bool DeviceGuardImpl::queryEvent(void* /*event*/) const { return true; }

bool DeviceGuardImpl::queryStream(const c10::Stream& /*stream*/) const { return true; }

void DeviceGuardImpl::synchronizeStream(const c10::Stream& /*stream*/) const {}

void register_native_kernels(torch::Library& library) {
  library.impl("empty.memory_format", &empty_memory_format);
  library.impl("empty_strided", &empty_strided);
  library.impl("copy_", &copy_);
  library.impl("_copy_from", &copy_from);
  library.impl("_copy_from_and_resize", &copy_from_and_resize);
  library.impl("resize_", &resize_);
  library.impl("set_", &set_empty);
  library.impl("set_.source_Storage", &at::native::set_);
  library.impl("set_.source_Storage_storage_offset", &set_storage_offset);
  library.impl("_local_scalar_dense", &local_scalar_dense);
  // Views, see Note [Emulated device execution].
  library.impl("view", &at::native::view);
  library.impl("as_strided", &at::native::as_strided_tensorimpl);
  library.impl("_reshape_alias", &at::native::_reshape_alias);
  library.impl("unfold", &at::native::unfold);
  library.impl("view_as_real", &at::native::view_as_real);
  library.impl("view_as_complex", &at::native::view_as_complex);
  // The composite mse_loss passes its .out variant a 0-dim output that the
  // CPU kernel then resizes with a deprecation warning; the CPU's own
  // functional kernel does not.
  library.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  // On 1.13 native_batch_norm's schema does not mark the running statistics
  // it updates as written, so the fallback would drop the update.
  library.impl("native_batch_norm", torch::CppFunction::makeFromBoxedFunction<&run_on_host_memory>());
  // Their composite kernels pick a backend by device type and end in
  // *_overrideable operators whose default kernels throw for devices LibTorch
  // does not know; the CPU kernels serve instead.
  library.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&run_on_host_memory>());
  library.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&run_on_host_memory>());
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, /*device_generators=*/false);
}

void cpu_fallback_with_device_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, /*device_generators=*/true);
}

const at::Generator& default_generator(c10::DeviceType type, c10::DeviceIndex index) {
  struct Generators {
    std::once_flag created;
    std::vector<at::Generator> per_device;
  };
  // Leaked, like the memory table: generators outlive static destruction.
  static auto* all = new std::array<Generators, kNumDeviceTypes>();
  if (index == -1) {
    index = current_index(type);
  }
  check_device_index(type, index);
  Generators& generators = (*all)[type_slot(type)];
  std::call_once(generators.created, [&generators] {
    for (int i = 0; i < device_count(); ++i) {
      generators.per_device.push_back(at::make_generator<at::CPUGeneratorImpl>());
    }
  });
  return generators.per_device[index];
}

c10::optional<c10::Device> device_of_pointer(const void* data) { return memory_table().find(data); }

void resize_storage_bytes(c10::StorageImpl* storage, std::size_t bytes) {
  const c10::DeviceGuard guard(storage->device());
  at::native::resize_bytes_cpu(storage, bytes);
}

}  // namespace fulgor::emulated

int fulgor_emulated_device_count() { return fulgor::emulated::device_count(); }

int64_t fulgor_emulated_memory_allocated(int device_type, int index) {
  return fulgor::emulated::memory_table().allocated(device_type, index);
}

int64_t fulgor_emulated_memory_peak(int device_type, int index) {
  return fulgor::emulated::memory_table().peak(device_type, index);
}

int64_t fulgor_emulated_host_reads() { return fulgor::emulated::host_reads.load(); }

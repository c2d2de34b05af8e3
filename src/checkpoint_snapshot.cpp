#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/torch.h>

#include <vector>

#include "fulgor/checkpoint.h"

namespace fulgor::detail {
namespace {

// Note [Snapshots of an archive]
// An OutputArchive keeps references to the tensors written into it (the
// module's parameters, the optimizers' state), not copies, and serialises
// them only when it is saved. An asynchronous save serialises on another
// thread while training goes on updating those tensors in place, so the
// archive is first made to hold copies of its own: every tensor it refers to,
// however nested (a submodule's archive, LBFGS's lists of tensors), is
// replaced by a copy in host memory. LibTorch gives no way to walk an
// archive's contents; the archive is a TorchScript object (its private member
// module_, of the same name and type in LibTorch 1.13 to 2.x), reached here
// through the explicit instantiation of a template naming that member, which
// the language exempts from access checks. Copies keep their strides, dtype
// and requires_grad. LibTorch's pickler memoizes a tensor that has other
// owners besides the archive (a parameter: the module's), which changes the
// bytes though not what is read; so the copies of such tensors are given an
// owner too, kept with the archive until it is written, and the file written
// from a snapshot is byte for byte the one written from the live tensors.
torch::jit::Module& archive_object(torch::serialize::OutputArchive& archive);

template <torch::jit::Module torch::serialize::OutputArchive::*Member>
struct ArchiveObject {
  friend torch::jit::Module& archive_object(torch::serialize::OutputArchive& archive) { return archive.*Member; }
};
template struct ArchiveObject<&torch::serialize::OutputArchive::module_>;

class HostCopier {
 public:
  explicit HostCopier(bool pin) : pin_(pin) {}

  c10::IValue copy(const c10::IValue& value) {
    if (value.isTensor()) return copy(value.toTensor());
    if (value.isObject()) {
      copy_slots(*value.toObject());
      return value;
    }
    if (value.isTensorList()) {
      c10::List<at::Tensor> copied;
      for (const at::Tensor& t : value.toTensorVector()) copied.push_back(copy(t));
      return copied;
    }
    if (value.isList()) {
      const auto list = value.toList();
      c10::impl::GenericList copied(list.elementType());
      for (const c10::IValue& element : list) copied.push_back(copy(element));
      return copied;
    }
    if (value.isGenericDict()) {
      const auto dict = value.toGenericDict();
      c10::impl::GenericDict copied(dict.keyType(), dict.valueType());
      for (const auto& entry : dict) copied.insert(entry.key(), copy(entry.value()));
      return copied;
    }
    if (value.isTuple()) {
      const auto tuple = value.toTuple();
      std::vector<c10::IValue> elements;
      for (const c10::IValue& element : tuple->elements()) elements.push_back(copy(element));
      return c10::ivalue::Tuple::create(std::move(elements));
    }
    return value;
  }

  // An archive's object (and a nested archive's) belongs to the archive
  // alone, so its slots are replaced in place.
  void copy_slots(c10::ivalue::Object& object) {
    for (size_t i = 0; i < object.slots().size(); ++i) object.setSlot(i, copy(object.getSlot(i)));
  }

  std::vector<at::Tensor> take_owned() { return std::move(owned_); }

 private:
  at::Tensor copy(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    // The archive's slot and `tensor` (the caller's) are the same reference.
    const bool shared = tensor.use_count() > 1;
    const bool pin = pin_ && !tensor.is_cpu();
    at::Tensor copied =
        at::empty_like(tensor, tensor.options().device(at::kCPU).pinned_memory(pin), at::MemoryFormat::Preserve);
    copied.copy_(tensor);
    if (tensor.requires_grad()) copied.requires_grad_(true);
    if (shared) owned_.push_back(copied);
    return copied;
  }

  bool pin_;
  std::vector<at::Tensor> owned_;
};

}  // namespace

std::vector<torch::Tensor> snapshot_to_host(torch::serialize::OutputArchive& archive, bool pin) {
  torch::NoGradGuard no_grad;
  HostCopier copier(pin);
  copier.copy_slots(*archive_object(archive)._ivalue());
  return copier.take_owned();
}

}  // namespace fulgor::detail

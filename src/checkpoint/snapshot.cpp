#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/torch.h>

#include <vector>

#include "fulgor/checkpoint/checkpoint.h"
#include "detail/huge_pages.h"

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

// Note [Reusing snapshot memory]
// Memory fresh from the allocator costs a page fault per page on first
// touch, which made the copy of a 100 MB state take a third of a synchronous
// save. A Trainer snapshots the same tensors at every save, in the same
// order, so each copy takes the storage of the same tensor's copy in the
// previous snapshot, whose write has completed by then. Storages, not
// tensors, are kept: a tensor's owners change the archive's bytes (Note
// [Snapshots of an archive]), a storage's do not.
class HostCopier {
 public:
  HostCopier(bool pin, std::vector<c10::Storage> spares) : pin_(pin), spares_(std::move(spares)) {}

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
      for (const auto& element : list) copied.push_back(copy(element));  // the proxy itself: -Wdangling-reference
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
  std::vector<c10::Storage> take_storages() { return std::move(storages_); }

 private:
  at::Tensor copy(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    // The archive's slot and `tensor` (the caller's) are the same reference.
    const bool shared = tensor.use_count() > 1;
    at::Tensor copied = allocate(tensor);
    copied.copy_(tensor);
    if (tensor.requires_grad()) copied.requires_grad_(true);
    if (shared) owned_.push_back(copied);
    return copied;
  }

  // Note [Reusing snapshot memory]
  at::Tensor allocate(const at::Tensor& tensor) {
    const bool pin = pin_ && !tensor.is_cpu();
    const auto options = tensor.options().device(at::kCPU).pinned_memory(pin);
    const size_t index = storages_.size();
    const auto bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
    at::Tensor copied;
    if (index < spares_.size() && tensor.is_non_overlapping_and_dense() && spares_[index].nbytes() == bytes &&
        spares_[index].device().is_cpu()) {
      copied = at::empty({0}, options).set_(spares_[index], 0, tensor.sizes(), tensor.strides());
    } else {
      copied = at::empty_like(tensor, options, at::MemoryFormat::Preserve);
      if (!pin)
        advise_huge_pages(copied.data_ptr(), copied.storage().nbytes());  // Note [Huge pages for fresh tensor memory]
    }
    storages_.push_back(copied.storage());
    return copied;
  }

  bool pin_;
  std::vector<c10::Storage> spares_, storages_;
  std::vector<at::Tensor> owned_;
};

}  // namespace

std::vector<torch::Tensor> snapshot_to_host(torch::serialize::OutputArchive& archive, bool pin,
                                            std::vector<c10::Storage>& storages) {
  torch::NoGradGuard no_grad;
  HostCopier copier(pin, std::move(storages));
  copier.copy_slots(*archive_object(archive)._ivalue());
  storages = copier.take_storages();
  return copier.take_owned();
}

}  // namespace fulgor::detail

#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/types.h>

#include <string>

namespace fulgor {
class Accelerator;
namespace detail {

// Moves `tensor` onto `device` in place: every holder of the tensor sees it
// there (Note [Moving parameters in place] in accelerator.cpp). `what` names
// it in the error for a tensor that cannot be moved so.
void move_in_place(const Accelerator& accelerator, const torch::Tensor& tensor, torch::Device device,
                   const std::string& what);

// Moves every tensor of a checkpoint archive (nested archives and lists
// included) onto `device` in place: the optimizer state loaded from it then
// lives there (Note [Optimizer state on the device] in accelerator.cpp).
void move_archive_tensors(torch::serialize::InputArchive& archive, const Accelerator& accelerator, torch::Device device,
                          const std::string& where);

}  // namespace detail
}  // namespace fulgor

#pragma once

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

}  // namespace detail
}  // namespace fulgor

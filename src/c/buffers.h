#pragma once

// The caller's buffers as tensors: a pointer, a dtype, a shape and a rank,
// checked before anything reads them.

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "fulgor/c/fulgor.h"

namespace fulgor::c_api {

/// A view of the caller's buffer on `device`, never written to by fulgor
/// unless it is an output. FULGOR_ERROR_ARGUMENT for a null pointer, an
/// unknown dtype, a rank outside 0 to 16, a negative size;
/// FULGOR_ERROR_SHAPE for sizes whose element count overflows.
torch::Tensor view_of(const void* data, fulgor_dtype dtype, const int64_t* shape, int32_t rank, torch::Device device,
                      const char* what);

/// "[32, 4] Float".
std::string describe(const torch::Tensor& t);

/// The label as `loss` takes it against `output`: the output's shape and a
/// floating type for a regression loss, the output's shape without the class
/// dimension and an integer type for a classification loss; else
/// FULGOR_ERROR_SHAPE.
torch::Tensor checked_label(const std::string& loss, const torch::Tensor& output, torch::Tensor label);

}  // namespace fulgor::c_api

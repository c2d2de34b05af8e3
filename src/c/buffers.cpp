#include "c/buffers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <vector>

#include "c/failure.h"

namespace fulgor::c_api {
namespace {

torch::ScalarType scalar_type(fulgor_dtype dtype, const char* what) {
  switch (dtype) {
    case FULGOR_FLOAT32:
      return torch::kFloat;
    case FULGOR_FLOAT64:
      return torch::kDouble;
    case FULGOR_INT32:
      return torch::kInt;
    case FULGOR_INT64:
      return torch::kLong;
  }
  fail(FULGOR_ERROR_ARGUMENT,
       fmt::format("{} dtype {} is unknown; known: FULGOR_FLOAT32, FULGOR_FLOAT64, FULGOR_INT32, FULGOR_INT64", what,
                   static_cast<int>(dtype)));
}

std::vector<int64_t> shape_of(const int64_t* shape, int32_t rank, size_t element_size, const char* what) {
  if (rank < 0 || rank > 16) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} rank {}: expected 0 to 16", what, rank));
  if (rank > 0 && shape == nullptr) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} shape is a null pointer", what));
  std::vector<int64_t> sizes(shape, shape + rank);
  for (int64_t size : sizes)
    if (size < 0)
      fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} shape [{}] has a negative size", what, fmt::join(sizes, ", ")));
  // A buffer's bytes must be countable: LibTorch would wrap the count around.
  int64_t bytes = static_cast<int64_t>(element_size);
  for (int64_t size : sizes)
    if (size != 0 && bytes > std::numeric_limits<int64_t>::max() / size)
      fail(FULGOR_ERROR_SHAPE, fmt::format("{} shape [{}] holds more bytes than 2^63: not a buffer in memory", what,
                                           fmt::join(sizes, ", ")));
    else
      bytes *= size;
  return sizes;
}

}  // namespace

torch::Tensor view_of(const void* data, fulgor_dtype dtype, const int64_t* shape, int32_t rank, torch::Device device,
                      const char* what) {
  if (data == nullptr) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} is a null pointer", what));
  const auto options = torch::TensorOptions().dtype(scalar_type(dtype, what)).device(device);
  return torch::from_blob(const_cast<void*>(data), shape_of(shape, rank, options.dtype().itemsize(), what), options);
}

std::string describe(const torch::Tensor& t) {
  return fmt::format("[{}] {}", fmt::join(t.sizes(), ", "), c10::toString(t.scalar_type()));
}

torch::Tensor checked_label(const std::string& loss, const torch::Tensor& output, torch::Tensor label) {
  if (loss == "cross_entropy" || loss == "nll") {
    if (label.is_floating_point() || output.dim() < 1 || label.dim() != output.dim() - 1 ||
        (label.dim() > 0 && label.size(0) != output.size(0)))
      fail(FULGOR_ERROR_SHAPE, fmt::format("label {} does not fit loss '{}' of output {}: expected class indices of an "
                                           "integer dtype, one per row of the output",
                                           describe(label), loss, describe(output)));
    return label.to(torch::kLong);
  }
  if (label.sizes() != output.sizes() || !label.is_floating_point())
    fail(FULGOR_ERROR_SHAPE, fmt::format("label {} does not fit loss '{}' of output {}: expected the output's shape "
                                         "and a floating-point dtype",
                                         describe(label), loss, describe(output)));
  return label.to(output.scalar_type());
}

}  // namespace fulgor::c_api

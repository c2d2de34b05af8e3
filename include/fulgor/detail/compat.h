#pragma once

// Note [One LibTorch]
// Every difference between the LibTorch versions fulgor supports (1.13 and
// 2.x) is answered here, so that the rest of the code reads as if there were
// one LibTorch. Add a function here rather than a version check elsewhere.

#include <torch/version.h>

#include <string>

#define FULGOR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fulgor::detail::compat {

/// Whether this LibTorch lets a library name the PrivateUse1 device type and
/// register its hooks (2.1 and later).
constexpr bool kHasNamedPrivateUse1 = FULGOR_TORCH_AT_LEAST(2, 1);

/// The name PrivateUse1 was renamed to, or "" when no backend renamed it (and
/// always "" where renaming does not exist).
std::string privateuse1_backend_name();

}  // namespace fulgor::detail::compat

#include "fulgor/detail/compat.h"

#include <c10/core/DeviceType.h>

namespace fulgor::detail::compat {

std::string privateuse1_backend_name() {
#if FULGOR_TORCH_AT_LEAST(2, 1)
  return c10::is_privateuse1_backend_registered() ? c10::get_privateuse1_backend() : std::string();
#else
  return {};
#endif
}

}  // namespace fulgor::detail::compat

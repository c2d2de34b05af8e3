#include "fulgor/callback.h"

#include <string>
#include <typeinfo>

#include "detail/demangle.h"
#include "fulgor/core/error.h"

namespace fulgor {

namespace impl {
using detail::demangle;

void throw_batch_type_mismatch(bool took, const std::type_info* held, const std::type_info& asked) {
  if (took || held == nullptr)
    throw Error("BatchEnd::batch<" + demangle(asked.name()) +
                ">(): the step took the batch, whose type cannot be copied; a hook sees the batch of a copyable "
                "batch type only");
  throw Error("BatchEnd::batch<" + demangle(asked.name()) + ">(): the batch is a " + demangle(held->name()) +
              "; ask for the module's batch type");
}
}  // namespace impl

std::string Callback::state_key() const { return detail::demangle(typeid(*this).name()); }

}  // namespace fulgor

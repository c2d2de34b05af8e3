#include "fulgor/data_module.h"

#include <fmt/format.h>

#include <typeinfo>

#include "detail/demangle.h"
#include "fulgor/core/error.h"

namespace fulgor {

std::string DataModuleBase::name() const { return detail::demangle(typeid(*this).name()); }

Trainer& DataModuleBase::trainer() const {
  if (trainer_ == nullptr) throw Error(fmt::format("{} is not attached to a Trainer", name()));
  return *trainer_;
}

}  // namespace fulgor

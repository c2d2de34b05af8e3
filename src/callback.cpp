#include "fulgor/callback.h"

#include <string>
#include <typeinfo>

#include "demangle.h"

namespace fulgor {

std::string Callback::state_key() const { return detail::demangle(typeid(*this).name()); }

}  // namespace fulgor

#pragma once

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace fulgor::detail {

// A type's name as written in C++ ("fulgor::EarlyStopping"), from typeid's.
inline std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? out.get() : name;
}

}  // namespace fulgor::detail

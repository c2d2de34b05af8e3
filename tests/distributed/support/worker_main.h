#pragma once

// How every distributed worker program ends: its status, or 3 with the
// message on a fulgor::Error and 4 on any other exception, which the tests
// read as "failed as fulgor reports it" and "failed otherwise".

#include <cstdint>
#include <exception>
#include <iostream>

#include "fulgor/core/error.h"

namespace fulgor::test {

/// Runs `body` (returning the program's status); `rank` is read when an
/// exception is reported, so the body may set it once it knows it.
template <typename Body>
int run_worker(const int64_t& rank, Body&& body) {
  try {
    return body();
  } catch (const fulgor::Error& e) {
    std::cerr << "worker rank " << rank << ": " << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "worker rank " << rank << ": unexpected " << e.what() << std::endl;
    return 4;
  }
}

}  // namespace fulgor::test

#pragma once

// How the C API's parts report what a call failed with: a status of
// include/fulgor/c/fulgor.h and a message, turned into the call's return
// value and fulgor_last_error() at its boundary (fulgor_c.cpp).

#include <string>
#include <utility>

#include "fulgor/c/fulgor.h"

namespace fulgor::c_api {

/// What a call failed with: its status and message.
struct Failure {
  fulgor_status status;
  std::string message;
};

[[noreturn]] inline void fail(fulgor_status status, std::string message) { throw Failure{status, std::move(message)}; }

}  // namespace fulgor::c_api

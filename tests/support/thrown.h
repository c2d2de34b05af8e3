#pragma once

// The message of the error a call must throw.

#include <string>

#include <gtest/gtest.h>

namespace fulgor::test {

// What the E that `f` throws says; a test failure when it throws none.
template <typename E, typename F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return {};
}

}  // namespace fulgor::test

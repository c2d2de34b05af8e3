#pragma once

// Reference values computed by python3-torch: a script run once, writing JSON.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace fulgor::test {

// Runs `script` with Debian's python3 (which sees python3-torch) as
// `python3 script OUT.json` and returns what it wrote; throws, naming the
// command and the package, when it fails.
inline nlohmann::json python_reference(const std::string& python, const std::string& script, const std::string& tag) {
  const std::string path = ::testing::TempDir() + "fulgor_" + tag + "_" + std::to_string(::getpid()) + ".json";
  const std::string command = python + " -W ignore " + script + " " + path + " 2>&1";
  const int status = std::system(command.c_str());
  if (status != 0)
    throw std::runtime_error(command + " failed (status " + std::to_string(status) +
                             "): the reference needs python3-torch (apt-get install python3-torch)");
  std::ifstream in(path);
  nlohmann::json json = nlohmann::json::parse(in);
  std::remove(path.c_str());
  return json;
}

}  // namespace fulgor::test

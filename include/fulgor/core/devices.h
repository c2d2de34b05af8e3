#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// Which devices a Trainer uses, with PyTorch Lightning's meanings:
///   "auto"            the accelerator's auto_device_count() devices (one process on the CPU)
///   -1 or "-1"        every device
///   N or "N"          the first N devices (on the CPU: N processes)
///   "0,1", "1,"       those device indices
///   {0, 2}            those device indices
///
/// Requires: nothing; any value converts. Whether it is valid depends on the
/// accelerator, and Accelerator::parse_devices says why when it is not.
class FULGOR_API Devices {
 public:
  using Value = std::variant<int64_t, std::string, std::vector<int64_t>>;

  Devices() : value_(std::string("auto")) {}
  Devices(int count) : value_(static_cast<int64_t>(count)) {}
  Devices(int64_t count) : value_(count) {}
  Devices(const char* spec) : value_(std::string(spec)) {}
  Devices(std::string spec) : value_(std::move(spec)) {}
  Devices(std::vector<int64_t> indices) : value_(std::move(indices)) {}
  Devices(const std::vector<int>& indices) : value_(std::vector<int64_t>(indices.begin(), indices.end())) {}
  Devices(std::initializer_list<int64_t> indices) : value_(std::vector<int64_t>(indices)) {}

  const Value& value() const { return value_; }
  /// Whether the value is "auto", which each accelerator resolves itself.
  bool is_auto() const;

  /// The value as a user would have typed it: `auto`, `2`, `"0,1"`, `[0, 2]`.
  std::string str() const;

  friend bool operator==(const Devices& a, const Devices& b) { return a.value_ == b.value_; }
  friend bool operator!=(const Devices& a, const Devices& b) { return !(a == b); }

 private:
  Value value_;
};

/// The most devices, or processes on the CPU, one `devices` value may select:
/// more than any machine has, few enough that a typo (devices=100000000000)
/// is refused before anything is allocated for it.
inline constexpr int64_t kMaxDevices = 65536;

/// Lightning's GPU semantics: the value as device indices on an accelerator with
/// `available` devices. Rejects 0, "0", empty lists, duplicates, negative numbers
/// other than -1, indices past the count and counts above kMaxDevices, with a
/// ConfigError naming the value and the count. `accelerator` names the
/// accelerator in messages.
FULGOR_API std::vector<int64_t> parse_device_indices(const Devices& devices, int64_t available,
                                                     const std::string& accelerator);

/// Lightning's CPU semantics: a number of processes, "auto" meaning 1, at most
/// kMaxDevices (ConfigError naming the value and the limit).
FULGOR_API int64_t parse_process_count(const Devices& devices, const std::string& accelerator);

}  // namespace fulgor

#include "fulgor/core/devices.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "fulgor/core/error.h"

namespace fulgor {

std::string Devices::str() const {
  struct Show {
    std::string operator()(int64_t n) const { return std::to_string(n); }
    std::string operator()(const std::string& s) const { return s == "auto" ? s : fmt::format("\"{}\"", s); }
    std::string operator()(const std::vector<int64_t>& v) const { return fmt::format("[{}]", fmt::join(v, ", ")); }
  };
  return std::visit(Show{}, value_);
}

namespace {

std::string trim(const std::string& s) {
  auto begin = std::find_if_not(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
  auto end = std::find_if_not(s.rbegin(), s.rend(), [](unsigned char c) { return std::isspace(c); }).base();
  return begin < end ? std::string(begin, end) : std::string();
}

// Parses an optionally signed decimal integer, the whole string.
bool parse_int(const std::string& text, int64_t& out) {
  std::string s = trim(text);
  if (s.empty()) return false;
  size_t digits = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (digits == s.size()) return false;
  for (size_t i = digits; i < s.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  try {
    out = std::stoll(s);
  } catch (const std::out_of_range&) {
    return false;
  }
  return true;
}

const char* kAccepted = "accepted: \"auto\", -1, a count N >= 1, \"N\", a list of indices like \"0,1\" or {0, 2}";

[[noreturn]] void reject(const Devices& devices, const std::string& accelerator, const std::string& why) {
  throw ConfigError(
      fmt::format("devices={} is not valid for accelerator '{}': {} ({})", devices.str(), accelerator, why, kAccepted));
}

std::vector<int64_t> first_n(int64_t n) {
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  return indices;
}

// A count (-1 for "auto") or an explicit list, as Lightning's _parse_gpu_ids
// normalises `devices`.
struct Selection {
  bool is_count = false;
  int64_t count = 0;
  std::vector<int64_t> indices;
};

std::vector<int64_t> parse_index_list(const std::string& s, const Devices& devices, const std::string& accelerator) {
  std::vector<int64_t> indices;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string part = trim(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!part.empty()) {
      int64_t index = 0;
      if (!parse_int(part, index)) reject(devices, accelerator, fmt::format("'{}' is not an integer", part));
      indices.push_back(index);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return indices;
}

Selection selection_of(const Devices& devices, const std::string& accelerator) {
  if (auto n = std::get_if<int64_t>(&devices.value())) return {true, *n, {}};
  if (auto list = std::get_if<std::vector<int64_t>>(&devices.value())) return {false, 0, *list};
  const std::string s = trim(std::get<std::string>(devices.value()));
  if (s == "auto") return {true, -1, {}};
  if (s.find(',') != std::string::npos) return {false, 0, parse_index_list(s, devices, accelerator)};
  int64_t count = 0;
  if (!parse_int(s, count)) reject(devices, accelerator, "not a number, a list of indices or \"auto\"");
  return {true, count, {}};
}

std::vector<int64_t> first_devices(int64_t count, int64_t available, const Devices& devices,
                                   const std::string& accelerator) {
  if (count == -1) {
    if (available == 0) reject(devices, accelerator, "no devices are available");
    if (available > kMaxDevices)
      reject(devices, accelerator,
             fmt::format("the accelerator counts {} devices, more than the limit of {}", available, kMaxDevices));
    return first_n(available);
  }
  if (count == 0) reject(devices, accelerator, "0 devices selects nothing");
  if (count < 0) reject(devices, accelerator, fmt::format("the count {} is negative", count));
  if (count > kMaxDevices)
    reject(devices, accelerator, fmt::format("{} devices is more than the limit of {}", count, kMaxDevices));
  if (count > available)
    reject(devices, accelerator, fmt::format("{} devices requested but only {} available", count, available));
  return first_n(count);
}

}  // namespace

bool Devices::is_auto() const {
  const auto* spec = std::get_if<std::string>(&value_);
  return spec != nullptr && trim(*spec) == "auto";
}

std::vector<int64_t> parse_device_indices(const Devices& devices, int64_t available, const std::string& accelerator) {
  Selection selection = selection_of(devices, accelerator);
  if (selection.is_count) return first_devices(selection.count, available, devices, accelerator);
  if (selection.indices.empty()) reject(devices, accelerator, "the list of indices is empty");
  std::set<int64_t> seen;
  for (int64_t index : selection.indices) {
    if (index < 0) reject(devices, accelerator, fmt::format("index {} is negative", index));
    if (index >= available)
      reject(devices, accelerator,
             fmt::format("index {} does not exist: {} device(s) available, indices 0..{}", index, available,
                         available - 1));
    if (!seen.insert(index).second) reject(devices, accelerator, fmt::format("index {} appears twice", index));
  }
  return std::move(selection.indices);
}

int64_t parse_process_count(const Devices& devices, const std::string& accelerator) {
  int64_t count = 0;
  if (auto n = std::get_if<int64_t>(&devices.value())) {
    count = *n;
  } else if (auto s = std::get_if<std::string>(&devices.value())) {
    if (trim(*s) == "auto") return 1;
    if (!parse_int(*s, count)) count = 0;
  }
  if (count <= 0)
    throw ConfigError(
        fmt::format("devices={} is not valid for accelerator '{}': it takes a number of processes, "
                    "an integer >= 1 or \"auto\" (one process)",
                    devices.str(), accelerator));
  if (count > kMaxDevices)
    throw ConfigError(
        fmt::format("devices={} is not valid for accelerator '{}': {} processes is more than the limit of {}",
                    devices.str(), accelerator, count, kMaxDevices));
  return count;
}

}  // namespace fulgor

// `devices` values as a user types them, and as the integers JSON gives.

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fulgor/core/devices.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fuzz.h"

namespace fulgor::fuzz {
namespace {

void parse_everywhere(const Devices& devices) {
  // Accelerators with no device, one, a few, and more than the limit.
  for (int64_t available : {int64_t{0}, int64_t{1}, int64_t{8}, kMaxDevices + 1}) {
    try {
      const std::vector<int64_t> indices = parse_device_indices(devices, available, "fuzz");
      require(!indices.empty() && static_cast<int64_t>(indices.size()) <= available,
              "parse_device_indices selects between 1 and `available` devices");
      const std::set<int64_t> distinct(indices.begin(), indices.end());
      require(distinct.size() == indices.size() && *distinct.begin() >= 0 && *distinct.rbegin() < available,
              "parse_device_indices gives distinct indices of available devices");
    } catch (const Error&) {
    }
  }
  try {
    const int64_t count = parse_process_count(devices, "cpu");
    require(count >= 1 && count <= kMaxDevices, "parse_process_count gives 1 to kMaxDevices processes");
  } catch (const Error&) {
  }
  static const std::unique_ptr<Accelerator> cpu = make_accelerator("cpu");
  try {
    require(!cpu->parse_devices(devices).empty(), "the CPU selects at least one device");
  } catch (const Error&) {
  }
}

}  // namespace

void devices(const uint8_t* data, size_t size) {
  parse_everywhere(Devices(std::string(reinterpret_cast<const char*>(data), size)));
  // The same bytes as the integers a JSON value would give: a count, and a list of indices.
  std::vector<int64_t> numbers(size / sizeof(int64_t));
  if (!numbers.empty()) std::memcpy(numbers.data(), data, numbers.size() * sizeof(int64_t));
  if (!numbers.empty()) parse_everywhere(Devices(numbers.front()));
  parse_everywhere(Devices(numbers));
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::devices)

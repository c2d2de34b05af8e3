// The .metadata of a distributed checkpoint, read with the checks of
// Note [A distributed checkpoint from elsewhere]; what is taken is written
// back and must read back the same, and its paths nest the values again or
// are refused (as read_distributed_checkpoint nests them).

#include "fulgor/core/error.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "fuzz.h"
#include "interop/dcp_metadata.h"

namespace fulgor::fuzz {

void dcp_metadata(const uint8_t* data, size_t size) {
  detail::DcpMetadata metadata;
  try {
    metadata = detail::read_dcp_metadata(data, size, "fuzz input");
  } catch (const Error&) {
    return;
  }
  std::string again = detail::write_dcp_metadata(metadata);
  auto back = detail::read_dcp_metadata(reinterpret_cast<const uint8_t*>(again.data()), again.size(), "written back");
  require(back.entries.size() == metadata.entries.size(), "the metadata reads back with as many keys");
  for (size_t i = 0; i < back.entries.size(); ++i) {
    const auto& a = metadata.entries[i];
    const auto& b = back.entries[i];
    require(a.fqn == b.fqn && a.is_tensor == b.is_tensor && a.size == b.size && a.chunks.size() == b.chunks.size(),
            "each key reads back the same");
  }
  DistributedStateDict values;
  for (const auto& entry : metadata.entries)
    values.push_back({entry.path.empty() ? std::vector<c10::IValue>{entry.fqn} : entry.path, int64_t{0}, std::nullopt});
  try {
    unflatten_state_dict(values);
  } catch (const Error&) {
  }
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::dcp_metadata)

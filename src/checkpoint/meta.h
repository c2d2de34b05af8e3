#pragma once

// The metadata of a fulgor training checkpoint, for the checkpoint functions
// (read_checkpoint_meta, load_module_weights) and the Trainer's connector.

#include <torch/serialize/input-archive.h>
#include <nlohmann/json.hpp>

#include <string>

namespace fulgor::detail {

constexpr const char* kCheckpointFormat = "fulgor-checkpoint";
constexpr int kCheckpointFormatVersion = 1;

// The "meta" entry of a checkpoint's archive, checked: a fulgor training
// checkpoint of the version this fulgor reads, whose loop progress,
// optimizer, scheduler and callback entries have the types the connector
// reads. The one parser of it; throws CheckpointError naming the file and
// the entry.
nlohmann::json parse_checkpoint_meta(torch::serialize::InputArchive& archive, const std::string& path);

}  // namespace fulgor::detail

#include "checkpoint/meta.h"

#include <fmt/format.h>

#include <cstdint>

#include "fulgor/core/error.h"
#include "config/json_input.h"

namespace fulgor::detail {

namespace {

// Note [Checkpoint metadata]
// A checkpoint's metadata comes from a file, which may be damaged or not
// ours: before the restore trusts it, parse_checkpoint_meta checks the keys
// the restore reads for the types and ranges the writer gives them, so that a
// bad file is a CheckpointError naming the key, not a JSON library's error or
// a loop resumed at epoch -10^12 that never ends. The states of the module,
// the callbacks and the schedulers are theirs to read; a JSON library error
// from them becomes a CheckpointError naming the state (`restoring` in
// trainer/checkpoint_connector.cpp).

// The largest loop counter a checkpoint may give: room for the loops'
// arithmetic on it (an epoch or a step more) without overflow.
constexpr int64_t kMaxCounter = int64_t{1} << 62;

using Fits = bool (*)(const nlohmann::json&);

// Checks that parent[key] exists and `fits`; `where` is the parent's path.
void require(const nlohmann::json& parent, const std::string& path, const char* where, const char* key, Fits fits,
             const char* expected) {
  const auto it = parent.find(key);
  if (it != parent.end() && fits(*it)) return;
  throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata: '{}{}' is {}, expected {}", path, where,
                                    key, it == parent.end() ? "missing" : json_for_message(*it), expected));
}

}  // namespace

nlohmann::json parse_checkpoint_meta(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue entry;
  if (!archive.try_read("meta", entry) || !entry.isString())
    throw CheckpointError(fmt::format("checkpoint '{}' has no metadata entry", path));
  JsonInput input = read_json(entry.toStringRef());
  if (!input.error.empty())
    throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata: {}", path, input.error));
  nlohmann::json& json = input.value;
  if (!json.is_object())
    throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata: not a JSON object", path));
  const auto format = json.find("format");
  if (format == json.end() || !format->is_string() || *format != kCheckpointFormat)
    throw CheckpointError(
        fmt::format("'{}' is not a fulgor training checkpoint (its metadata has no format \"{}\")", path, kCheckpointFormat));
  const auto version = json.find("format_version");
  if (version == json.end() || !version->is_number_integer() || *version != kCheckpointFormatVersion)
    throw CheckpointError(fmt::format("checkpoint '{}' has format version {}; this fulgor reads version {}", path,
                                      version == json.end() ? "none" : json_for_message(*version), kCheckpointFormatVersion));
  const Fits counter = [](const nlohmann::json& v) { return v.is_number_integer() && v >= 0 && v <= kMaxCounter; };
  const Fits boolean = [](const nlohmann::json& v) { return v.is_boolean(); };
  const Fits string = [](const nlohmann::json& v) { return v.is_string(); };
  const Fits array = [](const nlohmann::json& v) { return v.is_array(); };
  const Fits object = [](const nlohmann::json& v) { return v.is_object(); };
  const char* counter_range = "an integer from 0 to 2^62";
  require(json, path, "", "loop", object, "an object");
  const auto& loop = json.at("loop");
  for (const char* key : {"epoch", "global_step", "batches_in_epoch", "total_train_batches"})
    require(loop, path, "loop.", key, counter, counter_range);
  require(loop, path, "loop.", "epoch_finished", boolean, "true or false");
  // Saved by a manual optimization's fit only.
  if (loop.contains("batches_that_stepped"))
    require(loop, path, "loop.", "batches_that_stepped", counter, counter_range);
  require(json, path, "", "optimizers", counter, counter_range);
  require(json, path, "", "schedulers", array, "an array");
  require(json, path, "", "callbacks", object, "an object");
  require(json, path, "", "module", object, "an object");
  require(json, path, "", "accelerator", string, "a string");
  // Saved by a fit with a data module only.
  if (const auto dm = json.find("datamodule"); dm != json.end()) {
    require(json, path, "", "datamodule", object, "an object");
    require(*dm, path, "datamodule.", "name", string, "a string");
    const Fits any = [](const nlohmann::json&) { return true; };
    require(*dm, path, "datamodule.", "state", any, "a value");
    require(*dm, path, "datamodule.", "hparams", any, "a value");
  }
  return std::move(json);
}

}  // namespace fulgor::detail

#include "interop/sharded_checkpoint.h"

#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "checkpoint/meta.h"
#include "distributed/parameter_shards.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/optimizer_state.h"
#include "fulgor/interop/state_dict.h"
#include "fulgor/interop/torch_load.h"
#include "interop/dcp_metadata.h"
#include "interop/ivalue_dict.h"
#include "interop/python_checkpoint.h"

namespace fulgor::detail {
namespace {

// A box of a tensor: `extents` elements from `offsets` on in each dimension.
struct Box {
  std::vector<int64_t> offsets, extents;
};

// Appends the fewest boxes, in row-major order, that the elements [begin,
// end) of the flattened tensor of `sizes` make up (Note [Sharded training
// checkpoints]): within dimension `dim`, below the rows `prefix` names.
void add_boxes(const std::vector<int64_t>& sizes, size_t dim, std::vector<int64_t>& prefix, int64_t begin, int64_t end,
               std::vector<Box>& out) {
  if (begin >= end) return;
  if (dim == sizes.size()) {  // a scalar
    out.push_back(Box{prefix, {}});
    return;
  }
  int64_t row = 1;  // elements of one index of `dim`
  for (size_t d = dim + 1; d < sizes.size(); ++d) row *= sizes[d];
  auto partial = [&](int64_t index, int64_t from, int64_t to) {
    prefix.push_back(index);
    add_boxes(sizes, dim + 1, prefix, from - index * row, to - index * row, out);
    prefix.pop_back();
  };
  if (begin % row != 0 || end - begin < row) {
    const int64_t stop = std::min(end, (begin / row + 1) * row);
    partial(begin / row, begin, stop);
    begin = stop;
  }
  if (const int64_t rows = (end - begin) / row; rows > 0) {
    Box box{prefix, std::vector<int64_t>(prefix.size(), 1)};
    box.offsets.push_back(begin / row);
    box.offsets.resize(sizes.size(), 0);
    box.extents.push_back(rows);
    box.extents.insert(box.extents.end(), sizes.begin() + static_cast<std::ptrdiff_t>(dim) + 1, sizes.end());
    out.push_back(std::move(box));
    begin += rows * row;
  }
  if (begin < end) partial(begin / row, begin, end);
}

// Adds this rank's piece of `place`'s parameter at `path`: `flat`, a tensor
// of the shard's size, holds it in its first elements.
void add_piece(DistributedStateDict& state, const std::vector<c10::IValue>& path, const torch::Tensor& flat,
               const ParameterShards::Place& place) {
  const std::vector<int64_t> sizes = place.param.sizes().vec();
  std::vector<Box> boxes;
  std::vector<int64_t> prefix;
  add_boxes(sizes, 0, prefix, place.begin, place.end, boxes);
  const torch::Tensor values = flat.detach().reshape({-1});
  int64_t at = 0;
  for (Box& box : boxes) {
    int64_t numel = 1;
    for (int64_t extent : box.extents) numel *= extent;
    state.push_back(DistributedCheckpointEntry{path, values.narrow(0, at, numel).view(box.extents),
                                               TensorPlacement{std::move(box.offsets), sizes}});
    at += numel;
  }
}

c10::impl::GenericDict dict_of(const std::string& key, c10::IValue value) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert(key, std::move(value));
  return dict;
}

std::optional<ParameterShards::Place> place_in(const ShardSets& shards, const torch::Tensor& tensor) {
  for (const ParameterShards* set : shards)
    if (auto place = set->place_of(tensor)) return place;
  return std::nullopt;
}

}  // namespace

void add_module_entries(DistributedStateDict& state, const std::string& key, const torch::nn::Module& module,
                        const ShardSets& shards) {
  for (const auto& item : state_dict_of(module)) {
    const std::vector<c10::IValue> path{key, item.key()};
    const auto place = place_in(shards, item.value());
    if (place && place->released)
      add_piece(state, path, place->shard, *place);
    else
      state.push_back(DistributedCheckpointEntry{path, item.value().detach(), std::nullopt});
  }
}

void add_optimizer_entries(DistributedStateDict& state, const std::string& key,
                           const torch::optim::Optimizer& optimizer, const ShardSets& shards,
                           const ParameterNames& names) {
  std::vector<torch::Tensor> stepped, params;  // by torch.optim's numbers: what the groups hold, whose it is
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const auto place = place_in(shards, p);
      stepped.push_back(p);
      params.push_back(place ? place->param : p);
    }
  c10::IValue exported = export_optimizer_state(optimizer);
  std::map<std::string, size_t> number;  // by the keys of the saved state
  const auto keys = names_of(params, names);
  if (keys) exported = by_parameter_names(exported, *keys);
  for (size_t i = 0; i < params.size(); ++i) number[keys ? (*keys)[i] : std::to_string(i)] = i;
  for (auto& entry : flatten_state_dict(dict_of(key, exported))) {
    // [key, "state", parameter, name]: a state tensor of the shard's size is a piece.
    const auto& path = entry.path;
    const bool per_parameter = path.size() == 4 && path[1].isString() && path[1].toStringRef() == "state" &&
                               path[2].isString() && entry.value.isTensor();
    const auto place = per_parameter ? place_in(shards, stepped.at(number.at(path[2].toStringRef()))) : std::nullopt;
    if (place && entry.value.toTensor().sizes() == place->shard.sizes())
      add_piece(state, path, entry.value.toTensor(), *place);
    else
      state.push_back(std::move(entry));
  }
}

void add_archive_entry(DistributedStateDict& state, torch::serialize::OutputArchive& archive) {
  // The tensor keeps the serialized bytes alive rather than copying them
  // (callbacks' tensors can be as large as the model).
  auto bytes = std::make_shared<std::string>();
  archive.save_to([&](const void* data, size_t size) {
    bytes->append(static_cast<const char*>(data), size);
    return size;
  });
  torch::Tensor tensor = torch::from_blob(
      bytes->data(), {static_cast<int64_t>(bytes->size())}, [bytes](void*) {}, torch::kUInt8);
  state.push_back(DistributedCheckpointEntry{{std::string("fulgor"), std::string("archive")}, tensor, std::nullopt});
}

void require_saves_sharded(const torch::optim::Optimizer& optimizer, const std::string& which) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) || dynamic_cast<const torch::optim::Adam*>(&optimizer) ||
      dynamic_cast<const torch::optim::AdamW*>(&optimizer))
    return;
  throw ConfigError(fmt::format(
      "state_dict_type=\"sharded\" saves the optimizers' states in torch.optim's layout, which fulgor writes for "
      "SGD, Adam and AdamW; {} is none of them: use state_dict_type=\"full\"",
      which));
}

std::shared_ptr<torch::serialize::InputArchive> read_archive_entry(const std::string& folder) {
  const c10::IValue own = read_distributed_checkpoint_under(folder, "fulgor");
  const c10::IValue* bytes = find_in(own, "fulgor");
  bytes = bytes ? find_in(*bytes, "archive") : nullptr;
  if (!bytes) return nullptr;
  if (!bytes->isTensor() || bytes->toTensor().scalar_type() != torch::kUInt8 || bytes->toTensor().dim() != 1)
    throw CheckpointError(fmt::format("checkpoint '{}': 'fulgor.archive' is a {}, not the bytes of an archive", folder,
                                      bytes->tagKind()));
  const torch::Tensor data = bytes->toTensor().contiguous();
  auto archive = std::make_shared<torch::serialize::InputArchive>();
  try {
    archive->load_from(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), static_cast<size_t>(data.numel()));
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("checkpoint '{}': 'fulgor.archive' is not an archive: {}", folder, e.what_without_backtrace()));
  }
  return archive;
}

c10::IValue read_entry(const std::string& folder, const std::string& key) {
  const c10::IValue saved = read_distributed_checkpoint_under(folder, key);
  const c10::IValue* entry = find_in(saved, key);
  if (!entry) throw CheckpointError(fmt::format("checkpoint '{}' has no '{}'", folder, key));
  return *entry;
}

// Note [Lightning's sharded checkpoints]
// Lightning's FSDP strategy (2.6.5's strategies/fsdp.py, save_checkpoint
// with state_dict_type "sharded") writes a distributed checkpoint of
// {"model": the module's sharded state dict, "optimizer_N": FSDP's
// optim_state_dict of each, by parameter names} and, from rank 0,
// torch.save of the rest of its checkpoint dict (epoch, global_step,
// loops, callbacks, lr_schedulers) as meta.pt beside it. A fit resumes from
// it as from a Lightning .ckpt (Note [Resuming a Python run]): the loops'
// and schedules' states from meta.pt, the weights and optimizers' states
// from the folder.
LoadedCheckpoint load_sharded_checkpoint(const std::string& folder) {
  LoadedCheckpoint ckpt;
  ckpt.path = folder;
  size_t n_optimizers = 0;
  if (auto archive = read_archive_entry(folder)) {
    ckpt.archive = archive;
    ckpt.meta = parse_checkpoint_meta(*archive, folder);
    n_optimizers = ckpt.meta.at("optimizers").get<size_t>();  // checked by parse_checkpoint_meta
  } else if (std::filesystem::is_regular_file(std::filesystem::path(folder) / "meta.pt")) {
    ckpt.meta = python_checkpoint_meta(torch_load(std::filesystem::path(folder) / "meta.pt"), folder);
    for (const std::string& key : distributed_checkpoint_keys(folder))
      if (key.rfind("optimizer_", 0) == 0) ++n_optimizers;
  } else {
    throw CheckpointError(
        fmt::format("checkpoint '{}' is a distributed checkpoint without fulgor's state "
                    "('fulgor.archive') or Lightning's (meta.pt); load its tensors with "
                    "load_distributed_checkpoint",
                    folder));
  }
  const std::string source = "checkpoint '" + folder + "'";
  ckpt.restore_weights = [folder, source](torch::nn::Module& module) {
    const c10::IValue model = read_entry(folder, "model");
    try {
      load_state_dict(module, state_dict_from(model, source));
    } catch (const InteropError& e) {
      throw CheckpointError(fmt::format("{}: {}", source, e.what()));
    }
  };
  // One optimizer's state in memory at a time, copied onto the parameters'
  // devices as it is imported.
  ckpt.restore_optimizers = [folder, source, n_optimizers](const LoadedCheckpoint::Optimizers& optimizers,
                                                           const torch::nn::Module& module, const Accelerator&,
                                                           torch::Device) {
    if (n_optimizers != optimizers.size())
      throw CheckpointError(fmt::format("{} holds {} optimizer states; configure_optimizers returned {}", source,
                                        n_optimizers, optimizers.size()));
    const ParameterNames names = parameter_names({&module});
    for (size_t i = 0; i < n_optimizers; ++i) {
      const std::string what = fmt::format("{}, optimizer {}", source, i);
      import_optimizer_state(
          *optimizers[i],
          by_parameter_numbers(read_entry(folder, "optimizer_" + std::to_string(i)), *optimizers[i], names, what),
          what);
    }
  };
  return ckpt;
}

}  // namespace fulgor::detail

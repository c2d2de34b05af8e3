// Fabric::save and Fabric::load: a named state in fulgor's checkpoint file,
// and the same state from a torch.save or Lightning file.

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "detail/tensor_moves.h"
#include "fabric/fabric_module.h"
#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"
#include "fulgor/core/version.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/fabric/fabric.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "fulgor/interop/optimizer_state.h"
#include "fulgor/interop/state_dict.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/interop/weights_file.h"
#include "interop/optimizer_names.h"
#include "interop/sharded_checkpoint.h"

namespace fulgor {

// Note [Fabric checkpoints]
// A Fabric checkpoint is a fulgor checkpoint file (Note [Checkpoint files])
// whose archive holds
//   "meta"     a JSON string: {"format": "fulgor-fabric", "format_version": 1,
//              the fulgor and LibTorch versions, "items": {name: kind},
//              "values": {name: JSON}} with the plain values and the
//              state_dict() of json-stateful objects
//   <name>     a module's or an optimizer's archive (Module::save,
//              Optimizer::save), an archive-stateful object's, or a tensor
// Only tensors and JSON: nothing in it runs code when it is read. With
// state_dict_type "sharded" it is a distributed checkpoint's folder (Note
// [Sharded training checkpoints]): each module's and optimizer's state under
// its name, in PyTorch's layout, and this archive less them as
// "fulgor"/"archive".
namespace {

constexpr const char* kFabricFormat = "fulgor-fabric";
constexpr int kFabricFormatVersion = 1;

const char* kind_name(FabricStateItem::Kind kind) {
  switch (kind) {
    case FabricStateItem::Kind::module:
      return "module";
    case FabricStateItem::Kind::optimizer:
      return "optimizer";
    case FabricStateItem::Kind::archive:
      return "archive";
    case FabricStateItem::Kind::json_state:
      return "state_dict";
    case FabricStateItem::Kind::tensor:
      return "tensor";
    case FabricStateItem::Kind::value:
      return "value";
  }
  return "?";
}

void check_names(const FabricState& state) {
  std::set<std::string> seen;
  for (const auto& [name, item] : state) {
    const bool valid = !name.empty() && name != "meta" && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!valid)
      throw ConfigError(
          fmt::format("fabric state name '{}': names are letters, digits, '_' and '-', and not 'meta'", name));
    if (!seen.insert(name).second) throw ConfigError(fmt::format("fabric state name '{}' is given twice", name));
  }
}

// Runs `restore`, turning LibTorch's and the JSON library's errors into a
// CheckpointError naming the item and the file.
template <typename Restore>
void restore_item(const std::string& path, const std::string& name, Restore&& restore) {
  try {
    restore();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("checkpoint '{}': '{}' does not fit: {}", path, name, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': '{}' does not fit: {}", path, name, e.what()));
  }
}

nlohmann::json read_fabric_meta(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue meta;
  if (!archive.try_read("meta", meta) || !meta.isString())
    throw CheckpointError(fmt::format("checkpoint '{}' has no metadata", path));
  nlohmann::json parsed = nlohmann::json::parse(meta.toStringRef(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || parsed.value("format", "") != kFabricFormat)
    throw CheckpointError(
        fmt::format("checkpoint '{}' was not written by Fabric::save (a Trainer's checkpoint?): load its weights with "
                    "Fabric::load_raw",
                    path));
  if (parsed.value("format_version", 0) > kFabricFormatVersion)
    throw CheckpointError(fmt::format("checkpoint '{}' has Fabric format version {}; this fulgor reads up to {}", path,
                                      parsed.value("format_version", 0), kFabricFormatVersion));
  return parsed;
}

// The JSON of a plain value torch_load returned; nullopt for anything else.
std::optional<nlohmann::json> json_of(const c10::IValue& value) {
  if (value.isInt()) return nlohmann::json(value.toInt());
  if (value.isDouble()) return nlohmann::json(value.toDouble());
  if (value.isBool()) return nlohmann::json(value.toBool());
  if (value.isString()) return nlohmann::json(value.toStringRef());
  if (value.isNone()) return nlohmann::json(nullptr);
  if (value.isList()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& element : value.toListRef()) {
      auto converted = json_of(element);
      if (!converted) return std::nullopt;
      list.push_back(*converted);
    }
    return list;
  }
  return std::nullopt;
}

// The names of the parameters of `state`'s modules, which name an
// optimizer's parameters (Note [Optimizer states by parameter names]).
detail::ParameterNames module_parameter_names(const FabricState& state) {
  std::vector<const torch::nn::Module*> modules;
  for (const auto& [name, item] : state)
    if (item.kind() == FabricStateItem::Kind::module) modules.push_back(&*item.module());
  return detail::parameter_names(modules);
}

// The archive of `state` that a Fabric file holds; without `weights`, less
// its modules and optimizers, which a sharded checkpoint holds apart.
torch::serialize::OutputArchive fabric_archive(const FabricState& state, bool weights) {
  nlohmann::json meta = {{"format", kFabricFormat},
                         {"format_version", kFabricFormatVersion},
                         {"fulgor_version", fulgor::version()},
                         {"torch_version", TORCH_VERSION},
                         {"items", nlohmann::json::object()},
                         {"values", nlohmann::json::object()}};
  torch::serialize::OutputArchive archive;
  for (const auto& [name, item] : state) {
    meta["items"][name] = kind_name(item.kind());
    torch::serialize::OutputArchive nested;
    switch (item.kind()) {
      case FabricStateItem::Kind::module:
        if (!weights) break;
        item.module()->save(nested);
        archive.write(name, nested);
        break;
      case FabricStateItem::Kind::optimizer:
        if (!weights) break;
        item.optimizer()->save(nested);
        archive.write(name, nested);
        break;
      case FabricStateItem::Kind::archive:
        item.save(nested);
        archive.write(name, nested);
        break;
      case FabricStateItem::Kind::tensor:
        archive.write(name, *item.tensor());
        break;
      case FabricStateItem::Kind::json_state:
      case FabricStateItem::Kind::value:
        meta["values"][name] = item.to_json();
        break;
    }
  }
  archive.write("meta", c10::IValue(meta.dump()));
  return archive;
}

// Note [Sharded training checkpoints]: every rank its pieces of the modules
// and optimizers, rank 0 the rest.
void write_fabric_folder(const std::string& path, const FabricState& state, const detail::ShardSets& shards,
                         ProcessGroup* group, bool rank_zero) {
  const detail::ParameterNames names = module_parameter_names(state);
  DistributedStateDict entries;
  for (const auto& [name, item] : state) {
    if (name == "fulgor")
      throw ConfigError("fabric state name 'fulgor' is the sharded checkpoint's own entry: name the item otherwise");
    if (item.kind() == FabricStateItem::Kind::module) detail::add_module_entries(entries, name, *item.module(), shards);
    if (item.kind() != FabricStateItem::Kind::optimizer) continue;
    detail::require_saves_sharded(*item.optimizer(), "'" + name + "'");
    detail::add_optimizer_entries(entries, name, *item.optimizer(), shards, names);
  }
  torch::serialize::OutputArchive rest = fabric_archive(state, /*weights=*/false);
  if (rank_zero) detail::add_archive_entry(entries, rest);
  save_distributed_checkpoint(entries, path, group);
}

// Runs `body` with each of `sharded` (an optimizer and the shards it steps)
// from the i-th on holding whole parameters and states: gathered for a save,
// or loaded whole and cut after it (Note [Parameter shards]).
void unsharded(const std::vector<std::pair<detail::ParameterShards*, torch::optim::Optimizer*>>& sharded, bool load,
               const std::function<void()>& body, size_t i = 0) {
  if (i == sharded.size()) return body();
  auto rest = [&] { unsharded(sharded, load, body, i + 1); };
  if (load)
    sharded[i].first->load_whole_state(*sharded[i].second, rest);
  else
    sharded[i].first->with_whole_state(*sharded[i].second, rest);
}

// Runs `body` with the set-up modules' parameters whole (FULL_SHARD gathers
// its units' to rank 0 for a save, or to every rank for a load, which then
// cuts them into pieces).
void with_whole_modules(const std::vector<std::unique_ptr<detail::FabricModule>>& modules, bool load,
                        const std::function<void()>& body, size_t i = 0) {
  if (i == modules.size()) return body();
  auto rest = [&] { with_whole_modules(modules, load, body, i + 1); };
  using Whole = detail::ParameterShards::Whole;
  if (modules[i]->parallel.shards)
    modules[i]->parallel.shards->with_whole_parameters(rest, load ? Whole::on_every_rank : Whole::on_rank_zero);
  else
    rest();
}

}  // namespace

void Fabric::with_whole_states(const FabricState& state, bool load, const std::function<void()>& body) {
  std::vector<std::pair<detail::ParameterShards*, torch::optim::Optimizer*>> sharded;
  for (const auto& [name, item] : state) {
    if (item.kind() != FabricStateItem::Kind::optimizer) continue;
    for (const auto& m : modules_)
      if (m->parallel.shards && !m->parallel.shards->shards_in(*item.optimizer()).empty())
        sharded.emplace_back(m->parallel.shards.get(), item.optimizer());
  }
  unsharded(sharded, load, body);
}

void Fabric::save(const std::string& path, const FabricState& state) {
  require_launched("save");
  check_names(state);
  if (options_.state_dict_type == "sharded") {
    detail::ShardSets shards;
    for (const auto& m : modules_)
      if (m->parallel.shards) shards.push_back(m->parallel.shards.get());
    return write_fabric_folder(path, state, shards, group_.get(), is_global_zero());
  }
  // Gathering a sharded optimizer's whole state is a collective, so every
  // rank runs it, and rank 0 alone writes the file.
  with_whole_states(state, /*load=*/false, [&] {
    with_whole_modules(modules_, /*load=*/false, [&] {
      if (!is_global_zero()) return;
      torch::serialize::OutputArchive archive = fabric_archive(state, /*weights=*/true);
      write_checkpoint_file(path, archive);
    });
  });
  barrier();
}

namespace {

// What Fabric::load reads a file for: the state, whether every item must be
// there, and how an optimizer loads a whole state (Fabric::with_whole_states).
struct LoadRequest {
  const std::string& path;
  const FabricState& state;
  bool strict;
  std::function<void(torch::optim::Optimizer&, const std::function<void()>&)> load_whole;

  bool asked(const std::string& name) const {
    return std::any_of(state.begin(), state.end(), [&](const auto& entry) { return entry.first == name; });
  }
  void missing(const std::string& name) const {
    if (strict)
      throw CheckpointError(
          fmt::format("checkpoint '{}' has no '{}' (load with strict = false to skip it)", path, name));
  }
};

// One item from a Fabric file's archive.
void restore_saved(const LoadRequest& request, torch::serialize::InputArchive& archive, const nlohmann::json& values,
                   const std::string& name, const FabricStateItem& item, const Accelerator& accelerator,
                   torch::Device device) {
  torch::serialize::InputArchive nested;
  switch (item.kind()) {
    case FabricStateItem::Kind::module:
      archive.read(name, nested);
      detail::load_module_state(*item.module(), nested, request.path);
      break;
    case FabricStateItem::Kind::optimizer:
      archive.read(name, nested);
      request.load_whole(*item.optimizer(), [&] {
        item.optimizer()->load(nested);
        detail::move_archive_tensors(nested, accelerator, device, "optimizer '" + name + "' state");
      });
      break;
    case FabricStateItem::Kind::archive:
      archive.read(name, nested);
      item.load(nested);
      break;
    case FabricStateItem::Kind::tensor:
      archive.read(name, *item.tensor());
      break;
    case FabricStateItem::Kind::json_state:
    case FabricStateItem::Kind::value:
      item.from_json(values.at(name));
      break;
  }
}

// Restores the items of `request` from a checkpoint Fabric::save wrote, whose
// metadata is `meta`, each with `restore(name, item)`; returns the
// checkpoint's plain values the state did not ask for.
nlohmann::json restore_fabric_items(const LoadRequest& request, const nlohmann::json& meta,
                                    const std::function<void(const std::string&, const FabricStateItem&)>& restore) {
  const nlohmann::json& items = meta.at("items");
  const nlohmann::json& values = meta.at("values");
  for (const auto& [name, item] : request.state) {
    if (!items.contains(name)) {
      request.missing(name);
      continue;
    }
    const std::string saved_kind = items.at(name).get<std::string>();
    if (saved_kind != kind_name(item.kind()))
      throw CheckpointError(fmt::format("checkpoint '{}': '{}' was saved as a {}, and is loaded into a {}",
                                        request.path, name, saved_kind, kind_name(item.kind())));
    restore_item(request.path, name, [&, &name = name, &item = item] { restore(name, item); });
  }
  nlohmann::json remainder = nlohmann::json::object();
  for (auto it = values.begin(); it != values.end(); ++it)
    if (!request.asked(it.key()) && items.value(it.key(), "") == "value") remainder[it.key()] = it.value();
  return remainder;
}

// A file Fabric::save wrote.
nlohmann::json load_fabric_file(const LoadRequest& request, const Accelerator& accelerator, torch::Device device) {
  torch::serialize::InputArchive archive = read_checkpoint_file(request.path);
  const nlohmann::json meta = read_fabric_meta(archive, request.path);
  return restore_fabric_items(request, meta, [&](const std::string& name, const FabricStateItem& item) {
    restore_saved(request, archive, meta.at("values"), name, item, accelerator, device);
  });
}

// One item from a torch.save or Lightning file's dict.
void restore_loaded(const LoadRequest& request, const c10::IValue& value, const std::string& name,
                    const FabricStateItem& item) {
  const std::string& path = request.path;
  switch (item.kind()) {
    case FabricStateItem::Kind::module: {
      LoadStateDictOptions options;
      options.strict = request.strict;
      load_state_dict(*item.module(), state_dict_from(value, fmt::format("'{}' of '{}'", name, path)), options);
      break;
    }
    case FabricStateItem::Kind::optimizer:
      request.load_whole(*item.optimizer(), [&] {
        const std::string what = fmt::format("'{}' of '{}'", name, path);
        import_optimizer_state(
            *item.optimizer(),
            detail::by_parameter_numbers(value, *item.optimizer(), module_parameter_names(request.state), what), what);
      });
      break;
    case FabricStateItem::Kind::archive:
      throw CheckpointError(
          fmt::format("checkpoint '{}': '{}' is restored from fulgor checkpoints only (Fabric::save)", path, name));
    case FabricStateItem::Kind::tensor:
      if (!value.isTensor())
        throw CheckpointError(fmt::format("checkpoint '{}': '{}' is a {}, not a tensor", path, name, value.tagKind()));
      *item.tensor() = value.toTensor();
      break;
    case FabricStateItem::Kind::json_state:
    case FabricStateItem::Kind::value: {
      auto converted = json_of(value);
      if (!converted)
        throw CheckpointError(
            fmt::format("checkpoint '{}': '{}' is a {}, not a plain value", path, name, value.tagKind()));
      item.from_json(*converted);
      break;
    }
  }
}

// A folder Fabric::save wrote with state_dict_type "sharded": the modules'
// and optimizers' states whole from their entries, the rest from its archive.
nlohmann::json load_fabric_folder(const LoadRequest& request, const Accelerator& accelerator, torch::Device device) {
  const auto archive = detail::read_archive_entry(request.path);
  if (!archive)
    throw CheckpointError(
        fmt::format("checkpoint '{}' is a distributed checkpoint that Fabric::save did not write "
                    "(it has no 'fulgor.archive'): read its tensors with load_distributed_checkpoint",
                    request.path));
  const nlohmann::json meta = read_fabric_meta(*archive, request.path);
  return restore_fabric_items(request, meta, [&](const std::string& name, const FabricStateItem& item) {
    if (item.kind() == FabricStateItem::Kind::module || item.kind() == FabricStateItem::Kind::optimizer)
      restore_loaded(request, detail::read_entry(request.path, name), name, item);
    else
      restore_saved(request, *archive, meta.at("values"), name, item, accelerator, device);
  });
}

// A torch.save or Lightning file, read without running any of it; returns
// its plain values the state did not ask for.
nlohmann::json load_torch_file(const LoadRequest& request) {
  const c10::IValue loaded = torch_load(request.path);
  if (!loaded.isGenericDict())
    throw CheckpointError(
        fmt::format("checkpoint '{}' holds a {}, not a dict of named states", request.path, loaded.tagKind()));
  const auto dict = loaded.toGenericDict();
  for (const auto& [name, item] : request.state) {
    const auto found = dict.find(name);
    if (found == dict.end()) {
      request.missing(name);
      continue;
    }
    restore_item(request.path, name,
                 [&, &name = name, &item = item] { restore_loaded(request, found->value(), name, item); });
  }
  nlohmann::json remainder = nlohmann::json::object();
  for (const auto& entry : dict) {
    if (!entry.key().isString() || request.asked(entry.key().toStringRef())) continue;
    if (auto converted = json_of(entry.value())) remainder[entry.key().toStringRef()] = *converted;
  }
  return remainder;
}

}  // namespace

nlohmann::json Fabric::load(const std::string& path, const FabricState& state, bool strict) {
  require_launched("load");
  check_names(state);
  const bool folder = is_distributed_checkpoint(path);
  const WeightsFormat format = folder ? WeightsFormat::fulgor_checkpoint : detect_weights_format(path);
  if (format == WeightsFormat::safetensors)
    throw CheckpointError(fmt::format(
        "checkpoint '{}' is a safetensors file, which holds weights alone: load them with Fabric::load_raw", path));
  // A checkpoint holds whole optimizer states, which each rank cuts to its pieces.
  const LoadRequest request{path, state, strict, [this](torch::optim::Optimizer& optimizer, const auto& load) {
                              with_whole_states({{"optimizer", optimizer}}, /*load=*/true, load);
                            }};
  nlohmann::json remainder;
  with_whole_modules(modules_, /*load=*/true, [&] {
    remainder = folder                                       ? load_fabric_folder(request, *accelerator_, device())
                : format == WeightsFormat::fulgor_checkpoint ? load_fabric_file(request, *accelerator_, device())
                                                             : load_torch_file(request);
  });
  barrier();
  // Note [Ranks in step] (gradient_sync.h): a load must leave the ranks equal.
  const std::string when = fmt::format("Fabric::load('{}')", path);
  for (auto& m : modules_)
    if (auto& synchronizer = m->parallel.synchronizer) {
      synchronizer->check_in_step(when);
      synchronizer->check_next_step(when);
    }
  return remainder;
}

void Fabric::load_raw(const std::string& path, torch::nn::Module& module, bool strict) {
  require_launched("load_raw");
  LoadStateDictOptions options;
  options.strict = strict;
  with_whole_modules(modules_, /*load=*/true, [&] { load_state_dict(module, read_weights(path), options); });
}

void Fabric::load_raw(const std::string& path, torch::optim::Optimizer& optimizer) {
  require_launched("load_raw");
  with_whole_states({{"optimizer", optimizer}}, /*load=*/true, [&] { import_optimizer_state(optimizer, path); });
}

}  // namespace fulgor

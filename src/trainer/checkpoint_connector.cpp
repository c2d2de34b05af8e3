#include "trainer/checkpoint_connector.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint/meta.h"
#include "checkpoint/rng.h"
#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/version.h"
#include "fulgor/distributed/strategy.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "interop/python_checkpoint.h"
#include "interop/sharded_checkpoint.h"
#include "trainer/callback_connector.h"
#include "trainer/state.h"

namespace fulgor::detail {

namespace {

// Runs `restore`, which reads `what` from the checkpoint's metadata: an error
// of the JSON library (a key missing, a value of another type) becomes a
// CheckpointError naming the file (Note [Checkpoint metadata]).
template <typename Restore>
void restoring(const LoadedCheckpoint& ckpt, const std::string& what, Restore&& restore) {
  try {
    restore();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': {} does not fit: {}", ckpt.path, what, e.what()));
  } catch (const ConfigError& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': {} does not fit: {}", ckpt.path, what, e.what()));
  }
}

// Note [Weights a checkpoint holds]
// A checkpoint's model is what its readers take as the trained weights
// (load_module_weights, fulgor-convert, a test run from it). A callback may
// mean other weights (WeightAveraging: the averaged ones), so each swaps its
// own in while the checkpoint is written and back after, also when writing
// throws. The archive refers to the module's tensors rather than copying
// them: the swap lasts until the file is complete (save) or, for an
// asynchronous save, until the snapshot has copied them (Note [Asynchronous
// checkpoints]). It begins after the callbacks' save_tensors, which copy
// what they write.
struct CheckpointWeights {
  explicit CheckpointWeights(TrainerState& state) : s(state) {
    for (auto& cb : s.callbacks) cb->swap_checkpoint_weights(*s.module);
  }
  ~CheckpointWeights() {
    for (auto it = s.callbacks.rbegin(); it != s.callbacks.rend(); ++it) (*it)->swap_checkpoint_weights(*s.module);
  }
  CheckpointWeights(const CheckpointWeights&) = delete;
  CheckpointWeights& operator=(const CheckpointWeights&) = delete;
  TrainerState& s;
};

}  // namespace

// Note [Resolving "last"]
// Lightning's _parse_ckpt_path: "last" is the newest, by modification time,
// of the files a resume from where training got to could mean: in each
// ModelCheckpoint's folder the names that begin with "last" and end in
// ".ckpt" (Lightning's _find_last_checkpoints), and each
// OnExceptionCheckpoint's file. fulgor adds the checkpoint folder
// (Trainer::checkpoint_dir), where a stop by a signal saves last.ckpt even
// without a ModelCheckpoint; and when none of those exists, the newest
// ".ckpt" in that folder, so that a run whose ModelCheckpoint keeps only its
// top k still resumes. Equal times go to the path that sorts first.
// No incomplete file is chosen: a save writes a temporary whose name begins
// with "." (Note [Temporary checkpoint files]) and renames it to its own name
// only once it is complete and on disk, and names beginning with "." are never
// candidates. With no candidate there is nothing to resume: Lightning's
// warning, and the stage starts from the module as it is, so that "last" can
// be set for a job's first start as well as its restarts.
// Under ddp rank 0 chooses and tells the others, so every rank loads the same
// file even where ranks on several machines see a shared folder differently
// (a network file system's cached listings).

namespace {

namespace fs = std::filesystem;

bool may_be_last_checkpoint(const fs::path& file) {
  const std::string name = file.filename().string();
  return !name.empty() && name[0] != '.' && file.extension() == ".ckpt";
}

// A checkpoint file, or a sharded checkpoint's folder (Note [Sharded
// training checkpoints]).
bool is_checkpoint(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) || is_distributed_checkpoint(path);
}

bool is_any_checkpoint(const fs::path&) { return true; }

// The regular files of `dir` that may be a "last" checkpoint and that `keep` accepts.
template <typename Keep>
void add_last_candidates(const fs::path& dir, Keep&& keep, std::set<fs::path>& files) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (may_be_last_checkpoint(it->path()) && keep(it->path()) && is_checkpoint(it->path()))
      files.insert(it->path().lexically_normal());
  }
}

// The most recently modified of `files` ("" for none); a file removed since
// it was listed is passed over.
std::string most_recently_modified(const std::set<fs::path>& files) {
  std::optional<fs::path> newest;
  fs::file_time_type newest_time;
  for (const auto& file : files) {
    std::error_code ec;
    const auto time = fs::last_write_time(file, ec);
    if (!ec && (!newest || time > newest_time)) newest = file, newest_time = time;
  }
  return newest ? newest->string() : "";
}

}  // namespace

std::string CheckpointConnector::resolve(const std::string& path) const {
  if (path == "best") {
    std::string best = best_model_path(s.trainer.checkpoint_callback());
    if (best.empty())
      throw CheckpointError("ckpt_path=\"best\": no ModelCheckpoint has saved a best checkpoint in this Trainer");
    return best;
  }
  if (path != "last") return path;
  std::string last = !s.ddp || s.ddp->is_global_zero() ? find_last() : "";
  if (s.ddp) last = s.ddp->group().broadcast_text(last);
  if (last.empty())
    s.warn(
        fmt::format(".{}(ckpt_path=\"last\") is set, but there is no last checkpoint available. No checkpoint will "
                    "be loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`.",
                    s.stage));
  return last;
}

// Note [Resolving "last"].
std::string CheckpointConnector::find_last() const {
  const fs::path folder = s.trainer.checkpoint_dir();
  const LastCheckpointPlaces places = last_checkpoint_places(s.callbacks);
  auto is_named_last = [&](const fs::path& file) {
    return file.filename().string().rfind(places.last_prefix, 0) == 0;
  };
  std::set<fs::path> files;
  add_last_candidates(folder, is_named_last, files);
  for (const auto& dir : places.folders) add_last_candidates(dir, is_named_last, files);
  for (const auto& file : places.files)
    if (is_checkpoint(file)) files.insert(fs::path(file).lexically_normal());
  if (files.empty()) add_last_candidates(folder, is_any_checkpoint, files);
  return most_recently_modified(files);
}

// The one place a checkpoint's format is told: each reader gives the same
// loaded form (Note [The loaded checkpoint]).
LoadedCheckpoint CheckpointConnector::read(const std::string& path) const {
  if (is_distributed_checkpoint(path)) return load_sharded_checkpoint(path);
  const RegularFile file = open_regular<CheckpointError>(path, "checkpoint");  // Note [Opening a user's path]
  return is_python_checkpoint(file) ? load_python_checkpoint(file, path) : load_checkpoint(file, path);
}

// Lightning's _restore_modules_and_callbacks, after the setup hooks: the
// module's on_load_checkpoint, its weights, then every callback's
// on_load_checkpoint and every callback's load_state_dict. A checkpoint
// without the module's or the callbacks' states (Python's) calls none of
// their hooks.
void CheckpointConnector::restore_module_and_callbacks(LoadedCheckpoint& ckpt) {
  const auto& meta = ckpt.meta;
  if (const auto module = meta.find("module"); module != meta.end())
    restoring(ckpt, "the module's state", [&] { s.module->on_load_checkpoint(*module); });
  ckpt.restore_weights(*s.module);
  // Lightning's restore_datamodule: the state saved under its name, if any.
  if (const auto dm = meta.find("datamodule");
      s.datamodule && dm != meta.end() && dm->at("name") == s.datamodule->name())
    restoring(ckpt, fmt::format("the state of {}", s.datamodule->name()),
              [&] { s.datamodule->load_state_dict(dm->at("state")); });
  const auto states = meta.find("callbacks");
  if (states == meta.end()) return;
  for (auto& cb : s.callbacks)
    restoring(ckpt, fmt::format("what {} reads of it", cb->state_key()),
              [&] { cb->on_load_checkpoint(s.trainer, *s.module, meta); });
  restore_callback_tensors(ckpt);
  for (auto& cb : s.callbacks)
    if (auto it = states->find(cb->state_key()); it != states->end())
      restoring(ckpt, fmt::format("the state of {}", cb->state_key()), [&] { cb->load_state_dict(*it); });
}

// Note [Callback tensors in checkpoints] (include/fulgor/callback.h).
void CheckpointConnector::restore_callback_tensors(LoadedCheckpoint& ckpt) {
  const auto entries = ckpt.meta.find("callback_tensors");
  if (entries == ckpt.meta.end()) return;
  for (auto& cb : s.callbacks) {
    const auto entry = entries->find(cb->state_key());
    if (entry == entries->end()) continue;
    torch::serialize::InputArchive archive;
    if (!entry->is_string() || !ckpt.archive->try_read(entry->get<std::string>(), archive))
      throw CheckpointError(fmt::format("checkpoint '{}' names no archive of tensors for {} that it holds: {}",
                                        ckpt.path, cb->state_key(), entry->dump()));
    restoring(ckpt, fmt::format("the tensors of {}", cb->state_key()),
              [&] { cb->load_tensors(s.trainer, *s.module, archive); });
  }
}

namespace {

// Runs `body` with optimizers[i...] unsharded: whole states to save, or to
// load and shard (Note [Parameter shards]). A checkpoint holds whole states,
// so that any number of ranks, or one process, can load it.
void unsharded(DdpStrategy* ddp, const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers, bool load,
               const std::function<void()>& body, size_t i = 0) {
  if (ddp == nullptr || i == optimizers.size()) return body();
  auto rest = [&] { unsharded(ddp, optimizers, load, body, i + 1); };
  if (load)
    ddp->load_whole_state(*optimizers[i], rest);
  else
    ddp->with_whole_state(*optimizers[i], rest);
}

}  // namespace

// Lightning's restore_training_state, after on_fit_start: the precision's
// state, the loops' progress, the optimizers and schedulers. The
// generators are set by restore_rng when the first epoch begins.
void CheckpointConnector::restore_training_state(LoadedCheckpoint& ckpt) {
  s.precision.load(*ckpt.archive, ckpt.path);
  s.fit_loop.load_state_dict(ckpt.meta.at("loop"));
  s.fit_loop.resume_from(ckpt);
  unsharded(s.ddp.get(), s.optim.optimizers, /*load=*/true,
            [&] { ckpt.restore_optimizers(s.optim.optimizers, *s.module, *s.accelerator, s.device_setup->device); });
  const auto& schedulers = ckpt.meta.at("schedulers");
  if (schedulers.size() != s.optim.schedulers.size())
    throw CheckpointError(fmt::format("checkpoint '{}' holds {} scheduler states; configure_optimizers returned {}",
                                      ckpt.path, schedulers.size(), s.optim.schedulers.size()));
  for (size_t i = 0; i < schedulers.size(); ++i)
    restoring(ckpt, fmt::format("the state of scheduler {}", i),
              [&] { s.optim.schedulers[i].scheduler->load_state_dict(schedulers[i]); });
  check_rng_states(ckpt);
}

// Note [Missing generator states]
// A resume is exact only with the generators' states: without them its
// shuffling and dropout continue from wherever the generators are and differ
// from the uninterrupted run's. A checkpoint written by another program, or
// edited, may lack them. As Lightning warns when a checkpoint lacks the
// loops' state, the resume says which states are missing and goes on; with
// `deterministic`, which promises a repeatable run, it refuses instead.
void CheckpointConnector::check_rng_states(LoadedCheckpoint& ckpt) const {
  // A checkpoint that names no accelerator of fulgor's (Python's) holds none
  // of its generators to miss (Note [The loaded checkpoint]).
  const auto saved_on = ckpt.meta.find("accelerator");
  if (saved_on == ckpt.meta.end()) return;
  std::vector<std::string> missing;
  torch::Tensor state;
  if (!ckpt.archive->try_read("rng_cpu", state)) missing.emplace_back("'rng_cpu' (the CPU generator's)");
  const auto& loop = ckpt.meta.at("loop");
  const bool mid_epoch = !loop.at("epoch_finished").get<bool>() && loop.at("batches_in_epoch").get<int64_t>() > 0;
  if (mid_epoch && !ckpt.archive->try_read("rng_epoch_start", state))
    missing.emplace_back("'rng_epoch_start' (the CPU generator's at the epoch's start, which shuffled its batches)");
  const bool same_accelerator = *saved_on == s.accelerator->name();
  if (same_accelerator && s.accelerator->get_rng_state(s.device_setup->device).defined() &&
      !ckpt.archive->try_read("rng_device", state))
    missing.emplace_back(fmt::format("'rng_device' (the {} generator's)", s.accelerator->name()));
  if (missing.empty()) return;
  const std::string what =
      fmt::format("checkpoint '{}' holds no generator state {}", ckpt.path, fmt::join(missing, " nor "));
  if (s.options.deterministic)
    throw CheckpointError(what + ": deterministic=true promises an exact resume, which needs them");
  s.warn(what +
         ": the resume goes on from the generators as they are, so its random draws (shuffling, dropout) "
         "differ from an uninterrupted run's");
}

nlohmann::json CheckpointConnector::meta() {
  nlohmann::json meta;
  meta["format"] = kCheckpointFormat;
  meta["format_version"] = kCheckpointFormatVersion;
  meta["fulgor_version"] = fulgor::version();
  meta["torch_version"] = TORCH_VERSION;
  meta["accelerator"] = s.accelerator ? s.accelerator->name() : "";
  meta["loop"] = s.fit_loop.state_dict();
  meta["optimizers"] = s.optim.optimizers.size();
  meta["schedulers"] = nlohmann::json::array();
  for (const auto& config : s.optim.schedulers) meta["schedulers"].push_back(config.scheduler->state_dict());
  meta["hparams"] = s.module->hparams();
  // Lightning's dump_checkpoint: the callbacks' states, the data module's,
  // then the callbacks' on_save_checkpoint and last the module's.
  meta["callbacks"] = nlohmann::json::object();
  for (auto& cb : s.callbacks)
    if (auto state = cb->state_dict(); !state.is_null()) meta["callbacks"][cb->state_key()] = std::move(state);
  if (s.datamodule)
    meta["datamodule"] = {
        {"name", s.datamodule->name()}, {"state", s.datamodule->state_dict()}, {"hparams", s.datamodule->hparams()}};
  for (auto& cb : s.callbacks) cb->on_save_checkpoint(s.trainer, *s.module, meta);
  meta["module"] = nlohmann::json::object();
  s.module->on_save_checkpoint(meta["module"]);
  return meta;
}

torch::serialize::OutputArchive CheckpointConnector::archive(std::vector<torch::Tensor>* snapshot, bool weights) {
  nlohmann::json meta = this->meta();
  std::vector<torch::serialize::OutputArchive> callback_tensors;
  for (auto& cb : s.callbacks) {
    torch::serialize::OutputArchive tensors;
    if (!cb->save_tensors(s.trainer, *s.module, tensors)) continue;
    meta["callback_tensors"][cb->state_key()] = "callback_tensors_" + std::to_string(callback_tensors.size());
    callback_tensors.push_back(std::move(tensors));
  }
  torch::serialize::OutputArchive archive;
  archive.write("meta", c10::IValue(meta.dump()));
  // Note [Weights a checkpoint holds]: the snapshot copies the swapped-in
  // weights; without one, save() swaps them in for the write.
  std::optional<CheckpointWeights> swapped;
  if (snapshot && weights) swapped.emplace(s);
  if (weights) {
    torch::serialize::OutputArchive model_archive;
    s.module->save(model_archive);
    archive.write("model", model_archive);
  }
  for (size_t i = 0; i < callback_tensors.size(); ++i)
    archive.write("callback_tensors_" + std::to_string(i), callback_tensors[i]);
  if (weights)
    unsharded(s.ddp.get(), s.optim.optimizers, /*load=*/false, [&] {
      for (size_t i = 0; i < s.optim.optimizers.size(); ++i) {
        torch::serialize::OutputArchive o;
        s.optim.optimizers[i]->save(o);
        archive.write("optimizer_" + std::to_string(i), o);
      }
    });
  archive.write("rng_cpu", cpu_rng_state());
  if (s.accelerator && s.device_setup) {
    torch::Tensor device_state = s.accelerator->get_rng_state(s.device_setup->device);
    if (device_state.defined()) archive.write("rng_device", device_state);
  }
  if (s.fit_loop.rng_epoch_start.defined()) archive.write("rng_epoch_start", s.fit_loop.rng_epoch_start);
  s.precision.save(archive);
  if (snapshot)
    *snapshot = snapshot_to_host(archive, s.accelerator && s.accelerator->supports_pinned_memory(), snapshot_storages_);
  return archive;
}

bool CheckpointConnector::prepare_to_write(const std::string& path) {
  // Every rank loads checkpoints, rank 0 alone writes them.
  if (s.ddp && !s.ddp->is_global_zero()) return false;
  const std::string folder = std::filesystem::absolute(path).parent_path().lexically_normal().string();
  if (swept_folders.insert(folder).second) remove_stale_temporaries(folder);
  return true;
}

void CheckpointConnector::check_sharded_saves() const {
  if (s.options.state_dict_type != "sharded") return;
  for (size_t i = 0; i < s.optim.optimizers.size(); ++i)
    require_saves_sharded(*s.optim.optimizers[i], fmt::format("optimizer {} from configure_optimizers", i));
}

// Note [Sharded training checkpoints] (src/interop/sharded_checkpoint.h):
// every rank gives its part, rank 0 also `rest`, the archive of the rest of
// the state. The module's entries refer to its tensors, or with `snapshot`
// to copies of them in host memory.
DistributedStateDict CheckpointConnector::sharded_state(torch::serialize::OutputArchive& rest, bool snapshot) {
  ShardSets shards;
  if (s.ddp && s.ddp->shards()) shards.push_back(s.ddp->shards());
  const ParameterNames names = parameter_names({s.module});
  DistributedStateDict state;
  add_module_entries(state, "model", *s.module, shards);
  // The optimizers' entries and the archive's are copies already
  // (export_optimizer_state's). The module's are copied into the previous
  // snapshot's memory where it fits (its write has ended: Note [Reusing
  // snapshot memory]), pinned where the accelerator pins.
  if (snapshot) {
    const bool pin = s.accelerator && s.accelerator->supports_pinned_memory();
    sharded_snapshot_.resize(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      const torch::Tensor live = state[i].value.toTensor();
      torch::Tensor& copy = sharded_snapshot_[i];
      if (!copy.defined() || copy.sizes() != live.sizes() || copy.scalar_type() != live.scalar_type())
        copy = torch::empty(
            live.sizes(),
            torch::TensorOptions().dtype(live.scalar_type()).pinned_memory(pin && !live.device().is_cpu()));
      copy.copy_(live);
      state[i].value = copy;
    }
  }
  for (size_t i = 0; i < s.optim.optimizers.size(); ++i)
    add_optimizer_entries(state, "optimizer_" + std::to_string(i), *s.optim.optimizers[i], shards, names);
  if (!s.ddp || s.ddp->is_global_zero()) add_archive_entry(state, rest);
  return state;
}

void CheckpointConnector::save_sharded(const std::string& path) {
  torch::serialize::OutputArchive rest = archive(/*snapshot=*/nullptr, /*weights=*/false);
  CheckpointWeights swapped(s);  // Note [Weights a checkpoint holds]
  save_distributed_checkpoint(sharded_state(rest, /*snapshot=*/false), path, s.ddp ? &s.ddp->group() : nullptr);
}

// Note [Asynchronous checkpoints]: the entries copied, the distributed save
// on the writer's thread over a process group of its own.
void CheckpointConnector::save_sharded_async(const std::string& path, std::function<void()> on_written) {
  torch::serialize::OutputArchive rest = archive(/*snapshot=*/nullptr, /*weights=*/false);
  DistributedStateDict state;
  {
    CheckpointWeights swapped(s);
    state = sharded_state(rest, /*snapshot=*/true);
  }
  ProcessGroup* group = s.ddp ? &s.ddp->checkpoint_group() : nullptr;
  writer_.start(
      path, [state = std::move(state), path, group] { save_distributed_checkpoint(state, path, group); },
      std::move(on_written));
}

void CheckpointConnector::save(const std::string& path) {
  if (!s.module) throw Error(fmt::format("save_checkpoint('{}'): this Trainer has not fitted a module", path));
  writer_.finish();
  if (s.options.state_dict_type == "sharded") return save_sharded(path);
  auto save = [&] {
    auto archive = this->archive(/*snapshot=*/nullptr);
    if (prepare_to_write(path)) {
      CheckpointWeights swapped(s);  // Note [Weights a checkpoint holds]
      write_checkpoint_file(path, archive);
    }
  };
  // FULL_SHARD: the units' parameters whole on rank 0 while the archive
  // refers to them.
  if (s.ddp)
    s.ddp->with_whole_parameters_on_rank_zero(save);
  else
    save();
  // The other ranks wait for the file.
  if (s.ddp) s.ddp->barrier();
}

void CheckpointConnector::save_async(const std::string& path, std::function<void()> on_written) {
  if (!s.module) throw Error(fmt::format("save_checkpoint('{}'): this Trainer has not fitted a module", path));
  if (writer_.pending()) {
    ProfileScope timed(s.hooks.stage("wait_for_checkpoint_write"));
    writer_.finish();
  }
  if (s.options.state_dict_type == "sharded") return save_sharded_async(path, std::move(on_written));
  const bool write = prepare_to_write(path);
  // Only rank 0, which writes, copies the state; under FULL_SHARD only its
  // units are whole.
  std::vector<torch::Tensor> owned;
  std::optional<torch::serialize::OutputArchive> archive;
  auto snapshot = [&] { archive = this->archive(write ? &owned : nullptr); };
  if (s.ddp)
    s.ddp->with_whole_parameters_on_rank_zero(snapshot);
  else
    snapshot();
  writer_.start(path, std::move(*archive), std::move(owned), write, std::move(on_written));
}

void CheckpointConnector::wait_for_write() {
  if (writer_.pending()) {
    ProfileScope timed(s.hooks.stage("wait_for_checkpoint_write"));
    writer_.finish();
  }
  // Unconditional: the ranks' writes end at different moments, and a rank
  // that does not write has none pending, but every rank comes here.
  if (s.ddp) s.ddp->barrier();
}

}  // namespace fulgor::detail

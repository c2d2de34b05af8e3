// ModelCheckpoint: Lightning 2.6's callbacks/model_checkpoint.py.

#include "fulgor/callbacks/model_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <regex>
#include <set>
#include <utility>
#include <vector>

#include "callbacks/python_format.h"
#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "fulgor/trainer.h"

namespace fulgor {
namespace {

namespace fs = std::filesystem;

}  // namespace

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  if (options_.mode != "min" && options_.mode != "max")
    throw ConfigError(fmt::format("ModelCheckpoint: mode must be \"min\" or \"max\", got \"{}\"", options_.mode));
  if (options_.save_top_k < -1)
    throw ConfigError(fmt::format("ModelCheckpoint: save_top_k must be >= -1, got {}", options_.save_top_k));
  if (options_.monitor.empty() && options_.save_top_k > 1)
    throw ConfigError(fmt::format(
        "ModelCheckpoint: save_top_k={} ranks checkpoints, which needs a monitor; without one use -1, 0 or 1",
        options_.save_top_k));
  if (options_.filename.empty()) options_.filename = "{epoch}-{step}";
  if (options_.train_time_interval &&
      !(std::isfinite(options_.train_time_interval->count()) && options_.train_time_interval->count() >= 0))
    throw ConfigError(
        fmt::format("ModelCheckpoint: train_time_interval must be a finite number of seconds >= 0, got {}",
                    options_.train_time_interval->count()));
  // Lightning's __init_triggers: with no trigger, once per epoch.
  if (!options_.every_n_epochs && !options_.every_n_train_steps && !options_.train_time_interval) {
    every_n_epochs_ = 1;
  } else {
    every_n_epochs_ = options_.every_n_epochs.value_or(0);
    every_n_train_steps_ = options_.every_n_train_steps.value_or(0);
  }
  if (every_n_train_steps_ < 0)
    throw ConfigError(
        fmt::format("ModelCheckpoint: every_n_train_steps must be >= 0 (0: never), got {}", every_n_train_steps_));
  if (every_n_epochs_ < 0)
    throw ConfigError(fmt::format("ModelCheckpoint: every_n_epochs must be >= 0 (0: never), got {}", every_n_epochs_));
  if ((every_n_train_steps_ >= 1) + (every_n_epochs_ >= 1) + options_.train_time_interval.has_value() > 1)
    throw ConfigError(fmt::format(
        "ModelCheckpoint: every_n_train_steps={}, every_n_epochs={} and train_time_interval={} s exclude each other; "
        "give one (use several ModelCheckpoint callbacks for several schedules)",
        every_n_train_steps_, every_n_epochs_,
        options_.train_time_interval ? fmt::format("{}", options_.train_time_interval->count()) : "unset"));
  // As Lightning, a folder given is made absolute, links resolved.
  if (!options_.dirpath.empty()) dirpath_ = fs::weakly_canonical(fs::absolute(options_.dirpath)).string();
  kth_value_ = worst_score();
}

std::string ModelCheckpoint::state_key() const {
  // The key names what tells two ModelCheckpoint callbacks apart, as
  // Lightning's; train_time_interval only when set, so that the keys of
  // earlier checkpoints still match.
  std::string time;
  if (options_.train_time_interval)
    time = fmt::format(",train_time_interval={}", options_.train_time_interval->count());
  return fmt::format("ModelCheckpoint{{monitor={},mode={},every_n_train_steps={},every_n_epochs={}{}}}",
                     options_.monitor, options_.mode, every_n_train_steps_, every_n_epochs_, time);
}

nlohmann::json ModelCheckpoint::state_dict() const {
  // JSON has no infinity: an infinite score (the "nothing yet" kth_value, a
  // NaN kept as the worst) is stored as null and read back as the mode's worst.
  auto score = [](std::optional<double> v) {
    return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json best_k = nlohmann::json::object();
  for (const auto& [path, value] : best_k_models_) best_k[path] = score(value);
  nlohmann::json state = {
      {"monitor", options_.monitor.empty() ? nlohmann::json(nullptr) : nlohmann::json(options_.monitor)},
      {"best_model_score", score(best_model_score_)},
      {"best_model_path", best_model_path_},
      {"current_score", score(current_score_)},
      {"dirpath", dirpath_},
      {"best_k_models", best_k},
      {"kth_best_model_path", kth_best_model_path_},
      {"kth_value", score(kth_value_)},
      {"last_model_path", last_model_path_}};
  if (!saving_.empty()) state["saving"] = saving_;
  return state;
}

// Note [Resuming ModelCheckpoint]
// As Lightning's load_state_dict, the ranked files are trusted only when the
// checkpoint's folder is this callback's: files elsewhere are not this run's
// to keep or delete, and only best_model_path is taken. The default folder is
// known once setup has run, so a state given before that waits for it.
void ModelCheckpoint::load_state_dict(const nlohmann::json& state) {
  if (dirpath_.empty()) {
    pending_state_ = state;
    return;
  }
  auto score = [&](const nlohmann::json& v) { return v.is_null() ? worst_score() : v.get<double>(); };
  const std::string from = state.value("dirpath", dirpath_);
  if (from == dirpath_) {
    best_model_score_.reset();
    if (auto it = state.find("best_model_score"); it != state.end() && !it->is_null())
      best_model_score_ = it->get<double>();
    kth_best_model_path_ = state.value("kth_best_model_path", kth_best_model_path_);
    if (state.contains("kth_value")) kth_value_ = score(state.at("kth_value"));
    if (state.contains("best_k_models")) {
      best_k_models_.clear();
      for (const auto& item : state.at("best_k_models").items()) best_k_models_[item.key()] = score(item.value());
    }
    last_model_path_ = state.value("last_model_path", last_model_path_);
    remove_orphans_ = true;
  } else {
    std::cerr << fmt::format(
                     "The dirpath has changed from '{}' to '{}', therefore `best_model_score`, `kth_best_model_path`, "
                     "`kth_value`, `last_model_path` and `best_k_models` won't be reloaded. Only `best_model_path` "
                     "will be reloaded.",
                     from, dirpath_)
              << std::endl;
  }
  best_model_path_ = state.at("best_model_path").get<std::string>();
}

// Lightning's __resolve_ckpt_dir, with the folder Trainer::checkpoint_dir
// uses (see "Differences from Lightning" in docs/training.md).
void ModelCheckpoint::setup(Trainer& trainer, ModuleBase&, const std::string& stage) {
  if (stage == "fit") fit_validates_ = validation_has_run_ = false;
  if (dirpath_.empty()) dirpath_ = (fs::path(trainer.default_root_dir()) / "checkpoints").string();
  if (pending_state_) load_state_dict(*std::exchange(pending_state_, std::nullopt));
}

// Lightning's _format_checkpoint_name: each `{name}` or `{name:spec}` takes
// the metric's value through Python's format (epoch and step as integers, a
// missing metric as the integer 0), after "name=" with auto_insert_metric_name.
std::string ModelCheckpoint::format_checkpoint_name(const std::map<std::string, double>& metrics) const {
  static const std::regex group(R"(\{([^}:]*)(?::([^}]*))?\})");
  const std::string& filename = options_.filename;
  std::string out;
  size_t last = 0;
  for (auto it = std::sregex_iterator(filename.begin(), filename.end(), group); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    out += filename.substr(last, static_cast<size_t>(m.position()) - last);
    last = static_cast<size_t>(m.position() + m.length());
    const std::string name = m[1].str(), spec = m[2].str();
    auto value = metrics.find(name);
    const bool integer = value == metrics.end() || name == "epoch" || name == "step";
    const double number = value == metrics.end() ? 0.0 : value->second;
    if (options_.auto_insert_metric_name) out += name + "=";
    try {
      // Python formats an integer with a float presentation (`{epoch:.1f}`)
      // as a float.
      if (integer && (spec.empty() || spec.find_first_of("eEfFgG%") == std::string::npos))
        out += fmt::format(fmt::runtime("{:" + spec + "}"), static_cast<int64_t>(number));
      else
        out += spec.empty() ? detail::python_repr(number) : fmt::format(fmt::runtime("{:" + spec + "}"), number);
    } catch (const fmt::format_error& e) {
      throw ConfigError(fmt::format("ModelCheckpoint: filename \"{}\": the format \"{}\" does not fit {} = {} ({})",
                                    filename, spec, name, number, e.what()));
    }
  }
  return out + filename.substr(last);
}

std::string ModelCheckpoint::checkpoint_path(const std::string& name, std::optional<int64_t> version) const {
  return (fs::path(dirpath_) / (version ? fmt::format("{}-v{}.ckpt", name, *version) : name + ".ckpt")).string();
}

// Lightning's _get_metric_interpolated_filepath_name: a name that exists
// already gets "-v1", "-v2", ... unless it is the file being replaced.
std::string ModelCheckpoint::metric_interpolated_filepath(const std::map<std::string, double>& candidates,
                                                          Trainer& trainer, const std::string& del_filepath) const {
  const std::string name = format_checkpoint_name(candidates);
  std::string filepath = checkpoint_path(name);
  if (options_.enable_version_counter)
    for (int64_t version = kStartingVersion; file_exists(filepath, trainer) && filepath != del_filepath; ++version)
      filepath = checkpoint_path(name, version);
  return filepath;
}

// Only rank 0 looks at the disk; every rank gets its answer, so that all of
// them name the file alike.
bool ModelCheckpoint::file_exists(const std::string& filepath, Trainer& trainer) const {
  const bool local = trainer.is_global_zero() && fs::exists(filepath);
  return trainer.reduce_boolean_decision(local, /*all=*/false);
}

// Lightning's _monitor_candidates: the logged metrics, with epoch and step
// as integers (a logged "epoch" or "step" wins over the Trainer's).
std::map<std::string, double> ModelCheckpoint::monitor_candidates(const Trainer& trainer) const {
  std::map<std::string, double> candidates = trainer.callback_metrics();
  for (auto [name, own] : {std::pair<const char*, int64_t>{"epoch", trainer.current_epoch()},
                           std::pair<const char*, int64_t>{"step", trainer.global_step()}}) {
    auto it = candidates.find(name);
    candidates[name] = static_cast<double>(it == candidates.end() ? own : static_cast<int32_t>(it->second));
  }
  return candidates;
}

double ModelCheckpoint::worst_score() const {
  return options_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

bool ModelCheckpoint::better(double a, double b) const { return options_.mode == "min" ? a < b : a > b; }

// Lightning's _save_topk_checkpoint. A missing monitored metric is an error
// once validation has run in this fit (it cannot appear later), before that
// a warning, and the save is skipped.
void ModelCheckpoint::save_topk_checkpoint(Trainer& trainer, const std::map<std::string, double>& candidates) {
  if (options_.save_top_k == 0) return;
  if (options_.monitor.empty()) return save_none_monitor_checkpoint(trainer, candidates);
  auto it = candidates.find(options_.monitor);
  if (it == candidates.end()) {
    std::vector<std::string> names;
    for (const auto& [name, value] : candidates) names.push_back("'" + name + "'");
    const std::string message = fmt::format(
        "`ModelCheckpoint(monitor='{}')` could not find the monitored key in the returned metrics: [{}]. HINT: Did "
        "you call `log('{}', value)` in the `LightningModule`?",
        options_.monitor, fmt::join(names, ", "), options_.monitor);
    if (validation_has_run_) throw ConfigError(message);
    if (!warned_missing_monitor_ && trainer.is_global_zero()) std::cerr << message << std::endl;
    warned_missing_monitor_ = true;
    return;
  }
  if (check_monitor_top_k(trainer, it->second)) update_best_and_save(it->second, trainer, candidates);
}

// Lightning's _save_last_checkpoint, without the version counter (see
// "Differences from Lightning" in docs/training.md).
void ModelCheckpoint::save_last_checkpoint(Trainer& trainer) {
  if (!options_.save_last) return;
  const std::string filepath = checkpoint_path(kCheckpointNameLast);
  const std::string previous = std::exchange(last_model_path_, filepath);
  save_checkpoint(trainer, filepath, previous);
}

// save_last writes last.ckpt even when no other save happened (but nothing
// under fast_dev_run, which promises no files).
void ModelCheckpoint::on_train_end(Trainer& trainer, ModuleBase&) {
  if (options_.save_last && last_checkpoint_saved_.empty() && trainer.options().fast_dev_run == 0)
    save_last_checkpoint(trainer);
}

// Lightning's check_monitor_top_k: a NaN is never better than the k-th score.
bool ModelCheckpoint::check_monitor_top_k(Trainer& trainer, double current) const {
  if (options_.save_top_k == -1) return true;
  if (static_cast<int64_t>(best_k_models_.size()) < options_.save_top_k) return true;
  // Saving is a collective under ddp: save only where every rank would
  // (ranks that log the metric without sync_dist may disagree).
  const auto kth = best_k_models_.find(kth_best_model_path_);
  return trainer.reduce_boolean_decision(better(current, kth != best_k_models_.end() ? kth->second : kth_value_));
}

void ModelCheckpoint::update_best_and_save(double current, Trainer& trainer,
                                           const std::map<std::string, double>& candidates) {
  // The names below depend on the files on disk (Note [Removing displaced files]).
  trainer.wait_for_checkpoint();
  const auto k = options_.save_top_k == -1 ? static_cast<int64_t>(best_k_models_.size()) + 1 : options_.save_top_k;
  std::string del_filepath;
  if (static_cast<int64_t>(best_k_models_.size()) == k && k > 0) {
    del_filepath = kth_best_model_path_;
    best_k_models_.erase(del_filepath);
  }
  // Note [NaN scores]
  // A NaN is kept as the worst possible score, as in Lightning: it takes a
  // free place among the k, and any real score replaces it.
  if (std::isnan(current)) current = worst_score();
  const std::string filepath = metric_interpolated_filepath(candidates, trainer, del_filepath);
  current_score_ = current;
  best_k_models_[filepath] = current;
  auto by_score = [](const auto& a, const auto& b) { return a.second < b.second; };
  const bool min_mode = options_.mode == "min";
  if (static_cast<int64_t>(best_k_models_.size()) == k) {
    auto kth = min_mode ? std::max_element(best_k_models_.begin(), best_k_models_.end(), by_score)
                        : std::min_element(best_k_models_.begin(), best_k_models_.end(), by_score);
    kth_best_model_path_ = kth->first;
    kth_value_ = kth->second;
  }
  auto best = min_mode ? std::min_element(best_k_models_.begin(), best_k_models_.end(), by_score)
                       : std::max_element(best_k_models_.begin(), best_k_models_.end(), by_score);
  best_model_path_ = best->first;
  best_model_score_ = best->second;
  save_checkpoint(trainer, filepath, del_filepath);
}

void ModelCheckpoint::save_none_monitor_checkpoint(Trainer& trainer, const std::map<std::string, double>& candidates) {
  trainer.wait_for_checkpoint();  // Note [Removing displaced files]
  const std::string filepath = metric_interpolated_filepath(candidates, trainer, best_model_path_);
  const std::string previous = std::exchange(best_model_path_, filepath);
  save_checkpoint(trainer, filepath, options_.save_top_k == 1 ? previous : std::string());
}

// Note [Removing displaced files]
// A save that displaces a file (the k-th best, the previous latest, the
// previous last.ckpt) removes it once the new file is on disk: an
// asynchronous save's write completes later (Note [Asynchronous
// checkpoints] in src/checkpoint/background_writer.h), and a crash before then
// must leave the old file in place. The removals run when the writes
// complete, in the order of the saves. A new file's name depends on the
// files on disk (a version counter, the name of the file being replaced),
// so a save waits for the write in flight before it names its file.
void ModelCheckpoint::save_checkpoint(Trainer& trainer, const std::string& filepath, const std::string& displaced) {
  const std::string removed = !displaced.empty() && should_remove_checkpoint(displaced, filepath) ? displaced : "";
  saving_ = filepath;
  try {
    trainer.save_checkpoint_async(filepath, [this, &trainer, removed] {
      if (!removed.empty()) remove_checkpoint(trainer, removed);
    });
  } catch (...) {
    saving_.clear();
    throw;
  }
  saving_.clear();
  last_global_step_saved_ = trainer.global_step();
  last_checkpoint_saved_ = filepath;
}

// Lightning's _should_remove_checkpoint: only files in this folder, never the
// file just written.
bool ModelCheckpoint::should_remove_checkpoint(const std::string& previous, const std::string& current) const {
  if (previous == current) return false;
  const fs::path file = fs::absolute(previous), dir = fs::absolute(dirpath_).lexically_normal();
  for (fs::path p = file.parent_path().lexically_normal(); !p.empty(); p = p.parent_path()) {
    if (p == dir) return true;
    if (p == p.parent_path()) break;
  }
  return false;
}

void ModelCheckpoint::remove_checkpoint(Trainer& trainer, const std::string& filepath) const {
  // Rank 0 wrote the files.
  if (!trainer.is_global_zero()) return;
  std::error_code ec;
  // A sharded checkpoint is a folder (Note [Sharded training checkpoints]).
  if (is_distributed_checkpoint(filepath))
    fs::remove_all(filepath, ec);
  else
    fs::remove(filepath, ec);
}

// Note [Orphaned checkpoint files]
// A top-k save writes the new file, then forgets and removes the file it
// displaces, and the state naming the new file reaches disk only with the
// next checkpoint (last.ckpt). A process killed in between leaves a file that
// no saved state names: 100 kills with save_top_k=1 left 44 of them. So each
// file this callback writes names itself in the state it holds ("saving"),
// and a fit that resumes this folder's state removes, once it starts
// training, every ".ckpt" file in the folder that names itself so, under
// this callback's state key, and that the resumed state does not name. A
// file anyone else wrote (a user's, Trainer::save_checkpoint's, a copy or a
// rename of ours, another callback's) does not name itself so and stays; a
// file that is no readable fulgor checkpoint stays as well.
namespace {
// Whether the checkpoint at `path` holds a state of the ModelCheckpoint
// `key` that names `path` as the file it was writing.
bool names_itself(const std::string& path, const std::string& key) {
  nlohmann::json meta;
  try {
    meta = read_checkpoint_meta(path);
  } catch (const Error&) {
    return false;  // not a readable fulgor checkpoint: not ours to remove
  }
  const auto states = meta.find("callbacks");
  if (states == meta.end() || !states->is_object()) return false;
  const auto own = states->find(key);
  return own != states->end() && own->is_object() && own->value("saving", nlohmann::json()) == path;
}
}  // namespace

void ModelCheckpoint::remove_orphans(Trainer& trainer) const {
  if (!trainer.is_global_zero()) return;  // rank 0 wrote the files
  std::set<std::string> named{best_model_path_, last_model_path_};
  for (const auto& item : best_k_models_) named.insert(item.first);
  // Removed once listed: a folder's listing while entries go is unspecified.
  std::vector<std::string> orphans;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dirpath_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string();
    std::error_code type_ec;
    if (it->path().extension() != ".ckpt" || named.count(path) || !it->is_regular_file(type_ec)) continue;
    if (names_itself(path, state_key())) orphans.push_back(path);
  }
  for (const auto& path : orphans) fs::remove(path, ec);
}

// Lightning's _should_skip_saving_checkpoint.
bool ModelCheckpoint::should_skip_saving_checkpoint(const Trainer& trainer) const {
  return trainer.options().fast_dev_run > 0 || trainer.stage() != "fit" || trainer.sanity_checking() ||
         last_global_step_saved_ == trainer.global_step();
}

// Note [When ModelCheckpoint saves]
// Lightning's _should_save_on_train_epoch_end: unless save_on_train_epoch_end
// says, the epoch-based save happens after validation when validation does
// not run exactly once at each epoch's end (check_val_every_n_epoch != 1, or
// val_check_interval != 1.0 and the fit validates), else at the epoch's end.
// Lightning knows from the loader whether the fit validates; a callback here
// knows it once a validation run (or the sanity check) has begun, which with
// val_check_interval < 1.0 is before the first epoch ends.
bool ModelCheckpoint::should_save_on_train_epoch_end(const Trainer& trainer) const {
  if (options_.save_on_train_epoch_end) return *options_.save_on_train_epoch_end;
  const TrainerOptions& o = trainer.options();
  if (o.check_val_every_n_epoch != 1) return false;
  if (!fit_validates_) return true;
  const Limit& interval = o.val_check_interval;
  return interval.is_count() ? interval.count() == 1 : interval.fraction() == 1.0;
}

void ModelCheckpoint::on_train_start(Trainer& trainer, ModuleBase&) {
  last_time_checked_ = Clock::now();
  if (std::exchange(remove_orphans_, false)) remove_orphans(trainer);
}

void ModelCheckpoint::on_sanity_check_start(Trainer&, ModuleBase&) { fit_validates_ = true; }

void ModelCheckpoint::on_validation_start(Trainer& trainer, ModuleBase&) {
  if (trainer.stage() == "fit") fit_validates_ = true;
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) {
  const bool skip_due_to_state = should_skip_saving_checkpoint(trainer);
  const bool skip_batch = every_n_train_steps_ < 1 || trainer.global_step() % every_n_train_steps_ != 0;
  bool skip_time = true;
  const auto now = Clock::now();
  if (options_.train_time_interval) {
    skip_time = !last_time_checked_ || now - *last_time_checked_ < *options_.train_time_interval;
    // Ranks' clocks differ: every rank saves when any is due.
    skip_time = trainer.reduce_boolean_decision(skip_time);
  }
  if (skip_batch && skip_time) return;
  if (!skip_time) last_time_checked_ = now;
  const auto candidates = monitor_candidates(trainer);
  // A metric that validation logs is saved with once validation has run.
  if (!options_.monitor.empty() && !candidates.count(options_.monitor)) {
    defer_save_until_validation_ = true;
    return;
  }
  // The epoch's last batch is followed by validation, whose fresh value the
  // save should rank by.
  const auto batches = trainer.num_training_batches();
  const bool last_batch = batches && trainer.batches_in_epoch() == *batches;
  const auto every = trainer.options().check_val_every_n_epoch;
  if (!options_.monitor.empty() && !should_save_on_train_epoch_end(trainer) && last_batch && fit_validates_ &&
      (!every || (trainer.current_epoch() + 1) % *every == 0)) {
    defer_save_until_validation_ = true;
    return;
  }
  if (skip_due_to_state) return;
  save_topk_checkpoint(trainer, candidates);
  save_last_checkpoint(trainer);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  if (should_skip_saving_checkpoint(trainer) || !should_save_on_train_epoch_end(trainer)) return;
  save_on_epoch(trainer);
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, ModuleBase&) {
  if (trainer.stage() == "fit" && !trainer.sanity_checking()) validation_has_run_ = true;
  if (should_skip_saving_checkpoint(trainer) || should_save_on_train_epoch_end(trainer)) return;
  if (defer_save_until_validation_) {
    const auto candidates = monitor_candidates(trainer);
    save_topk_checkpoint(trainer, candidates);
    save_last_checkpoint(trainer);
    defer_save_until_validation_ = false;
    return;
  }
  save_on_epoch(trainer);
}

// The epoch-based save, and last.ckpt when that saved at this step.
void ModelCheckpoint::save_on_epoch(Trainer& trainer) {
  if (every_n_epochs_ >= 1 && (trainer.current_epoch() + 1) % every_n_epochs_ == 0)
    save_topk_checkpoint(trainer, monitor_candidates(trainer));
  if (last_global_step_saved_ == trainer.global_step()) save_last_checkpoint(trainer);
}

}  // namespace fulgor

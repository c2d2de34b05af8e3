#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>

#include "fulgor/callbacks/batch_size_finder.h"
#include "fulgor/callbacks/lr_finder.h"
#include "fulgor/core/export.h"
#include "fulgor/trainer.h"

namespace fulgor {

namespace detail {
// The loader overloads of the Tuner take neither a data module nor options.
template <typename L>
using TunerLoader = std::enable_if_t<!std::is_base_of_v<DataModuleBase, L> && !std::is_same_v<L, LrFindOptions>>;
}  // namespace detail

/// Lightning's Tuner: finds a learning rate, or the largest batch size that
/// fits in memory, for a Trainer's fit before it runs.
///
///   fulgor::Trainer trainer({.max_epochs = 10});
///   fulgor::Tuner tuner(trainer);
///   auto finder = tuner.lr_find(model, train_loader, {.max_lr = 1.0});
///   double lr = finder->suggestion().value_or(1e-3);  // also in model.hparams()["lr"]
///   trainer.fit(model, train_loader);
///
///   auto size = tuner.scale_batch_size(model, datamodule, {.mode = "binsearch"});
///   // also in hparams()["batch_size"] of the module, or of the data module
///
/// Contract: lr_find runs trainer.fit with a LearningRateFinder (these
/// options) first among the Trainer's callbacks, and ends that fit once the
/// sweep is over, as Lightning's Tuner does: the setup and teardown hooks
/// run, the module's weights are as before (the finder restores them),
/// and, with update_attr (the default), the module's hparams() hold the
/// suggested rate for the fit that follows. It returns nullopt when
/// fast_dev_run skipped the sweep. scale_batch_size does the same with a
/// BatchSizeFinder, whose loaders must come from the module or the data
/// module; it returns the size found (nullopt under fast_dev_run). The
/// Trainer must not have a finder of the same kind of its own (ConfigError).
class FULGOR_API Tuner {
 public:
  explicit Tuner(Trainer& trainer) : trainer_(trainer) {}

  template <typename Batch, typename Loader, typename = detail::TunerLoader<std::remove_const_t<Loader>>>
  std::optional<LRFinder> lr_find(BasicModule<Batch>& model, Loader& train_loader, const LrFindOptions& options = {}) {
    return lr_find_with(options, [&] { trainer_.fit(model, train_loader); });
  }
  /// With the data module's loaders.
  template <typename Batch>
  std::optional<LRFinder> lr_find(BasicModule<Batch>& model, BasicDataModule<Batch>& datamodule,
                                  const LrFindOptions& options = {}) {
    return lr_find_with(options, [&] { trainer_.fit(model, datamodule); });
  }
  /// With the module's own loaders.
  template <typename Batch>
  std::optional<LRFinder> lr_find(BasicModule<Batch>& model, const LrFindOptions& options = {}) {
    return lr_find_with(options, [&] { trainer_.fit(model); });
  }

  /// With the data module's loaders, which read the size from hparams().
  template <typename Batch>
  std::optional<int64_t> scale_batch_size(BasicModule<Batch>& model, BasicDataModule<Batch>& datamodule,
                                          const ScaleBatchSizeOptions& options = {}) {
    return scale_batch_size_with(options, [&] { trainer_.fit(model, datamodule); });
  }
  /// With the module's own loaders.
  template <typename Batch>
  std::optional<int64_t> scale_batch_size(BasicModule<Batch>& model, const ScaleBatchSizeOptions& options = {}) {
    return scale_batch_size_with(options, [&] { trainer_.fit(model); });
  }

 private:
  std::optional<int64_t> scale_batch_size_with(const ScaleBatchSizeOptions& options, const std::function<void()>& fit);
  std::optional<LRFinder> lr_find_with(const LrFindOptions& options, const std::function<void()>& fit);

  Trainer& trainer_;
};

}  // namespace fulgor

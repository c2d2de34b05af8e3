#pragma once

// The loops' view of a loader and a module: what Trainer's templates make of
// the user's loader and module before handing them to the compiled loops.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/batch_size.h"
#include "fulgor/core/error.h"
#include "fulgor/data/any_loader.h"
#include "fulgor/data/loader_protocol.h"
#include "fulgor/data_module.h"
#include "fulgor/loops/convert_batch.h"
#include "fulgor/module.h"
#include "fulgor/precision/precision.h"

namespace fulgor {

// The Trainer's compiled part takes these (Trainer::run_fit, run_eval): they
// cross from the headers into the library, as impl does (Note [Exported
// symbols] in fulgor/core/export.h).
namespace impl {

enum class Stage { train, validate, test, predict };

// A loader and a module's steps for it, with the batch type erased, so that
// the loops are compiled once, in src/loops/. It speaks the loader protocol
// (Note [The loader protocol]) for them through the one erased loader it
// runs (Note [One erased loader] in fulgor/data/any_loader.h).
class StepRunner {
 public:
  explicit StepRunner(detail::AnyLoaderBase& loader) : loader_(&loader) {}
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;
  virtual ~StepRunner() = default;
  // Takes the loader, where a data module or the module makes it (the loop
  // asks for it when it sets up its data, as Lightning's setup_data): false
  // when there is none.
  virtual bool open() { return true; }
  // The class that makes the loader, for messages ("" for a loader given).
  virtual std::string source_name() const { return {}; }
  // Batches per epoch, when the loader tells.
  std::optional<int64_t> length() const { return loader_->length(); }
  void bind(const Accelerator& accelerator, torch::Device device, const Precision& precision) {
    accelerator_ = &accelerator;
    device_ = device;
    precision_ = &precision;
  }
  // Keeps the first `n` batches and replays them every later epoch.
  void cache_first(int64_t n) { cache_limit_ = n; }
  // Asks the loader for each batch's indices (batch_indices()): the
  // prediction loop does, for the prediction writers.
  void record_indices(bool on) { want_indices_ = on; }
  // Note [Loader epochs]
  // A loader that shuffles by epoch number (TensorLoader) would otherwise
  // count its own epochs, which a resumed run starts again from 0; being told
  // the Trainer's epoch makes its order the uninterrupted run's.
  // Tells a loader with a set_epoch member which epoch comes next.
  void set_epoch(int64_t epoch) { loader_->set_epoch(epoch); }
  // Makes a loader with a distribute member read `shard` (Note [Distributed
  // sampling] in src/loops/context.cpp); returns false where the loader has
  // no such member or declined. length() is the shard's afterwards.
  bool distribute(const DistributedShard& shard) { return loader_->distribute(shard); }
  // Turns off a loader's shuffling where it can (TensorLoader::disable_shuffle):
  // returns whether it was shuffling.
  bool disable_shuffle() { return loader_->disable_shuffle(); }
  // Makes the next epoch begin at `batch` where the loader can
  // (ImageLoader::start_at): false where the loop must fetch and drop the
  // batches before it, as when overfit_batches replays its cache, which the
  // loader does not know of.
  bool start_at(int64_t batch) { return cache_limit_ == 0 && loader_->start_at(batch); }
  virtual void start_epoch() = 0;
  // Fetches the next batch, onto the device when `move`; false at the end.
  virtual bool next(bool move) = 0;
  // The fetched batch's size (-1: unknown).
  virtual int64_t batch_size() const = 0;
  // Runs the module's step for `stage` on the fetched batch, under autocast
  // for a mixed precision.
  virtual torch::Tensor step(Stage stage, int64_t batch_idx) = 0;
  // Note [The hooks' batch]
  // The batch-end hooks see the batch the step was given (BatchEnd): the
  // step gets a copy (a tensor's copy shares its storage), the runner keeps
  // the fetched batch until the loop drops it after those hooks, so that a
  // training batch is not held through a validation run. A batch type that
  // cannot be copied is moved into the step, and the hooks see none.
  // The fetched batch (nullptr when none, or when the step took it).
  virtual const void* held_batch() const = 0;
  virtual const std::type_info& batch_type() const = 0;
  // The fetched batch's data set indices, where the loader tells.
  const std::vector<int64_t>* batch_indices() const { return indices_ ? &*indices_ : nullptr; }
  virtual void drop_batch() = 0;

 protected:
  const Accelerator* accelerator_ = nullptr;
  const Precision* precision_ = nullptr;
  std::optional<torch::Device> device_;
  int64_t cache_limit_ = 0;
  std::optional<std::vector<int64_t>> indices_;
  bool want_indices_ = false;

 private:
  detail::AnyLoaderBase* loader_;
};

}  // namespace impl

namespace detail {

using impl::Stage;
using impl::StepRunner;

// Runs `loader` for the module.
template <typename Batch>
class LoaderRunner : public StepRunner {
 public:
  LoaderRunner(BasicModule<Batch>& module, AnyLoader<Batch>& loader)
      : StepRunner(loader), module_(module), loader_(loader) {}

  void start_epoch() override {
    fetched_.reset();
    replay_ = cache_limit_ > 0 && static_cast<int64_t>(cache_.size()) == cache_limit_;
    position_ = 0;
    module_.transfer_moves_ = !loader_.batches_on(*device_);
    module_.transfer_accelerator_ = accelerator_;
    if (replay_) return;
    cache_.clear();
    it_.reset();
    loader_.bind_device(*accelerator_, *device_);
    it_.emplace(loader_.begin());
    started_ = false;
  }

  bool next(bool move) override {
    fetched_.reset();
    indices_.reset();
    if (replay_) {
      if (position_ >= cache_.size()) return false;
      if constexpr (std::is_copy_constructible_v<Batch>) fetched_.emplace(cache_[position_++]);
    } else {
      if (started_) ++*it_;
      started_ = true;
      if (*it_ == loader_.end()) return false;
      fetched_.emplace(Batch(std::move(**it_)));
      if (want_indices_) indices_ = loader_.batch_indices();
      if (cache_limit_ > 0 && static_cast<int64_t>(cache_.size()) < cache_limit_) {
        if constexpr (std::is_copy_constructible_v<Batch>)
          cache_.push_back(*fetched_);
        else
          throw ConfigError("overfit_batches keeps batches to replay them, which needs a copyable batch type");
      }
    }
    if (move) {
      // Lightning's batch transfer hooks; a "-true" precision converts the
      // batch on the device, after them.
      Batch batch = module_.on_before_batch_transfer(std::move(*fetched_), 0);
      batch = module_.transfer_batch_to_device(std::move(batch), *device_, 0);
      fetched_.emplace(module_.on_after_batch_transfer(std::move(batch), 0));
      if (precision_->converts_module()) fetched_.emplace(convert_batch(std::move(*fetched_), *precision_));
    }
    return true;
  }

  int64_t batch_size() const override { return fetched_ ? batch_size_of(*fetched_) : -1; }

  torch::Tensor step(Stage stage, int64_t batch_idx) override {
    Batch batch = take_or_copy();
    AutocastScope autocast(*precision_, *accelerator_);
    switch (stage) {
      case Stage::train:
        return module_.training_step(std::move(batch), batch_idx);
      case Stage::validate:
        module_.validation_step(std::move(batch), batch_idx);
        return {};
      case Stage::test:
        module_.test_step(std::move(batch), batch_idx);
        return {};
      case Stage::predict:
        return module_.predict_step(std::move(batch), batch_idx);
    }
    return {};
  }

  const void* held_batch() const override { return fetched_ ? &*fetched_ : nullptr; }
  const std::type_info& batch_type() const override { return typeid(Batch); }
  void drop_batch() override {
    fetched_.reset();
    indices_.reset();
  }

 private:
  Batch take_or_copy() {
    if constexpr (std::is_copy_constructible_v<Batch>) {
      return *fetched_;
    } else {
      Batch batch = std::move(*fetched_);
      fetched_.reset();
      return batch;
    }
  }

  BasicModule<Batch>& module_;
  AnyLoader<Batch>& loader_;
  std::optional<typename AnyLoader<Batch>::Iterator> it_;
  bool started_ = false;
  std::optional<Batch> fetched_;
  std::vector<Batch> cache_;
  bool replay_ = false;
  size_t position_ = 0;
};

template <typename Batch>
struct HeldLoader {
  AnyLoader<Batch> loader;
};

// The loader for one stage that a data module (BasicDataModule<Batch>) or the
// module itself makes, asked for when the loop opens it.
template <typename Batch, typename Source>
class SourceRunner final : private HeldLoader<Batch>, public LoaderRunner<Batch> {
 public:
  SourceRunner(BasicModule<Batch>& module, Source& source, Stage stage)
      : LoaderRunner<Batch>(module, this->HeldLoader<Batch>::loader), source_(source), stage_(stage) {}
  std::string source_name() const override { return source_.name(); }

  bool open() override {
    auto& loader = this->HeldLoader<Batch>::loader;
    switch (stage_) {
      case Stage::train:
        loader = source_.train_loader();
        break;
      case Stage::validate:
        loader = source_.val_loader();
        break;
      case Stage::test:
        loader = source_.test_loader();
        break;
      case Stage::predict:
        loader = source_.predict_loader();
        break;
    }
    return !loader.empty();
  }

 private:
  Source& source_;
  Stage stage_;
};

template <typename Batch>
using DataModuleRunner = SourceRunner<Batch, BasicDataModule<Batch>>;
template <typename Batch>
using ModuleLoaderRunner = SourceRunner<Batch, BasicModule<Batch>>;

template <typename T>
T& deref(T& loader) {
  return loader;
}
template <typename T>
T& deref(std::unique_ptr<T>& loader) {
  return *loader;
}
template <typename T>
T& deref(const std::shared_ptr<T>& loader) {
  return *loader;
}

// A loader given to fit, validate, test or predict: an AnyLoader of the
// module's batch type runs as it is, any other through one that refers to it.
template <typename Batch, typename Loader>
class GivenLoaderRunner final : private HeldLoader<Batch>, public LoaderRunner<Batch> {
  static constexpr bool kErased = std::is_same_v<Loader, AnyLoader<Batch>>;

 public:
  GivenLoaderRunner(BasicModule<Batch>& module, Loader& loader)
      : HeldLoader<Batch>{held(loader)}, LoaderRunner<Batch>(module, erased(loader, *this)) {}

 private:
  static AnyLoader<Batch> held(Loader& loader) {
    if constexpr (kErased)
      return {};
    else
      return AnyLoader<Batch>(std::ref(loader));
  }
  // Static: it runs before LoaderRunner is built, when no member may be called.
  static AnyLoader<Batch>& erased(Loader& loader, HeldLoader<Batch>& own) {
    if constexpr (kErased)
      return loader;
    else
      return own.loader;
  }
};

template <typename Batch, typename L>
auto make_runner(BasicModule<Batch>& module, L& loader) {
  auto& l = deref(loader);
  return GivenLoaderRunner<Batch, std::remove_reference_t<decltype(l)>>(module, l);
}

}  // namespace detail
}  // namespace fulgor

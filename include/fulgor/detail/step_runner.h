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
#include "fulgor/data/any_loader.h"
#include "fulgor/data/loader_protocol.h"
#include "fulgor/data_module.h"
#include "fulgor/detail/convert_batch.h"
#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/precision/precision.h"

namespace fulgor {

// The Trainer's compiled part takes these (Trainer::run_fit, run_eval): they
// cross from the headers into the library, as impl does (Note [Exported
// symbols] in fulgor/core/export.h).
namespace impl {

enum class Stage { train, validate, test, predict };

// A loader and a module's steps for it, with the batch type erased, so that
// the loops are compiled once, in src/loops/. It speaks the loader
// protocol (Note [The loader protocol]) for them.
class StepRunner {
 public:
  explicit StepRunner(std::optional<int64_t> length) : length_(length) {}
  virtual ~StepRunner() = default;
  // Takes the loader, where a data module or the module makes it (the loop
  // asks for it when it sets up its data, as Lightning's setup_data): false
  // when there is none.
  virtual bool open() { return true; }
  // The class that makes the loader, for messages ("" for a loader given).
  virtual std::string source_name() const { return {}; }
  // Batches per epoch, when the loader tells.
  std::optional<int64_t> length() const { return length_; }
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
  // Tells a loader with a set_epoch member which epoch comes next.
  virtual void set_epoch(int64_t epoch) = 0;
  // Makes a loader with a distribute member read `shard` (Note [Distributed
  // sampling] in src/trainer/state.cpp), and takes its new length; returns
  // false where the loader has no such member or declined.
  virtual bool distribute(const DistributedShard& shard) = 0;
  // Turns off a loader's shuffling where it can (TensorLoader::disable_shuffle):
  // returns whether it was shuffling.
  virtual bool disable_shuffle() = 0;
  // Makes the next epoch begin at `batch` where the loader can
  // (ImageLoader::start_at): false where the loop must fetch and drop the
  // batches before it.
  virtual bool start_at(int64_t batch) = 0;
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
  void set_length(std::optional<int64_t> length) { length_ = length; }

  const Accelerator* accelerator_ = nullptr;
  const Precision* precision_ = nullptr;
  std::optional<torch::Device> device_;
  int64_t cache_limit_ = 0;
  std::optional<std::vector<int64_t>> indices_;
  bool want_indices_ = false;

 private:
  std::optional<int64_t> length_;
};

}  // namespace impl

namespace detail {

using impl::Stage;
using impl::StepRunner;

// A loader's batch_indices() (Note [The loader protocol]), where it offers them.
template <typename L>
std::optional<std::vector<int64_t>> batch_indices_of(const L& loader) {
  if constexpr (has_batch_indices<L>::value) return loader.batch_indices();
  return std::nullopt;
}
template <typename B>
std::optional<std::vector<int64_t>> batch_indices_of(const AnyLoader<B>& loader) {
  return loader.batch_indices();
}

template <typename Batch, typename Loader>
class LoaderRunner : public StepRunner {
  using Iterator = decltype(std::declval<Loader&>().begin());
  using LoaderBatch = std::decay_t<decltype(*std::declval<Iterator&>())>;
  static_assert(std::is_constructible_v<Batch, LoaderBatch&&>,
                "the loader's batches do not convert to the module's batch type: derive the module from "
                "fulgor::BasicModule<B> with B the type the loader yields");

 public:
  LoaderRunner(BasicModule<Batch>& module, Loader& loader)
      : StepRunner(loader_length(loader)), module_(module), loader_(loader) {}

  // Note [Loader epochs]
  // A loader that shuffles by epoch number (TensorLoader) would otherwise
  // count its own epochs, which a resumed run starts again from 0; being told
  // the Trainer's epoch makes its order the uninterrupted run's.
  void set_epoch(int64_t epoch) override {
    if constexpr (has_set_epoch<Loader>::value) loader_.set_epoch(epoch);
  }

  bool distribute(const DistributedShard& shard) override {
    if constexpr (has_distribute<Loader>::value) {
      const bool done = loader_.distribute(shard);
      set_length(loader_length(loader_));
      return done;
    }
    return false;
  }

  bool disable_shuffle() override {
    if constexpr (has_disable_shuffle<Loader>::value) return loader_.disable_shuffle();
    return false;
  }

  bool start_at(int64_t batch) override {
    // overfit_batches replays its cache, which the loader does not know of.
    if constexpr (has_start_at<Loader>::value)
      if (cache_limit_ == 0) return loader_.start_at(batch);
    return false;
  }

  void start_epoch() override {
    fetched_.reset();
    replay_ = cache_limit_ > 0 && static_cast<int64_t>(cache_.size()) == cache_limit_;
    position_ = 0;
    if constexpr (has_batches_on<Loader>::value) module_.transfer_moves_ = !loader_.batches_on(*device_);
    module_.transfer_accelerator_ = accelerator_;
    if (replay_) return;
    cache_.clear();
    it_.reset();
    end_.reset();
    if constexpr (has_bind_device<Loader>::value) loader_.bind_device(*accelerator_, *device_);
    it_.emplace(loader_.begin());
    end_.emplace(loader_.end());
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
      if (*it_ == *end_) return false;
      fetched_.emplace(Batch(std::move(**it_)));
      if (want_indices_) indices_ = batch_indices_of(loader_);
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
  Loader& loader_;
  std::optional<Iterator> it_, end_;
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
class SourceRunner final : private HeldLoader<Batch>, public LoaderRunner<Batch, AnyLoader<Batch>> {
 public:
  SourceRunner(BasicModule<Batch>& module, Source& source, Stage stage)
      : LoaderRunner<Batch, AnyLoader<Batch>>(module, this->HeldLoader<Batch>::loader),
        source_(source),
        stage_(stage) {}
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
    this->set_length(loader.length());
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

template <typename Batch, typename L>
auto make_runner(BasicModule<Batch>& module, L& loader) {
  auto& l = deref(loader);
  return LoaderRunner<Batch, std::remove_reference_t<decltype(l)>>(module, l);
}

}  // namespace detail
}  // namespace fulgor

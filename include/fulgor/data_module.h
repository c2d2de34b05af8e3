#pragma once

#include <torch/data/example.h>
#include <nlohmann/json.hpp>

#include <string>

#include "fulgor/core/export.h"
#include "fulgor/data/any_loader.h"

namespace fulgor {

class Trainer;
namespace detail {
struct DataModuleAccess;
}

/// The part of a data module that does not depend on the batch type. Derive
/// from BasicDataModule<Batch> (or DataModule) rather than from this class.
///
/// Contract (Lightning's LightningDataModule): a Trainer given a data module
/// calls, in each of fit, validate, test and predict: prepare_data() on one
/// process per node (or of the whole job, when prepare_data_per_node() is
/// false) before any process's setup; setup(stage) before the callbacks' and
/// the module's; the loader of each loop when the loop needs it; and
/// teardown(stage) before the callbacks' and the module's. state_dict() is
/// saved in checkpoints under name() and given back to load_state_dict() when
/// a checkpoint with that name is restored; the hyper-parameters are saved
/// beside it and sent to the loggers with the module's.
class FULGOR_API DataModuleBase {
 public:
  virtual ~DataModuleBase() = default;

  /// Work to do once per node (downloading, unpacking), not per process.
  virtual void prepare_data() {}
  /// Whether prepare_data runs on each node's local rank 0 (true, the
  /// default) or on the job's rank 0 only.
  virtual bool prepare_data_per_node() const { return true; }
  /// `stage` is "fit", "validate", "test" or "predict".
  virtual void setup(const std::string& /*stage*/) {}
  virtual void teardown(const std::string& /*stage*/) {}

  /// State to keep in checkpoints (its position in a data stream, say);
  /// nothing by default.
  virtual nlohmann::json state_dict() const { return nlohmann::json::object(); }
  virtual void load_state_dict(const nlohmann::json& /*state*/) {}
  /// The name its state is saved under: by default its type's name, as
  /// Lightning uses the class's qualified name.
  virtual std::string name() const;

  /// Records hyper-parameters: saved in checkpoints and sent to the loggers,
  /// merged with the module's (a key both have with different values is a
  /// ConfigError).
  void save_hyperparameters(nlohmann::json hparams) { hparams_ = std::move(hparams); }
  const nlohmann::json& hparams() const { return hparams_; }

  /// The Trainer running a loop with this data module; throws Error when none is.
  Trainer& trainer() const;

 private:
  friend struct detail::DataModuleAccess;
  Trainer* trainer_ = nullptr;
  nlohmann::json hparams_ = nlohmann::json::object();
};

/// A LightningDataModule for batches of type `Batch`: it owns the data and
/// makes each loop's loader.
///
///   struct FashionMNIST : fulgor::DataModule {
///     void setup(const std::string& stage) override;         // load, split
///     fulgor::AnyLoader<> train_loader() override;           // fulgor::TensorLoader(...)
///     fulgor::AnyLoader<> val_loader() override;
///   };
///   trainer.fit(model, datamodule);
///
/// A loader it does not override is empty: fit without val_loader does not
/// validate; fit without train_loader, and validate, test or predict without
/// theirs, throw ConfigError.
template <typename Batch = torch::data::Example<>>
class BasicDataModule : public DataModuleBase {
 public:
  using BatchType = Batch;

  virtual AnyLoader<Batch> train_loader() { return {}; }
  virtual AnyLoader<Batch> val_loader() { return {}; }
  virtual AnyLoader<Batch> test_loader() { return {}; }
  virtual AnyLoader<Batch> predict_loader() { return {}; }
};

using DataModule = BasicDataModule<torch::data::Example<>>;

}  // namespace fulgor

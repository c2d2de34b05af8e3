#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Writes what predict() predicts (Lightning's BasePredictionWriter): derive
/// from it and override write_on_batch_end, write_on_epoch_end or both.
///
/// Contract: write_interval is "batch" (write_on_batch_end after each
/// prediction batch), "epoch" (write_on_epoch_end once the prediction epoch
/// ends, with its predictions moved to the CPU, in batch order) or
/// "batch_and_epoch" (both); another value is a ConfigError naming the three.
/// The batch indices are the data set's indices of each batch's samples where
/// the loader tells (TensorLoader; Note [The loader protocol]): empty
/// otherwise. Under ddp every rank runs its shard of the prediction data and
/// writes its own part: write with trainer.global_rank() in the file names.
/// The defaults of write_on_batch_end and write_on_epoch_end throw Error, as
/// Lightning's raise NotImplementedError.
class FULGOR_API BasePredictionWriter : public Callback {
 public:
  explicit BasePredictionWriter(const std::string& write_interval = "batch");

  const std::string& write_interval() const { return interval_; }

  /// `batch_indices`: empty where the loader does not tell them.
  virtual void write_on_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& prediction,
                                  const std::vector<int64_t>& batch_indices, const BatchEnd& end);
  /// One prediction and one list of indices per batch.
  virtual void write_on_epoch_end(Trainer& trainer, ModuleBase& module, const std::vector<torch::Tensor>& predictions,
                                  const std::vector<std::vector<int64_t>>& batch_indices);

  void on_predict_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_predict_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_predict_epoch_end(Trainer& trainer, ModuleBase& module) override;

 private:
  std::string interval_;
  bool on_batch_ = false, on_epoch_ = false;
  std::vector<torch::Tensor> predictions_;
  std::vector<std::vector<int64_t>> batch_indices_;
};

/// A prediction writer to .pt files that Python reads with
/// torch.load(path, weights_only=True), on torch 1.13 and 2.x.
///
/// Contract: in `output_dir` (made when missing), for rank R (0 outside ddp):
/// per batch I (write_interval "batch"), `predictions_R_I.pt` holds the
/// prediction tensor and `batch_indices_R_I.pt` the list of its samples'
/// indices; per epoch ("epoch"), `predictions_R.pt` holds the list of the
/// batches' predictions and `batch_indices_R.pt` the list of their index
/// lists, as the example of Lightning's BasePredictionWriter writes them. An
/// index file is written only where the loader tells the indices. Files of an
/// earlier run with the same names are replaced.
class FULGOR_API TorchSavePredictionWriter : public BasePredictionWriter {
 public:
  explicit TorchSavePredictionWriter(std::filesystem::path output_dir, const std::string& write_interval = "batch");

  const std::filesystem::path& output_dir() const { return output_dir_; }

  void write_on_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& prediction,
                          const std::vector<int64_t>& batch_indices, const BatchEnd& end) override;
  void write_on_epoch_end(Trainer& trainer, ModuleBase& module, const std::vector<torch::Tensor>& predictions,
                          const std::vector<std::vector<int64_t>>& batch_indices) override;

 private:
  std::filesystem::path output_dir_;
};

}  // namespace fulgor

#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/error.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// What SpikeDetection throws (Lightning's TrainingSpikeException).
class FULGOR_API TrainingSpikeException : public Error {
 public:
  explicit TrainingSpikeException(int64_t batch_idx)
      : Error("Training spike detected in batch " + std::to_string(batch_idx)), batch_idx_(batch_idx) {}
  int64_t batch_idx() const { return batch_idx_; }

 private:
  int64_t batch_idx_;
};

/// Options of SpikeDetection, with Lightning's defaults.
struct SpikeDetectionOptions {
  std::string mode = "min";          ///< whether the loss is to be minimized ("min") or maximized ("max")
  int64_t window = 10;               ///< the running mean's number of batches, the reference for spikes
  int64_t warmup = 1;                ///< the batch index within an epoch from which spikes are looked for
  std::optional<double> atol;        ///< a spike differs from the running mean by at least this much
  std::optional<double> rtol = 2.0;  ///< ... and by at least rtol times the running mean
  /// The JSON file of the batches to skip; default: default_root_dir/skip_batches.json.
  /// A path not ending in ".json" is a folder to write skip_batches.json into.
  std::string exclude_batches_path;
  bool finite_only = true;  ///< a NaN or infinite loss is a spike
};

/// Ends training when the loss spikes (Lightning's SpikeDetection): a loss
/// that is no improvement on the last one and differs from the running mean
/// of the last `window` finite losses by at least atol and rtol times that
/// mean. It then writes the indices of this batch and the one before (which
/// may have corrupted the weights) to exclude_batches_path, as a JSON list of
/// all the batches found so far, and throws TrainingSpikeException.
///
/// Contract: checks each training batch's loss, from batch index `warmup`
/// of each epoch on. Under ddp each rank checks its own losses and all ranks
/// throw when any finds a spike; rank 0 writes the file. The running mean,
/// the last loss and the batches found are in checkpoints. An unknown mode,
/// or a window below 1, is a ConfigError.
class FULGOR_API SpikeDetection : public Callback {
 public:
  explicit SpikeDetection(SpikeDetectionOptions options = {});

  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;

  /// The batch indices found so far: each spike's and the one before it.
  const std::vector<int64_t>& bad_batches() const { return bad_batches_; }
  /// The file the bad batches are written to, once the first batch resolved it.
  const std::string& exclude_batches_path() const { return options_.exclude_batches_path; }

 private:
  bool is_spike(double loss) const;
  double running_mean() const;
  void handle_spike(Trainer& trainer, int64_t batch_idx);

  SpikeDetectionOptions options_;
  std::deque<double> window_;
  double last_val_ = 0.0;
  std::vector<int64_t> bad_batches_;
};

}  // namespace fulgor

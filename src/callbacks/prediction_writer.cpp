#include "fulgor/callbacks/prediction_writer.h"

#include <ATen/core/ivalue.h>
#include <fmt/format.h>

#include <utility>

#include "fulgor/core/error.h"
#include "fulgor/interop/torch_save.h"
#include "fulgor/trainer.h"

namespace fulgor {

BasePredictionWriter::BasePredictionWriter(const std::string& write_interval) : interval_(write_interval) {
  on_batch_ = interval_ == "batch" || interval_ == "batch_and_epoch";
  on_epoch_ = interval_ == "epoch" || interval_ == "batch_and_epoch";
  if (!on_batch_ && !on_epoch_)
    throw ConfigError(fmt::format("`write_interval` should be one of ['batch', 'epoch', 'batch_and_epoch'], not '{}'",
                                  write_interval));
}

void BasePredictionWriter::write_on_batch_end(Trainer&, ModuleBase&, const torch::Tensor&, const std::vector<int64_t>&,
                                              const BatchEnd&) {
  throw Error("BasePredictionWriter with write_interval '" + interval_ + "': override write_on_batch_end");
}

void BasePredictionWriter::write_on_epoch_end(Trainer&, ModuleBase&, const std::vector<torch::Tensor>&,
                                              const std::vector<std::vector<int64_t>>&) {
  throw Error("BasePredictionWriter with write_interval '" + interval_ + "': override write_on_epoch_end");
}

void BasePredictionWriter::on_predict_epoch_start(Trainer&, ModuleBase&) {
  predictions_.clear();
  batch_indices_.clear();
}

void BasePredictionWriter::on_predict_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  static const std::vector<int64_t> none;
  const std::vector<int64_t>& indices = end.batch_indices ? *end.batch_indices : none;
  if (on_batch_) write_on_batch_end(trainer, module, end.outputs, indices, end);
  if (on_epoch_) {
    // As Lightning's prediction loop keeps them: on the CPU.
    predictions_.push_back(end.outputs.defined() ? end.outputs.to(torch::kCPU) : end.outputs);
    batch_indices_.push_back(indices);
  }
}

void BasePredictionWriter::on_predict_epoch_end(Trainer& trainer, ModuleBase& module) {
  if (!on_epoch_) return;
  write_on_epoch_end(trainer, module, predictions_, batch_indices_);
  predictions_.clear();
  batch_indices_.clear();
}

namespace {
c10::IValue index_list(const std::vector<int64_t>& indices) { return c10::List<int64_t>(indices); }
}  // namespace

TorchSavePredictionWriter::TorchSavePredictionWriter(std::filesystem::path output_dir,
                                                     const std::string& write_interval)
    : BasePredictionWriter(write_interval), output_dir_(std::move(output_dir)) {}

void TorchSavePredictionWriter::write_on_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor& prediction,
                                                   const std::vector<int64_t>& batch_indices, const BatchEnd& end) {
  std::filesystem::create_directories(output_dir_);
  const auto stem = fmt::format("{}_{}.pt", trainer.global_rank(), end.batch_idx);
  torch_save(prediction, output_dir_ / ("predictions_" + stem));
  if (end.batch_indices) torch_save(index_list(batch_indices), output_dir_ / ("batch_indices_" + stem));
}

void TorchSavePredictionWriter::write_on_epoch_end(Trainer& trainer, ModuleBase&,
                                                   const std::vector<torch::Tensor>& predictions,
                                                   const std::vector<std::vector<int64_t>>& batch_indices) {
  std::filesystem::create_directories(output_dir_);
  const auto stem = fmt::format("{}.pt", trainer.global_rank());
  c10::List<torch::Tensor> tensors;
  for (const auto& p : predictions) tensors.push_back(p);
  torch_save(tensors, output_dir_ / ("predictions_" + stem));
  c10::impl::GenericList lists(c10::ListType::ofInts());
  bool known = !batch_indices.empty();
  for (const auto& indices : batch_indices) {
    known = known && !indices.empty();
    lists.push_back(index_list(indices));
  }
  if (known) torch_save(lists, output_dir_ / ("batch_indices_" + stem));
}

}  // namespace fulgor

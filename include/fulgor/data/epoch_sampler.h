#pragma once

#include <torch/data/samplers/base.h>

#include <cstdint>

namespace fulgor {

/// A sampler whose order depends on the epoch, as PyTorch's samplers with
/// set_epoch do (a shuffling distributed sampler draws each epoch's order
/// from seed + epoch, the same on every rank).
///
/// fulgor::TensorLoader calls set_epoch with the loader's epoch (which the
/// Trainer sets to its own) as each iteration begins, before reset(). It does
/// the same for LibTorch's torch::data::samplers::DistributedSampler<>.
class EpochSampler : public torch::data::samplers::Sampler<> {
 public:
  virtual void set_epoch(uint64_t epoch) = 0;
};

}  // namespace fulgor

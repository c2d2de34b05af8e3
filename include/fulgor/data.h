#pragma once

#include <torch/data/dataloader.h>
#include <torch/data/samplers/random.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "fulgor/data/loader_protocol.h"
#include "fulgor/error.h"

namespace fulgor {

/// A LibTorch data loader that also tells how many batches an epoch has, which
/// fractional limits and val_check_interval need (LibTorch's loaders keep their
/// dataset and sampler private). Iterates exactly like the loader it wraps.
template <typename Loader>
class SizedDataLoader {
 public:
  SizedDataLoader(std::unique_ptr<Loader> loader, int64_t batches) : loader_(std::move(loader)), batches_(batches) {}
  auto begin() { return loader_->begin(); }
  auto end() { return loader_->end(); }
  /// Batches per epoch.
  int64_t size() const { return batches_; }
  Loader& loader() { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
  int64_t batches_;
};

/// torch::data::make_data_loader, returning a loader that knows its length.
/// Requires a dataset whose size() is known.
template <typename Sampler = torch::data::samplers::RandomSampler, typename Dataset>
SizedDataLoader<torch::data::StatelessDataLoader<Dataset, Sampler>> make_data_loader(
    Dataset dataset, torch::data::DataLoaderOptions options) {
  auto size = dataset.size();
  if (!size) throw ConfigError("fulgor::make_data_loader needs a dataset with a known size()");
  const auto n = static_cast<int64_t>(*size), batch = static_cast<int64_t>(options.batch_size());
  const int64_t batches = options.drop_last() ? n / batch : (n + batch - 1) / batch;
  return {torch::data::make_data_loader(std::move(dataset), Sampler(*size), std::move(options)), batches};
}

template <typename Sampler = torch::data::samplers::RandomSampler, typename Dataset>
SizedDataLoader<torch::data::StatelessDataLoader<Dataset, Sampler>> make_data_loader(Dataset dataset,
                                                                                     size_t batch_size) {
  return fulgor::make_data_loader<Sampler>(std::move(dataset), torch::data::DataLoaderOptions(batch_size));
}

}  // namespace fulgor

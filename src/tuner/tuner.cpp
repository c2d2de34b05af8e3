// Lightning's Tuner (tuner/tuning.py): a fit with a finder first among the
// callbacks, ended by the finder once its sweep is over.

#include "fulgor/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <typeinfo>

#include "detail/demangle.h"
#include "fulgor/core/error.h"
#include "tuner/sweep.h"

namespace fulgor {

namespace {

// Runs `fit` with `finder` first among the Trainer's callbacks, and takes it
// out again however the fit ends.
void run_tuned_fit(Trainer& trainer, const std::shared_ptr<Callback>& finder, const std::function<void()>& fit) {
  auto& callbacks = detail::TrainerAccess::state(trainer).callbacks;
  for (const auto& cb : callbacks)
    if (typeid(*cb) == typeid(*finder))
      throw ConfigError(
          fmt::format("Tuner: the Trainer already has a {} among its callbacks; remove it, or let "
                      "that callback do the search as fit begins",
                      detail::demangle(typeid(*finder).name())));
  callbacks.insert(callbacks.begin(), finder);
  struct Remove {
    std::vector<std::shared_ptr<Callback>>& callbacks;
    const Callback* finder;
    ~Remove() {
      callbacks.erase(
          std::remove_if(callbacks.begin(), callbacks.end(), [&](const auto& cb) { return cb.get() == finder; }),
          callbacks.end());
    }
  } remove{callbacks, finder.get()};
  try {
    fit();
  } catch (const detail::TunerExit&) {
  }
}

}  // namespace

std::optional<LRFinder> Tuner::lr_find_with(const LrFindOptions& options, const std::function<void()>& fit) {
  auto finder = std::make_shared<LearningRateFinder>(options);
  finder->early_exit_ = true;
  run_tuned_fit(trainer_, finder, fit);
  return finder->result();
}

std::optional<int64_t> Tuner::scale_batch_size_with(const ScaleBatchSizeOptions& options,
                                                    const std::function<void()>& fit) {
  auto finder = std::make_shared<BatchSizeFinder>(options);
  finder->early_exit_ = true;
  run_tuned_fit(trainer_, finder, fit);
  return finder->optimal_batch_size();
}

}  // namespace fulgor

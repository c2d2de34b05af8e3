#pragma once

// The schedules made of schedules: SequentialLR and ChainedScheduler.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/lr_scheduler.h"

namespace fulgor {

/// Runs its schedules one after the other, switching at each milestone
/// (torch.optim.lr_scheduler.SequentialLR: the next schedule starts from its
/// step 0, with its closed form where it has one). Make the schedules first,
/// in order, then this; all on `optimizer`.
class FULGOR_API SequentialLR : public LRScheduler {
 public:
  SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step(std::optional<double> metric = std::nullopt) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override { return last_lr_; }
  void undo_initial_step() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// Steps all its schedules at every step, each from the rates the one before
/// left (torch.optim.lr_scheduler.ChainedScheduler).
class FULGOR_API ChainedScheduler : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  void step(std::optional<double> metric = std::nullopt) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override { return last_lr_; }
  void undo_initial_step() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

}  // namespace fulgor

#include "fulgor/callbacks/learning_rate_monitor.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "detail/demangle.h"
#include "fulgor/trainer.h"

namespace fulgor {
using detail::demangle;

void LearningRateMonitor::log(Trainer& trainer, Interval interval) {
  std::map<std::string, double> lrs;
  const auto& optimizers = trainer.optimizers();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const SchedulerConfig* config = nullptr;
    for (const auto& sc : trainer.lr_schedulers())
      if (&sc.scheduler->optimizer() == optimizers[i].get()) config = &sc;
    const Interval own = config ? config->interval : Interval::epoch;
    if ((logging_interval_ ? *logging_interval_ : own) != interval) continue;
    std::string name = config && !config->name.empty() ? config->name : [&] {
      std::string type = demangle(typeid(*optimizers[i]).name());
      return "lr-" + type.substr(type.rfind(':') == std::string::npos ? 0 : type.rfind(':') + 1);
    }();
    if (optimizers.size() > 1 && !(config && !config->name.empty())) name += "-" + std::to_string(i);
    const auto& groups = optimizers[i]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      lrs[g == 0 ? name : fmt::format("{}/pg{}", name, g + 1)] = groups[g].options().get_lr();
  }
  if (!lrs.empty()) trainer.log_metrics(lrs);
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, ModuleBase&) { log(trainer, Interval::epoch); }

void LearningRateMonitor::on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t) {
  if (trainer.logs_due()) log(trainer, Interval::step);
}

}  // namespace fulgor

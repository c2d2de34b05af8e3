#pragma once

// What Fabric keeps of each module it set up (fabric.cpp and
// fabric_checkpoint.cpp).

#include <torch/nn/module.h>

#include "distributed/parameter_shards.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/distributed/strategy.h"

namespace fulgor::detail {

struct FabricModule {
  torch::nn::Module* module = nullptr;
  DataParallelModule parallel;  // empty on one process

  /// Whether backward communicates the module's gradients (false inside
  /// no_backward_sync). The synchronizer holds it where there is one.
  bool sync() const { return parallel.synchronizer ? parallel.synchronizer->sync() : sync_; }
  void set_sync(bool sync) {
    if (parallel.shards) parallel.shards->set_synchronizing(sync);
    if (parallel.synchronizer)
      parallel.synchronizer->set_sync(sync);
    else
      sync_ = sync;
  }

 private:
  bool sync_ = true;  // where the gradients are sharded, with no synchronizer
};

}  // namespace fulgor::detail

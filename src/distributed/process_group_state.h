#pragma once

// The c10d objects behind fulgor::ProcessGroup, shared with the gradient synchronizer.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>

#include "distributed/working_memory.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/process_group.h"

namespace fulgor {

struct ProcessGroup::State {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  int64_t rank = 0;
  int64_t size = 1;
  std::string backend;
  std::chrono::milliseconds timeout{};
  torch::Device device{torch::kCPU};
  std::string master_addr;
  int64_t groups_made = 0;  // by new_group, the same count on every rank
  /// The option a user sets the timeout with, named when it runs out.
  std::string timeout_option = "ProcessGroupOptions::timeout";
  /// Collectives run so far, the same count on every rank in step.
  mutable int64_t collectives = 0;
  /// What the collectives Gloo lacks are made in (Note [Collectives Gloo lacks]).
  detail::WorkingMemory working_memory;

  /// Makes `group` for this rank of `size` from the other fields.
  void connect();
  /// The error for `collective` having failed with `reason`, naming the
  /// ranks that did not arrive (Note [Naming the ranks that did not arrive]).
  DistributedError failure(const std::string& collective, const std::string& reason) const;
  /// Runs `body` (which issues and waits for c10d work), turning its failure into failure(collective, ...).
  void run(const std::string& collective, const std::function<void()>& body) const;
  /// Waits for `work` within the timeout.
  void wait(const c10::intrusive_ptr<c10d::Work>& work) const;
};

namespace detail {
/// An exception's message without the C++ backtrace c10::Error appends.
std::string message_of(const std::exception& error);

struct ProcessGroupAccess {
  static ProcessGroup::State& state(const ProcessGroup& group) { return *group.state_; }
};
}  // namespace detail
}  // namespace fulgor

// What the checkpoint tests share: a model with state everywhere a resume
// could lose it, fitted, and its files read back.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>

#include "../../support/tiny.h"

namespace fulgor::testing {

// Dropout, Adam and a scheduler: state everywhere a resume could lose it.
inline std::unique_ptr<TinyNet> stateful_model() { return adam_step_lr_net(21, 0.3); }

inline TrainerOptions resumable(const TempDir& dir, int64_t epochs) {
  auto o = quiet(dir.str());
  o.max_epochs = epochs;
  o.num_sanity_val_steps = 1;
  return o;
}

// A Trainer that has fitted `model` for an epoch, to save checkpoints of it.
inline std::unique_ptr<Trainer> fitted_one_epoch(const TempDir& dir, TinyNet& model) {
  auto train = sequential_loader(16, 8);
  auto trainer = std::make_unique<Trainer>(resumable(dir, 1));
  trainer->fit(model, train);
  return trainer;
}

inline std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline std::set<std::string> listing(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) names.insert(e.path().string());
  return names;
}

}  // namespace fulgor::testing

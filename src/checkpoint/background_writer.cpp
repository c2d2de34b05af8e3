#include "checkpoint/background_writer.h"

#include <fmt/format.h>

#include <memory>
#include <utility>

#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"

namespace fulgor::detail {

BackgroundWriter::~BackgroundWriter() {
  // A Trainer destroyed without finishing its fit still leaves a complete
  // file or none, never a half-written one.
  if (thread_.joinable()) thread_.join();
}

void BackgroundWriter::start(std::string path, torch::serialize::OutputArchive archive,
                             std::vector<torch::Tensor> owned, bool write, std::function<void()> on_written) {
  if (!write) return start(std::move(path), nullptr, std::move(on_written));
  // Held by a pointer: LibTorch's OutputArchive copies only from a non-const
  // reference, which clang refuses in the copy constructor std::function
  // declares for a lambda holding it.
  auto held = std::make_shared<torch::serialize::OutputArchive>(std::move(archive));
  auto kept = std::make_shared<std::vector<torch::Tensor>>(std::move(owned));
  start(
      path, [path, held, kept] { write_checkpoint_file(path, *held); }, std::move(on_written));
}

void BackgroundWriter::start(std::string path, std::function<void()> write, std::function<void()> on_written) {
  path_ = std::move(path);
  on_written_ = std::move(on_written);
  error_.clear();
  pending_ = true;
  if (!write) {  // a rank that writes nothing
    ended_.store(true, std::memory_order_release);
    return;
  }
  ended_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this, write = std::move(write)]() mutable {
    try {
      write();
    } catch (const CheckpointError& e) {
      error_ = e.what();
    } catch (const std::exception& e) {
      error_ = fmt::format("cannot write checkpoint '{}': {}", path_, e.what());
    }
    // What the write held (the archive, the snapshot's copies) is freed
    // here, on this thread, before the write counts as ended.
    write = nullptr;
    ended_.store(true, std::memory_order_release);
  });
}

std::string BackgroundWriter::finish_quietly() {
  if (!pending_) return "";
  if (thread_.joinable()) thread_.join();
  pending_ = false;
  auto on_written = std::move(on_written_);
  on_written_ = nullptr;
  if (!error_.empty()) return std::exchange(error_, std::string());
  if (on_written) on_written();
  return "";
}

void BackgroundWriter::finish() {
  if (std::string error = finish_quietly(); !error.empty()) throw CheckpointError(error);
}

}  // namespace fulgor::detail

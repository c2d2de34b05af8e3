#pragma once

#include <torch/serialize/output-archive.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace fulgor::detail {

// Note [Asynchronous checkpoints]
// An asynchronous save pauses training only to build the checkpoint's archive
// and copy its tensors to host memory (snapshot_to_host); a thread of its own
// then serialises the archive, writes, fsyncs and renames the file
// (write_checkpoint_file, the same atomic write as a synchronous save). A
// sharded checkpoint's save (Note [Sharded training checkpoints]) copies each
// rank's entries so, and its thread runs the whole distributed save, whose
// collectives go over a process group of their own. One
// write is in flight at most: the next save waits for it first. What waits
// for the file on disk (ModelCheckpoint's removal of the files it displaces)
// runs on the training thread once the write has completed, in the order of
// the saves, so a crash never loses the previous file before the new one is
// complete. The training loop looks after each batch whether the write has
// ended (an atomic load); a failed write is a CheckpointError then, or at the
// latest when the fit ends. Every end of a fit (its return, a signal's stop,
// an exception) first waits for the write in flight.
class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Starts writing `archive` to `path`, keeping `owned` (snapshot_to_host's)
  // until it is written; with `write` false, as on the ranks that do not
  // write, nothing is written. `on_written` runs in finish(). Requires that
  // no write is in flight (finish() was called).
  void start(std::string path, torch::serialize::OutputArchive archive, std::vector<torch::Tensor> owned, bool write,
             std::function<void()> on_written);
  // Starts `write`, which saves the checkpoint at `path` and throws
  // CheckpointError when it cannot, and frees what it holds once it ended;
  // an empty `write` writes nothing (the ranks that do not write).
  void start(std::string path, std::function<void()> write, std::function<void()> on_written);
  // Whether a write was started and not yet finished.
  bool pending() const { return pending_; }
  // Whether the write in flight has ended, successfully or not.
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  // Waits for the write in flight, if any, then runs its on_written or
  // throws its CheckpointError.
  void finish();
  // Waits for the write in flight, if any, and returns its error ("" when it
  // succeeded, after running its on_written): for an exception's unwinding,
  // which must not throw another.
  std::string finish_quietly();

 private:
  std::thread thread_;
  std::atomic<bool> ended_{false};
  bool pending_ = false;
  std::string path_, error_;
  std::function<void()> on_written_;
};

}  // namespace fulgor::detail

#include "distributed/rank_whereabouts.h"

#include <fmt/format.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace fulgor::detail {
namespace {

std::string key_of(int64_t rank) { return fmt::format("fulgor_collective_failed/{}", rank); }

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// What the posting thread hands back; shared, since the thread may outlive
// the wait for it.
struct Outcome {
  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false;
  std::string error;
  std::vector<std::string> posts;  // by rank; empty where none came
};

void collect(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t size, std::string post,
             std::chrono::steady_clock::time_point deadline, const std::shared_ptr<Outcome>& outcome) {
  std::vector<std::string> posts(size);
  std::string error;
  try {
    store->set(key_of(rank), std::vector<uint8_t>(post.begin(), post.end()));
    posts[rank] = post;
    for (;;) {
      bool all = true;
      for (int64_t r = 0; r < size; ++r)
        if (posts[r].empty()) {
          if (store->check({key_of(r)}))
            posts[r] = text_of(store->get(key_of(r)));
          else
            all = false;
        }
      if (all || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    error = e.what();
    error = error.substr(0, error.find('\n'));
  }
  std::lock_guard<std::mutex> lock(outcome->mutex);
  outcome->posts = std::move(posts);
  outcome->error = std::move(error);
  outcome->done = true;
  outcome->done_changed.notify_all();
}

}  // namespace

RankWhereabouts find_whereabouts(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t size,
                                 int64_t sequence, const std::string& collective, std::chrono::milliseconds slack) {
  RankWhereabouts found;
  const auto deadline = std::chrono::steady_clock::now() + slack;
  auto outcome = std::make_shared<Outcome>();
  std::thread(collect, store, rank, size, fmt::format("{} {}", sequence, collective), deadline, outcome).detach();
  std::unique_lock<std::mutex> lock(outcome->mutex);
  // A second past the deadline for the last store call to answer.
  if (!outcome->done_changed.wait_until(lock, deadline + std::chrono::seconds(1), [&] { return outcome->done; })) {
    found.unknown_because =
        fmt::format("the job's store, hosted by rank 0, did not answer within {} ms: rank 0 may be stopped or gone",
                    slack.count() + 1000);
    return found;
  }
  // Rank 0 hosts the store, and its own failure, once it has posted, ends
  // the store with the window of the ranks still reading: what they read
  // until then stands.
  const bool host_left = rank != 0 && !outcome->posts[0].empty();
  if (!outcome->error.empty() && !host_left) {
    found.unknown_because =
        fmt::format("the job's store, hosted by rank 0, failed ({}): rank 0 may be stopped or gone", outcome->error);
    return found;
  }
  found.known = true;
  const std::string mine = std::to_string(sequence);
  for (int64_t r = 0; r < size; ++r) {
    if (r == rank) continue;
    const std::string& post = outcome->posts[r];
    const size_t space = post.find(' ');
    if (post.empty() || space == std::string::npos)
      found.absent.push_back(r);
    else if (post.substr(0, space) == mine)
      found.waiting.push_back(r);
    else
      found.elsewhere.emplace_back(r, fmt::format("{} (collective {})", post.substr(space + 1), post.substr(0, space)));
  }
  return found;
}

std::string name_ranks(const std::vector<int64_t>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  std::string names;
  for (size_t i = 0; i < ranks.size(); ++i)
    names += fmt::format("{}{}", i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ", ranks[i]);
  return "ranks " + names;
}

}  // namespace fulgor::detail

#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fulgor::detail {

// Note [Metric tables]
// log() runs at every step, usually for the same names in the same order. A
// MetricTable keeps its values in a std::map (what the Trainer's metric
// accessors return) and remembers where the names looked up lately live, in
// the order they came: the next lookup is then one comparison with the name
// expected next instead of a walk down the tree, which on a small model costs
// more in code-cache misses than in instructions (Note [The per-step path] in
// src/loops/training_epoch_loop.cpp). A map node stays where it is until it is erased, and the table
// erases only in clear(), which forgets the remembered places too.
template <typename V>
class MetricTable {
 public:
  V& operator[](std::string_view name) {
    if (next_ >= recent_.size()) next_ = 0;  // a new step begins
    if (next_ < recent_.size() && recent_[next_].first == name) return *recent_[next_++].second;
    return find_or_add(name);
  }

  void clear() {
    map_.clear();
    recent_.clear();
    next_ = 0;
  }

  const std::map<std::string, V>& map() const { return map_; }

 private:
  // A step that logs more names than this is rare: the others go to the map.
  static constexpr size_t kRemembered = 64;

  // Out of line, so that operator[] stays small enough to inline.
  [[gnu::noinline]] V& find_or_add(std::string_view name) {
    for (size_t i = 0; i < recent_.size(); ++i)
      if (recent_[i].first == name) {
        next_ = i + 1;
        return *recent_[i].second;
      }
    auto& [key, value] = *map_.try_emplace(std::string(name)).first;
    if (recent_.size() < kRemembered) {
      recent_.emplace_back(key, &value);
      next_ = recent_.size();
    }
    return value;
  }

  std::map<std::string, V> map_;
  std::vector<std::pair<std::string_view, V*>> recent_;  // keys and values in map_
  size_t next_ = 0;
};

}  // namespace fulgor::detail

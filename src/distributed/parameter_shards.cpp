#include "parameter_shards.h"

#include <fmt/format.h>
#include <torch/optim/lbfgs.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

// One message of the collectives carries at most this much, as a ddp bucket.
constexpr int64_t kBucketBytes = int64_t(25) << 20;

using ParamState = torch::optim::OptimizerParamState;

// The key of a parameter's state: LibTorch 1.13 keys the optimizers' state by
// the TensorImpl's address written as a string, 2.x by the address itself.
template <typename Map>
typename Map::key_type state_key(const torch::Tensor& p, const Map&) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream address;  // c10::guts::to_string's form
    address << p.unsafeGetTensorImpl();
    return address.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// What `state` writes, readable: an optimizer's per-parameter state is open
// only through its serialize().
torch::serialize::InputArchive readable(const std::function<void(torch::serialize::OutputArchive&)>& write) {
  torch::serialize::OutputArchive out;
  write(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  return in;
}

// `state` with each tensor `convert` accepts replaced by what it returns:
// the same type of state (Adam's, SGD's, ...), its other fields as they were.
std::unique_ptr<ParamState> converted(const ParamState& state,
                                      const std::function<torch::Tensor(const torch::Tensor&)>& convert) {
  auto fields = readable([&](torch::serialize::OutputArchive& out) { state.serialize(out); });
  auto result = readable([&](torch::serialize::OutputArchive& out) {
    for (const std::string& key : fields.keys()) {
      if (key == "training") continue;  // the archive's own attribute
      c10::IValue value;
      fields.read(key, value);
      if (!value.isTensor()) {
        out.write(key, value);
        continue;
      }
      const torch::Tensor& t = value.toTensor();
      out.write(key, t.defined() ? convert(t) : t, /*is_buffer=*/true);
    }
  });
  auto copy = state.clone();
  copy->serialize(result);
  return copy;
}

// Adds `gradient` to `shard`'s, as backward accumulates into a parameter's:
// two synchronized passes before one step add up, as under ddp, until the
// optimizer's zero_grad.
void accumulate(torch::Tensor& shard, const torch::Tensor& gradient) {
  if (shard.grad().defined())
    shard.mutable_grad().add_(gradient);
  else
    shard.mutable_grad() = gradient.clone();
}

}  // namespace

ParameterShards::ParameterShards(ProcessGroup group, torch::nn::Module& module, bool gradients_reduced)
    : group_(std::move(group)), gradients_reduced_(gradients_reduced) {
  torch::NoGradGuard no_grad;
  const int64_t n = group_.size();
  for (const auto& p : module.parameters())
    if (p.requires_grad()) {
      Piece piece;
      piece.param = p;
      piece.numel = p.numel();
      piece.size = (piece.numel + n - 1) / n;
      pieces_.push_back(std::move(piece));
    }
  // The ranks must cut the same parameters the same way.
  torch::Tensor shape = torch::tensor({static_cast<double>(pieces_.size()), 0.0}, torch::kFloat64);
  for (const auto& piece : pieces_) shape[1] += static_cast<double>(piece.numel);
  torch::Tensor largest = shape.to(group_.device()), smallest = largest.clone();
  group_.all_reduce(largest, ReduceOp::max);
  group_.all_reduce(smallest, ReduceOp::min);
  if (!torch::equal(largest, smallest))
    throw DistributedError(fmt::format(
        "the ranks' modules differ: rank {} has {} trainable parameters of {} elements, and the ranks range from "
        "{} to {} parameters and {} to {} elements",
        group_.rank(), pieces_.size(), shape[1].item<int64_t>(), smallest[0].item<int64_t>(),
        largest[0].item<int64_t>(), smallest[1].item<int64_t>(), largest[1].item<int64_t>()));
  if (!gradients_reduced_) group_.broadcast_module(module);  // else the GradientSynchronizer did
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& piece = pieces_[i];
    piece.shard = own_piece(piece, piece.param).clone().set_requires_grad(true);
    const int64_t bytes = n * piece.size * static_cast<int64_t>(piece.param.element_size());
    const bool joins = !buckets_.empty() &&
                       pieces_[buckets_.back().pieces.front()].param.scalar_type() == piece.param.scalar_type() &&
                       (buckets_.back().row * n * static_cast<int64_t>(piece.param.element_size()) + bytes <=
                        kBucketBytes);
    if (!joins) buckets_.emplace_back();
    piece.offset = buckets_.back().row;
    buckets_.back().pieces.push_back(i);
    buckets_.back().row += piece.size;
  }
  version_ = shards_version();
}

torch::Tensor ParameterShards::padded_flat(const torch::Tensor& t, int64_t size) const {
  torch::Tensor flat = t.reshape({-1});
  if (flat.numel() == size) return flat;
  return torch::cat({flat, torch::zeros({size - flat.numel()}, flat.options())});
}

torch::Tensor ParameterShards::own_piece(const Piece& piece, const torch::Tensor& whole) const {
  return padded_flat(whole, piece.size * group_.size()).narrow(0, group_.rank() * piece.size, piece.size);
}

void ParameterShards::shard(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::LBFGS*>(&optimizer) != nullptr)
    throw ConfigError(
        "LBFGS cannot step sharded parameters: its line search needs whole ones; use strategy \"ddp\" without "
        "zero_redundancy_optimizer, or an elementwise optimizer (SGD, Adam, AdamW, RMSprop, Adagrad)");
  if (!optimizer.state().empty())
    throw ConfigError(
        "the optimizer has a state already (it has stepped, or loaded one): a sharded strategy shards optimizers "
        "that have none, as configure_optimizers makes them; under Fabric, set the optimizer up before "
        "fabric.load restores its state");
  swap_in(optimizer, /*shards=*/true);
}

void ParameterShards::swap_in(torch::optim::Optimizer& optimizer, bool shards) {
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < pieces_.size(); ++i)
    index[(shards ? pieces_[i].param : pieces_[i].shard).unsafeGetTensorImpl()] = i;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params())
      if (auto it = index.find(p.unsafeGetTensorImpl()); it != index.end())
        p = shards ? pieces_[it->second].shard : pieces_[it->second].param;
}

void ParameterShards::reduce_gradients() {
  torch::NoGradGuard no_grad;
  // had[i]: whether a rank has a gradient for piece i.
  std::vector<char> had(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) had[i] = pieces_[i].param.grad().defined();
  if (gradients_reduced_) {
    torch::Tensor any = torch::empty({static_cast<int64_t>(had.size())}, torch::kFloat32);
    for (size_t i = 0; i < had.size(); ++i) any[static_cast<int64_t>(i)] = had[i] ? 1.0F : 0.0F;
    any = any.to(group_.device());
    group_.all_reduce(any, ReduceOp::max);
    any = any.cpu();
    for (size_t i = 0; i < had.size(); ++i) had[i] = any[static_cast<int64_t>(i)].item<float>() > 0;
  }
  for (const Bucket& bucket : buckets_) reduce_bucket(bucket, had);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& piece = pieces_[i];
    piece.shard.detach().copy_(own_piece(piece, piece.param));
    piece.param.mutable_grad().reset();
  }
  version_ = shards_version();
}

void ParameterShards::reduce_bucket(const Bucket& bucket, std::vector<char>& had) {
  const int64_t n = group_.size();
  auto gradient_of = [&](const Piece& piece) {
    const torch::Tensor& g = piece.param.grad();
    return g.defined() ? g : torch::zeros_like(piece.param);
  };
  if (gradients_reduced_) {  // the means are there: each rank keeps its piece
    for (size_t i : bucket.pieces)
      if (had[i]) accumulate(pieces_[i].shard, own_piece(pieces_[i], gradient_of(pieces_[i])));
    return;
  }
  // Row r: rank r's pieces of every gradient, then whether this rank has
  // each gradient (the same on every row, so that each rank learns of all).
  std::vector<torch::Tensor> columns;
  const auto k = static_cast<int64_t>(bucket.pieces.size());
  torch::Tensor flags = torch::empty({k}, torch::kFloat64);
  for (int64_t j = 0; j < k; ++j) {
    const Piece& piece = pieces_[bucket.pieces[static_cast<size_t>(j)]];
    columns.push_back(padded_flat(gradient_of(piece), n * piece.size).view({n, piece.size}));
    flags[j] = had[bucket.pieces[static_cast<size_t>(j)]] ? 1.0 : 0.0;
  }
  const torch::Tensor& first = pieces_[bucket.pieces.front()].param;
  columns.push_back(flags.to(first.options()).expand({n, k}));
  const torch::Tensor mine = group_.reduce_scatter(torch::cat(columns, 1).reshape({-1}), ReduceOp::mean);
  const torch::Tensor any = mine.narrow(0, bucket.row, k).to(torch::kFloat64).cpu();
  for (int64_t j = 0; j < k; ++j) {
    const size_t i = bucket.pieces[static_cast<size_t>(j)];
    had[i] = any[j].item<double>() > 0;
    if (had[i]) accumulate(pieces_[i].shard, mine.narrow(0, pieces_[i].offset, pieces_[i].size));
  }
}

void ParameterShards::gather_parameters() {
  torch::NoGradGuard no_grad;
  for (const Bucket& bucket : buckets_) {
    std::vector<torch::Tensor> row;
    for (size_t i : bucket.pieces) row.push_back(pieces_[i].shard.detach());
    const torch::Tensor all = torch::stack(group_.all_gather(torch::cat(row)));  // [ranks, row]
    for (size_t i : bucket.pieces) {
      Piece& piece = pieces_[i];
      const torch::Tensor whole = all.narrow(1, piece.offset, piece.size).reshape({-1}).narrow(0, 0, piece.numel);
      piece.param.detach().copy_(whole.view(piece.param.sizes()));
    }
  }
  version_ = shards_version();
}

double ParameterShards::gradient_norm(const std::vector<torch::Tensor>& shards) {
  torch::NoGradGuard no_grad;
  torch::Tensor squares = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(group_.device()));
  for (const auto& s : shards)
    if (s.grad().defined()) squares += s.grad().to(torch::kFloat64).pow(2).sum().to(squares.device());
  group_.all_reduce(squares, ReduceOp::sum);
  return std::sqrt(squares.item<double>());
}

std::vector<torch::Tensor> ParameterShards::shards_in(const torch::optim::Optimizer& optimizer) const {
  std::unordered_set<const void*> mine;
  for (const Piece& piece : pieces_) mine.insert(piece.shard.unsafeGetTensorImpl());
  std::vector<torch::Tensor> found;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (mine.count(p.unsafeGetTensorImpl())) found.push_back(p);
  return found;
}

int64_t ParameterShards::shards_version() const {
  // Version counters only grow, so their sum moves when any of them does.
  int64_t sum = 0;
  for (const Piece& piece : pieces_) sum += static_cast<int64_t>(piece.shard._version());
  return sum;
}

bool ParameterShards::stepped_ungathered() const { return shards_version() != version_; }

bool ParameterShards::gradients_pending() const {
  return std::any_of(pieces_.begin(), pieces_.end(), [](const Piece& piece) { return piece.param.grad().defined(); });
}

void ParameterShards::with_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& body) {
  auto& states = optimizer.state();
  // Which pieces have a state must agree over the ranks: each is gathered.
  torch::Tensor has = torch::zeros({static_cast<int64_t>(pieces_.size()) + 1}, torch::kFloat64);
  for (size_t i = 0; i < pieces_.size(); ++i)
    has[static_cast<int64_t>(i)] = states.count(state_key(pieces_[i].shard, states)) ? 1.0 : 0.0;
  torch::Tensor most = has.to(group_.device()), least = most.clone();
  group_.all_reduce(most, ReduceOp::max);
  group_.all_reduce(least, ReduceOp::min);
  if (!torch::equal(most, least))
    throw DistributedError(fmt::format(
        "rank {}: the ranks' optimizers hold states for different parameters, so no whole state can be "
        "gathered for a checkpoint",
        group_.rank()));
  std::vector<std::unique_ptr<ParamState>> kept(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    auto it = states.find(state_key(piece.shard, states));
    if (it == states.end()) continue;
    // Rank 0 writes the checkpoint; the others hold no whole state.
    auto whole = converted(*it->second, [&](const torch::Tensor& t) {
      if (t.dim() != 1 || t.size(0) != piece.size) return t;
      const auto parts = group_.gather(t, 0);
      if (parts.empty()) return torch::empty({0}, t.options());
      return torch::cat(parts).narrow(0, 0, piece.numel).view(piece.param.sizes());
    });
    kept[i] = std::move(it->second);
    states.erase(it);
    states[state_key(piece.param, states)] = std::move(whole);
  }
  auto restore = [&] {
    for (size_t i = 0; i < pieces_.size(); ++i) {
      if (!kept[i]) continue;
      states.erase(state_key(pieces_[i].param, states));
      states[state_key(pieces_[i].shard, states)] = std::move(kept[i]);
    }
    swap_in(optimizer, /*shards=*/true);
  };
  swap_in(optimizer, /*shards=*/false);
  try {
    body();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void ParameterShards::load_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& load) {
  auto& states = optimizer.state();
  for (const Piece& piece : pieces_) states.erase(state_key(piece.shard, states));
  swap_in(optimizer, /*shards=*/false);
  try {
    load();
  } catch (...) {
    for (const Piece& piece : pieces_) states.erase(state_key(piece.param, states));
    swap_in(optimizer, /*shards=*/true);
    throw;
  }
  for (const Piece& piece : pieces_) {
    auto it = states.find(state_key(piece.param, states));
    if (it == states.end()) continue;
    auto mine = converted(*it->second, [&](const torch::Tensor& t) {
      return t.sizes() == piece.param.sizes() ? own_piece(piece, t).clone() : t;
    });
    states.erase(it);
    states[state_key(piece.shard, states)] = std::move(mine);
  }
  swap_in(optimizer, /*shards=*/true);
}

}  // namespace fulgor::detail

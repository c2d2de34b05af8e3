#include "distributed/parameter_shards.h"

#include <fmt/format.h>
#include <torch/optim/lbfgs.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "distributed/sharded_unit_access.h"
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

// Adds `gradient` to `shard`'s, from its element `from` on, as backward
// accumulates into a parameter's: two synchronized passes before one step
// add up, as under ddp, until the optimizer's zero_grad.
void accumulate(torch::Tensor& shard, const torch::Tensor& gradient, int64_t from = 0) {
  torch::Tensor& held = shard.mutable_grad();
  if (!held.defined() && gradient.numel() == shard.numel()) {
    held = gradient.to(shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    return;
  }
  if (!held.defined()) held = torch::zeros_like(shard);
  held.narrow(0, from, gradient.numel()).add_(gradient);
}

// Columns [from, from + parts.size(1)) of `flat` cut into rows of `size`
// (rank r's piece in row r), padded with zeros past its end, written into
// `parts` ([ranks, columns]) with no padded copy made.
void scatter_into(const torch::Tensor& parts, const torch::Tensor& flat, int64_t size, int64_t from) {
  const int64_t ranks = parts.size(0), columns = parts.size(1);
  const int64_t whole_rows = flat.numel() / size, rest = flat.numel() % size;
  if (whole_rows > 0)
    parts.narrow(0, 0, whole_rows)
        .copy_(flat.narrow(0, 0, whole_rows * size).view({whole_rows, size}).narrow(1, from, columns));
  if (whole_rows == ranks) return;
  const int64_t valid = std::clamp(rest - from, int64_t(0), columns);
  parts[whole_rows].narrow(0, 0, valid).copy_(flat.narrow(0, whole_rows * size + from, valid));
  parts[whole_rows].narrow(0, valid, columns - valid).zero_();
  parts.narrow(0, whole_rows + 1, ranks - whole_rows - 1).zero_();
}

// The inverse: those columns of `flat` from `parts`, the padding left out.
void gather_from(const torch::Tensor& flat, const torch::Tensor& parts, int64_t size, int64_t from) {
  const int64_t ranks = parts.size(0), columns = parts.size(1);
  const int64_t whole_rows = flat.numel() / size, rest = flat.numel() % size;
  if (whole_rows > 0)
    flat.narrow(0, 0, whole_rows * size)
        .view({whole_rows, size})
        .narrow(1, from, columns)
        .copy_(parts.narrow(0, 0, whole_rows));
  if (whole_rows == ranks) return;
  const int64_t valid = std::clamp(rest - from, int64_t(0), columns);
  flat.narrow(0, whole_rows * size + from, valid).copy_(parts[whole_rows].narrow(0, 0, valid));
}

// Note [Fully sharded units]: a released parameter keeps its tensor and
// storage objects, whose memory is freed; gathering gives the storage the
// memory of a new tensor, allocated as the device allocates any (a loaded
// checkpoint's parameters may have come with memory of no allocator's).
void release_storage(const torch::Tensor& param) {
  c10::StorageImpl* storage = param.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& param) {
  const torch::Tensor memory = torch::empty({param.numel()}, param.options());
  c10::StorageImpl* storage = param.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      memory.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, storage->device())));
  storage->set_nbytes(static_cast<size_t>(param.numel()) * param.element_size());
}

// `param` itself, under a version counter of its own: writing through it
// leaves the parameter's, which autograd checks its saved tensors against.
torch::Tensor unversioned(const torch::Tensor& param) {
  torch::Tensor alias = param.detach();
  alias.unsafeGetTensorImpl()->set_version_counter(c10::VariableVersion(0));
  return alias;
}

// Whether `param`'s storage holds it alone, so that releasing it frees
// nothing else.
bool owns_storage(const torch::Tensor& param) {
  return param.storage_offset() == 0 && param.is_contiguous() &&
         param.storage().nbytes() == static_cast<size_t>(param.numel()) * param.element_size();
}

}  // namespace

ParameterShards::ParameterShards(ProcessGroup group, torch::nn::Module& module, bool gradients_reduced,
                                 bool shard_units, std::optional<ProcessGroup> replicas,
                                 std::optional<torch::ScalarType> mixed)
    : group_(std::move(group)), replicas_(std::move(replicas)), mixed_(mixed), gradients_reduced_(gradients_reduced) {
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
  if (shard_units) find_units(module);
  // The ranks must cut the same parameters the same way.
  torch::Tensor shape =
      torch::tensor({static_cast<double>(pieces_.size()), 0.0, static_cast<double>(units_.size())}, torch::kFloat64);
  for (const auto& piece : pieces_) shape[1] += static_cast<double>(piece.numel);
  // Copies: on the CPU, to() would return `shape` itself, which the message reads.
  torch::Tensor largest = shape.to(group_.device(), /*non_blocking=*/false, /*copy=*/true), smallest = largest.clone();
  for (ProcessGroup* over : {&group_, replicas_ ? &*replicas_ : nullptr}) {  // the node's ranks, then the nodes'
    if (over == nullptr) continue;
    over->all_reduce(largest, ReduceOp::max);
    over->all_reduce(smallest, ReduceOp::min);
  }
  if (!torch::equal(largest, smallest))
    throw DistributedError(fmt::format(
        "the ranks' modules differ: rank {} has {} trainable parameters of {} elements in {} sharded units, and the "
        "ranks range from {} to {} parameters, {} to {} elements and {} to {} units",
        rank(), pieces_.size(), shape[1].item<int64_t>(), units_.size(), smallest[0].item<int64_t>(),
        largest[0].item<int64_t>(), smallest[1].item<int64_t>(), largest[1].item<int64_t>(),
        smallest[2].item<int64_t>(), largest[2].item<int64_t>()));
  if (!gradients_reduced_) {  // else the GradientSynchronizer did
    // From rank 0 to its node, then from each of its node's ranks to its
    // replicas: every rank has rank 0's.
    group_.broadcast_module(module);
    if (replicas_) replicas_->broadcast_module(module);
  }
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& piece = pieces_[i];
    piece.shard = own_piece(piece, piece.param).clone().set_requires_grad(true);
    if (mixed_ && piece.unit >= 0) {
      piece.full = piece.param.detach();
      piece.low = torch::empty(piece.param.sizes(), piece.param.options().dtype(*mixed_));
      release_storage(piece.low);
    }
    const int64_t bytes = n * piece.size * static_cast<int64_t>(piece.param.element_size());
    const bool joins =
        !buckets_.empty() && buckets_.back().unit == piece.unit &&
        pieces_[buckets_.back().pieces.front()].param.scalar_type() == piece.param.scalar_type() &&
        (buckets_.back().row * n * static_cast<int64_t>(piece.param.element_size()) + bytes <= kBucketBytes);
    if (!joins) {
      buckets_.emplace_back();
      buckets_.back().unit = piece.unit;
      if (piece.unit >= 0) units_[static_cast<size_t>(piece.unit)].buckets.push_back(buckets_.size() - 1);
    }
    piece.offset = buckets_.back().row;
    buckets_.back().pieces.push_back(i);
    buckets_.back().row += piece.size;
  }
  version_ = shards_version();
  for (size_t u = 0; u < units_.size(); ++u) {
    release_unit(u);
    ShardedUnitAccess::set_sharding(*units_[u].module.lock(), units_[u].handle);
  }
}

ParameterShards::~ParameterShards() { detach_units(); }

// The units in the module's order, parents before the units inside them; a
// parameter belongs to the innermost unit that holds it. Pieces are ordered
// by unit (a unit's buckets hold its parameters alone), the parameters
// outside every unit first.
void ParameterShards::find_units(torch::nn::Module& module) {
  std::unordered_map<const void*, int64_t> owner;
  for (const auto& child : module.modules(/*include_self=*/false))
    if (auto unit = std::dynamic_pointer_cast<ShardedUnit>(child)) {
      for (const auto& item : unit->named_parameters()) {
        if (!item.value().requires_grad()) continue;
        if (!owns_storage(item.value()))
          throw ConfigError(fmt::format(
              "the parameter '{}' of a fulgor::Sharded unit shares its storage with other tensors (it is a view, or "
              "a part of a larger storage), so FULL_SHARD cannot release it between the unit's passes: make it a "
              "tensor of its own (register_parameter(name, tensor.clone())), or use sharding_strategy SHARD_GRAD_OP",
              item.key()));
        owner[item.value().unsafeGetTensorImpl()] = static_cast<int64_t>(units_.size());
      }
      units_.emplace_back();
      units_.back().module = unit;
      units_.back().reshard_after_forward = unit->options().reshard_after_forward;
      units_.back().handle = std::make_shared<UnitSharding>(this, units_.size() - 1);
    }
  for (Piece& piece : pieces_)
    if (auto it = owner.find(piece.param.unsafeGetTensorImpl()); it != owner.end()) piece.unit = it->second;
  std::stable_sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.unit < b.unit; });
}

void ParameterShards::detach_units() {
  for (Unit& unit : units_) {
    unit.handle->shards_ = nullptr;
    if (auto module = unit.module.lock()) ShardedUnitAccess::set_sharding(*module, nullptr);
  }
  units_.clear();
}

std::pair<int64_t, int64_t> ParameterShards::bounds(const Piece& piece) const {
  const int64_t begin = std::min(piece.numel, group_.rank() * piece.size);
  return {begin, std::min(piece.numel, begin + piece.size)};
}

// Only this rank's elements are read: a padded copy of the whole parameter
// would cost its size at every step.
torch::Tensor ParameterShards::own_piece(const Piece& piece, const torch::Tensor& whole) const {
  const auto [begin, end] = bounds(piece);
  const torch::Tensor mine = whole.reshape({-1}).narrow(0, begin, end - begin);
  if (end - begin == piece.size) return mine;
  return torch::cat({mine, torch::zeros({piece.size - (end - begin)}, mine.options())});
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
  // had[i]: whether a rank has a gradient for piece i. Where the
  // GradientSynchronizer reduced them, every rank has one exactly when some
  // rank had (Note [Parameters some rank did not reach] in gradient_sync.cpp);
  // otherwise reduce_bucket learns it with the gradients.
  std::vector<char> had(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) had[i] = pieces_[i].param.grad().defined();
  for (const Bucket& bucket : buckets_)
    if (bucket.unit < 0 || !units_[static_cast<size_t>(bucket.unit)].reduced) reduce_bucket(bucket, had);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& piece = pieces_[i];
    if (piece.unit >= 0 && units_[static_cast<size_t>(piece.unit)].reduced && piece.param.grad().defined())
      throw Error(fmt::format(
          "rank {}: a parameter of fulgor::Sharded unit {} received a gradient after the unit's backward pass "
          "ended, which FULL_SHARD cannot reduce: it is used outside the unit's forward",
          rank(), piece.unit));
    if (piece.unit < 0) piece.shard.detach().copy_(own_piece(piece, piece.param));
    piece.param.mutable_grad().reset();
  }
  end_unsynchronized_pass();
  for (Unit& unit : units_) unit.reduced = false;
  version_ = shards_version();
}

void ParameterShards::end_unsynchronized_pass() {
  for (size_t u = 0; u < units_.size(); ++u) {
    release_unit(u);
    units_[u].forwards = units_[u].backwards = 0;
  }
}

void ParameterShards::reduce_unit(size_t unit) {
  torch::NoGradGuard no_grad;
  std::vector<char> had(pieces_.size());
  for (size_t b : units_[unit].buckets) {
    for (size_t i : buckets_[b].pieces) had[i] = pieces_[i].param.grad().defined();
    reduce_bucket(buckets_[b], had);
    for (size_t i : buckets_[b].pieces) pieces_[i].param.mutable_grad().reset();
  }
  units_[unit].reduced = true;
}

// Runs `body(i, at, from, columns)` for each of `bucket`'s pieces_[i] that
// lies in the columns [begin, end) of its rows, whose pieces start at column
// `first`: `columns` of the piece, from its column `from`, lie at `at`.
template <typename Body>
void ParameterShards::for_pieces_in(const Bucket& bucket, int64_t first, int64_t begin, int64_t end, Body body) {
  for (size_t i : bucket.pieces) {
    const Piece& piece = pieces_[i];
    const int64_t lo = std::max(begin, first + piece.offset), hi = std::min(end, first + piece.offset + piece.size);
    if (lo < hi) body(i, lo - begin, lo - first - piece.offset, hi - lo);
  }
}

// Calls `body(begin, end)` for consecutive column ranges of a bucket's rows,
// each a message of at most kBucketBytes over the ranks (a parameter larger
// than a bucket is a bucket alone: its message is cut), and the first
// holding at least `first` columns.
template <typename Body>
void ParameterShards::in_messages(int64_t width, int64_t first, torch::ScalarType dtype, Body body) {
  const int64_t most = kBucketBytes / (group_.size() * static_cast<int64_t>(c10::elementSize(dtype)));
  const int64_t columns = std::max({most, first, int64_t(1)});
  for (int64_t begin = 0; begin < width; begin += columns) body(begin, std::min(width, begin + columns));
}

void ParameterShards::reduce_bucket(const Bucket& bucket, std::vector<char>& had) {
  if (gradients_reduced_) {  // the means are there: each rank keeps its piece
    for (size_t i : bucket.pieces)
      if (had[i]) accumulate(pieces_[i].shard, own_piece(pieces_[i], pieces_[i].param.grad()));
    return;
  }
  // Row r: whether this rank has each gradient (the same on every row, so
  // that each rank learns of all), then rank r's pieces of every gradient,
  // in the pieces' dtype or the reduce dtype (Note [Sharded mixed
  // precision]). Each message reduces some of those columns into `mine`.
  const int64_t n = group_.size(), k = static_cast<int64_t>(bucket.pieces.size());
  const torch::Tensor& first = pieces_[bucket.pieces.front()].shard;
  const auto options = first.options().dtype(mixed_.value_or(first.scalar_type()));
  torch::Tensor flags = torch::empty({k}, torch::kFloat64);
  for (int64_t j = 0; j < k; ++j) flags[j] = had[bucket.pieces[static_cast<size_t>(j)]] ? 1.0 : 0.0;
  in_messages(k + bucket.row, k, options.dtype().toScalarType(), [&](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    const torch::Tensor memory = working_.get((n + 1) * width, options);
    torch::Tensor all = memory.narrow(0, 0, n * width), mine = memory.narrow(0, n * width, width);
    const torch::Tensor rows = all.view({n, width});
    if (begin == 0) rows.narrow(1, 0, k).copy_(flags);
    for_pieces_in(bucket, k, begin, end, [&](size_t i, int64_t at, int64_t from, int64_t columns) {
      const torch::Tensor& gradient = pieces_[i].param.grad();
      if (gradient.defined())
        scatter_into(rows.narrow(1, at, columns), gradient.reshape({-1}), pieces_[i].size, from);
      else
        rows.narrow(1, at, columns).zero_();
    });
    group_.reduce_scatter_tensor(mine, all, ReduceOp::mean);
    if (replicas_) replicas_->all_reduce(mine, ReduceOp::mean);
    if (begin == 0) {
      const torch::Tensor any = mine.narrow(0, 0, k).to(torch::kFloat64).cpu();
      for (int64_t j = 0; j < k; ++j) had[bucket.pieces[static_cast<size_t>(j)]] = any[j].item<double>() > 0;
    }
    for_pieces_in(bucket, k, begin, end, [&](size_t i, int64_t at, int64_t from, int64_t columns) {
      if (had[i]) accumulate(pieces_[i].shard, mine.narrow(0, at, columns), from);
    });
  });
}

// FSDP2's all-gather: copy-in (this rank's pieces side by side, in the
// mixed-precision dtype where `low`), the collective, copy-out (each
// parameter from its pieces of every rank). With `to_rank_zero` a gather to
// rank 0 alone, the others copying nothing out.
void ParameterShards::gather_bucket(const Bucket& bucket, bool to_rank_zero, bool low) {
  if (to_rank_zero && !first_replica()) return;
  const int64_t n = group_.size();
  const torch::Tensor& first = pieces_[bucket.pieces.front()].shard;
  const auto options = first.options().dtype(low ? *mixed_ : first.scalar_type());
  in_messages(bucket.row, 0, options.dtype().toScalarType(), [&](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    const torch::Tensor memory = working_.get((n + 1) * width, options);
    torch::Tensor all = memory.narrow(0, 0, n * width), mine = memory.narrow(0, n * width, width);
    for_pieces_in(bucket, 0, begin, end, [&](size_t i, int64_t at, int64_t from, int64_t columns) {
      mine.narrow(0, at, columns).copy_(pieces_[i].shard.detach().narrow(0, from, columns));
    });
    if (!to_rank_zero) {
      group_.all_gather_into_tensor(all, mine);
    } else {
      const std::vector<torch::Tensor> parts = group_.gather(mine, 0);
      if (parts.empty()) return;
      torch::cat_out(all, parts);
    }
    const torch::Tensor rows = all.view({n, width});
    for_pieces_in(bucket, 0, begin, end, [&](size_t i, int64_t at, int64_t from, int64_t columns) {
      gather_from(unversioned(pieces_[i].param).view({-1}), rows.narrow(1, at, columns), pieces_[i].size, from);
    });
  });
}

void ParameterShards::gather_parameters() {
  torch::NoGradGuard no_grad;
  for (const Bucket& bucket : buckets_)
    if (bucket.unit < 0) gather_bucket(bucket, /*to_rank_zero=*/false, /*low=*/false);
  version_ = shards_version();
}

void ParameterShards::gather_unit(size_t unit, For purpose) {
  Unit& u = units_[unit];
  const bool low = purpose == For::passes && mixed_;
  if (u.gathered && u.low == low) return;
  release_unit(unit);  // gathered for its passes, wanted whole
  torch::NoGradGuard no_grad;
  const bool receives = purpose != For::rank_zero || (group_.rank() == 0 && first_replica());
  for (size_t b : u.buckets) {
    if (receives)
      for (size_t i : buckets_[b].pieces) {
        Piece& piece = pieces_[i];
        if (!low) {
          allocate_storage(piece.param);
          continue;
        }
        allocate_storage(piece.low);
        piece.param.set_data(piece.low);
      }
    gather_bucket(buckets_[b], purpose == For::rank_zero, low);
  }
  u.gathered = receives;
  u.low = low && receives;
}

void ParameterShards::release_unit(size_t unit) {
  Unit& u = units_[unit];
  if (!u.gathered) return;
  for (size_t b : u.buckets)
    for (size_t i : buckets_[b].pieces) {
      Piece& piece = pieces_[i];
      if (!u.low) {
        release_storage(piece.param);
        continue;
      }
      release_storage(piece.low);
      piece.param.set_data(piece.full);
      // A pass that did not synchronize keeps its gradient in full precision.
      if (piece.param.grad().defined() && piece.param.grad().scalar_type() != piece.full.scalar_type())
        piece.param.mutable_grad() = piece.param.grad().to(piece.full.scalar_type());
    }
  u.gathered = u.low = false;
}

void ParameterShards::with_whole_parameters(const std::function<void()>& body, Whole whole) {
  std::vector<size_t> gathered;
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].gathered || units_[u].low) {
      gather_unit(u, whole == Whole::on_rank_zero ? For::rank_zero : For::every_rank);
      gathered.push_back(u);
    }
  auto release = [&] {
    for (size_t u : gathered) release_unit(u);
  };
  try {
    body();
  } catch (...) {
    release();
    throw;
  }
  if (whole == Whole::on_every_rank) {
    torch::NoGradGuard no_grad;
    for (Piece& piece : pieces_)
      if (piece.unit >= 0) piece.shard.detach().copy_(own_piece(piece, piece.param));
    version_ = shards_version();
  }
  release();
}

void ParameterShards::unshard_units() {
  for (size_t u = 0; u < units_.size(); ++u) gather_unit(u, For::every_rank);
  detach_units();
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

std::optional<ParameterShards::Place> ParameterShards::place_of(const torch::Tensor& tensor) const {
  const void* impl = tensor.unsafeGetTensorImpl();
  for (const Piece& piece : pieces_) {
    if (piece.param.unsafeGetTensorImpl() != impl && piece.shard.unsafeGetTensorImpl() != impl) continue;
    Place place{piece.param, piece.shard};
    std::tie(place.begin, place.end) = bounds(piece);
    place.released = piece.unit >= 0 && !units_[static_cast<size_t>(piece.unit)].gathered;
    return place;
  }
  return std::nullopt;
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
    throw DistributedError(
        fmt::format("rank {}: the ranks' optimizers hold states for different parameters, so no whole state can be "
                    "gathered for a checkpoint",
                    rank()));
  std::vector<std::unique_ptr<ParamState>> kept(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    auto it = states.find(state_key(piece.shard, states));
    if (it == states.end()) continue;
    // Rank 0 writes the checkpoint; the others hold no whole state.
    auto whole = converted(*it->second, [&](const torch::Tensor& t) {
      if (t.dim() != 1 || t.size(0) != piece.size) return t;
      const auto parts = first_replica() ? group_.gather(t, 0) : std::vector<torch::Tensor>{};
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

ParameterShards& UnitSharding::shards() const {
  if (shards_ == nullptr)
    throw Error(
        "a fulgor::Sharded unit ran a pass after the strategy that shards it ended (a backward pass of a graph "
        "made during the fit, or a forward pass of a module that a Fabric no longer sets up)");
  return *shards_;
}

void UnitSharding::forward_begins() {
  ParameterShards& shards = this->shards();
  shards.gather_unit(unit_, ParameterShards::For::passes);
  if (torch::GradMode::is_enabled()) ++shards.units_[unit_].forwards;
}

void UnitSharding::forward_ends(bool routed) {
  ParameterShards& shards = this->shards();
  if (!torch::GradMode::is_enabled() || (routed && shards.units_[unit_].reshard_after_forward))
    shards.release_unit(unit_);
}

void UnitSharding::backward_begins() { shards().gather_unit(unit_, ParameterShards::For::passes); }

void UnitSharding::backward_ends() {
  ParameterShards& shards = this->shards();
  auto& unit = shards.units_[unit_];
  ++unit.backwards;
  if (shards.synchronizing_ && unit.backwards == unit.forwards) shards.reduce_unit(unit_);
  shards.release_unit(unit_);
}

}  // namespace fulgor::detail

#include "fulgor/distributed/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <algorithm>
#include <cctype>

#include "distributed/process_group_state.h"
#include "distributed/rank_whereabouts.h"
#include "fulgor/detail/compat.h"
#include "fulgor/distributed/backend.h"

namespace fulgor {
namespace {

// broadcast_coalesced's message size: large enough that a model takes a few
// messages, small enough not to double peak memory for big ones.
constexpr size_t kBroadcastBucketBytes = size_t(256) << 20;

bool mentions(const std::string& text, std::initializer_list<const char*> words) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::any_of(words.begin(), words.end(), [&](const char* w) { return lower.find(w) != std::string::npos; });
}

// How long a rank whose collective failed waits for the others' posts (Note
// [Naming the ranks that did not arrive]), at most the timeout itself.
constexpr std::chrono::milliseconds kWhereaboutsSlack = std::chrono::seconds(5);

std::string describe(const detail::RankWhereabouts& w, bool timed_out, const std::string& limit) {
  std::vector<std::string> parts;
  const auto verb = [](const std::vector<int64_t>& ranks, const char* one, const char* many) {
    return ranks.size() == 1 ? one : many;
  };
  if (!w.absent.empty())
    parts.push_back(timed_out ? fmt::format("{} did not arrive within {}", detail::name_ranks(w.absent), limit)
                              : fmt::format("{} {} gone: {} connection closed", detail::name_ranks(w.absent),
                                            verb(w.absent, "is", "are"), verb(w.absent, "its", "their")));
  else
    parts.push_back(timed_out ? fmt::format("every rank reached a collective and none completed within {}", limit)
                              : "every rank reached a collective and a connection closed");
  for (const auto& [rank, where] : w.elsewhere)
    parts.push_back(fmt::format("rank {} failed in {} instead", rank, where));
  if (!w.waiting.empty())
    parts.push_back(fmt::format("{} waited here too", detail::name_ranks(w.waiting)));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// Note [Gloo without bfloat16]
// LibTorch 1.13's gloo refuses bfloat16 tensors. There a bfloat16 tensor is
// moved as float16's bits (the same size: a gather or a broadcast is exact)
// and reduced in float32, rounded back once.
bool moves_as_half(const ProcessGroup::State& s, const torch::Tensor& t) {
  return !detail::compat::kGlooHasBFloat16 && s.backend == "gloo" && t.scalar_type() == torch::kBFloat16;
}

std::vector<torch::Tensor> as_bfloat16(std::vector<torch::Tensor> tensors) {
  for (auto& t : tensors) t = t.view(torch::kBFloat16);
  return tensors;
}

// Throws ConfigError unless `output` is contiguous, of input's dtype, with
// `numel` elements (`why` that many).
void require_output(const char* collective, const torch::Tensor& output, const torch::Tensor& input, int64_t numel,
                    const std::string& why) {
  if (output.is_contiguous() && output.scalar_type() == input.scalar_type() && output.numel() == numel) return;
  throw ConfigError(fmt::format(
      "{} into a {} tensor of {} elements{} is not accepted: it needs a contiguous {} tensor of {} elements ({})",
      collective, c10::toString(output.scalar_type()), output.numel(), output.is_contiguous() ? "" : ", not contiguous",
      c10::toString(input.scalar_type()), numel, why));
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::sum:
    case ReduceOp::mean:
      break;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

std::string detail::message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

DistributedError ProcessGroup::State::failure(const std::string& collective, const std::string& reason) const {
  const bool timed_out = mentions(reason, {"timed out", "timeout", "time out"});
  const bool closed = !timed_out && mentions(reason, {"connection closed", "connection reset", "broken pipe",
                                                      "closed by peer", "eof", "connection refused"});
  std::string what = "the collective failed";
  if ((timed_out || closed) && size > 1) {
    const std::string limit = fmt::format("the timeout of {} ms, which {} sets", timeout.count(), timeout_option);
    const auto whereabouts =
        detail::find_whereabouts(store, rank, size, collectives, collective, std::min(timeout, kWhereaboutsSlack));
    if (!whereabouts.known) {
      const std::string peers = size == 2 ? fmt::format("the other rank ({})", 1 - rank)
                                          : fmt::format("one of the other {} ranks", size - 1);
      what = timed_out ? fmt::format("{} did not answer within {}", peers, limit)
                       : fmt::format("{} is gone: its connection closed", peers);
      what += fmt::format(" (which rank is not known: {})", whereabouts.unknown_because);
    } else {
      what = describe(whereabouts, timed_out, limit);
    }
  }
  return DistributedError(fmt::format("{} failed on rank {} of {} (backend {}): {}. c10d reported: {}", collective,
                                      rank, size, backend, what, reason));
}

void ProcessGroup::State::run(const std::string& collective, const std::function<void()>& body) const {
  ++collectives;
  try {
    body();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw failure(collective, detail::message_of(e));
  }
}

void ProcessGroup::State::wait(const c10::intrusive_ptr<c10d::Work>& work) const { work->wait(timeout); }

ProcessGroup::ProcessGroup(const DistributedEnvironment& environment, const Accelerator& accelerator,
                           torch::Device device, ProcessGroupOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.rank = environment.rank;
  s.size = environment.world_size;
  s.backend = options.backend.empty() ? accelerator.distributed_backend() : options.backend;
  s.timeout = options.timeout;
  s.device = device;
  s.master_addr = environment.master_addr;
  if (s.timeout.count() <= 0)
    throw ConfigError(
        fmt::format("process group timeout {} ms is not accepted: it must be positive", s.timeout.count()));
  if (s.size < 1 || s.rank < 0 || s.rank >= s.size)
    throw ConfigError(
        fmt::format("rank {} of world size {} is not accepted: expected 0 <= rank < world size", s.rank, s.size));
  require_distributed_backend(s.backend);

  try {
    s.store = detail::compat::make_tcp_store(environment.master_addr, environment.master_port, s.rank == 0,
                                             static_cast<int>(s.size), s.timeout);
  } catch (const std::exception& e) {
    throw DistributedError(
        fmt::format("rank {} of {} could not meet the others at the rendezvous store {}:{} ({}) "
                    "within {} ms: {}",
                    s.rank, s.size, environment.master_addr, environment.master_port,
                    s.rank == 0 ? "hosting it" : "hosted by rank 0", s.timeout.count(), detail::message_of(e)));
  }
  s.connect();
}

void ProcessGroup::State::connect() {
  DistributedBackendContext context;
  context.store = store;
  context.rank = static_cast<int>(rank);
  context.world_size = static_cast<int>(size);
  context.device = device;
  context.master_addr = master_addr;
  context.timeout = timeout;
  group = detail::compat::make_process_group(store, context.rank, context.world_size, backend,
                                             make_distributed_backend(backend, context), device.type());
}

ProcessGroup::ProcessGroup(std::shared_ptr<State> state) : state_(std::move(state)) {}

// As PyTorch's new_group: the members meet under a prefix of the job's store
// that numbers the groups in the order every rank makes them.
std::optional<ProcessGroup> ProcessGroup::new_group(const std::vector<int64_t>& ranks) {
  const bool valid = !ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()) &&
                     std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() && ranks.front() >= 0 &&
                     ranks.back() < state_->size;
  if (!valid)
    throw ConfigError(fmt::format("new_group([{}]) is not accepted: expected distinct ranks from 0 to {}, ascending",
                                  fmt::join(ranks, ", "), state_->size - 1));
  const int64_t id = ++state_->groups_made;
  const auto member = std::find(ranks.begin(), ranks.end(), state_->rank);
  if (member == ranks.end()) return std::nullopt;
  auto sub = std::make_shared<State>(*state_);
  sub->store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("fulgor_group_{}/", id), state_->store);
  sub->rank = member - ranks.begin();
  sub->size = static_cast<int64_t>(ranks.size());
  sub->groups_made = 0;
  sub->working_memory = {};
  sub->run(fmt::format("new_group([{}])", fmt::join(ranks, ", ")), [&] { sub->connect(); });
  return ProcessGroup(std::move(sub));
}

int64_t ProcessGroup::rank() const { return state_->rank; }
int64_t ProcessGroup::size() const { return state_->size; }
const std::string& ProcessGroup::backend() const { return state_->backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return state_->timeout; }
torch::Device ProcessGroup::device() const { return state_->device; }

void ProcessGroup::broadcast(torch::Tensor& tensor, int64_t root) {
  std::vector<torch::Tensor> tensors{tensor};
  broadcast(tensors, root);
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int64_t root) {
  if (root < 0 || root >= state_->size)
    throw ConfigError(
        fmt::format("broadcast root {} is not accepted: expected a rank from 0 to {}", root, state_->size - 1));
  if (tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> moved = tensors;  // views of the same memory
  for (auto& t : moved)
    if (moves_as_half(*state_, t)) t = t.view(torch::kHalf);
  // broadcast_coalesced flattens the tensors into few messages and copies the
  // result back into them, whatever their layout.
  state_->run("broadcast",
              [&] { c10d::broadcast_coalesced(state_->group, moved, kBroadcastBucketBytes, static_cast<int>(root)); });
}

void ProcessGroup::broadcast_module(torch::nn::Module& module, int64_t root) {
  std::vector<torch::Tensor> tensors;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true))
    if (p.defined()) tensors.push_back(p);
  for (const torch::Tensor& b : module.buffers(/*recurse=*/true))
    if (b.defined()) tensors.push_back(b);
  broadcast(tensors, root);
}

std::string ProcessGroup::broadcast_text(const std::string& text, int64_t root) {
  const auto on_device = torch::TensorOptions().device(state_->device);
  // The length first, so that every rank makes room for the bytes; an empty
  // text then needs no second message.
  torch::Tensor length = torch::full({1}, static_cast<int64_t>(text.size()), on_device.dtype(torch::kInt64));
  broadcast(length, root);
  const int64_t size = length.item<int64_t>();
  if (size == 0) return "";
  torch::Tensor bytes = torch::zeros({size}, torch::kUInt8);
  if (state_->rank == root) std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  torch::Tensor sent = bytes.to(state_->device);
  broadcast(sent, root);
  bytes = sent.cpu();
  const auto* data = bytes.data_ptr<uint8_t>();
  return std::string(data, data + size);
}

void ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  if (op == ReduceOp::mean && !tensor.is_floating_point())
    throw ConfigError(fmt::format("all_reduce mean of a {} tensor is not accepted: it needs a floating-point tensor",
                                  c10::toString(tensor.scalar_type())));
  torch::NoGradGuard no_grad;
  if (moves_as_half(*state_, tensor)) {
    torch::Tensor wide = tensor.to(torch::kFloat);
    all_reduce(wide, op);
    tensor.copy_(wide);
    return;
  }
  // c10d backends reduce contiguous buffers in place.
  std::vector<torch::Tensor> buffer{tensor.is_contiguous() ? tensor : tensor.contiguous()};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  options.timeout = state_->timeout;
  state_->run("all_reduce", [&] { state_->wait(state_->group->allreduce(buffer, options)); });
  if (op == ReduceOp::mean) buffer[0].div_(state_->size);
  if (!buffer[0].is_same(tensor)) tensor.copy_(buffer[0]);
}

double ProcessGroup::all_reduce(double value, ReduceOp op) {
  torch::Tensor tensor = torch::full({1}, value, torch::TensorOptions().dtype(torch::kFloat64).device(state_->device));
  all_reduce(tensor, op);
  return tensor.item<double>();
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& tensor) {
  if (moves_as_half(*state_, tensor)) return as_bfloat16(all_gather(tensor.view(torch::kHalf)));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < state_->size; ++r) output[0].push_back(torch::empty_like(input[0]));
  c10d::AllgatherOptions options;
  options.timeout = state_->timeout;
  state_->run("all_gather", [&] { state_->wait(state_->group->allgather(output, input, options)); });
  return output[0];
}

std::vector<torch::Tensor> ProcessGroup::gather(const torch::Tensor& tensor, int64_t root) {
  if (root < 0 || root >= state_->size)
    throw ConfigError(
        fmt::format("gather root {} is not accepted: expected a rank from 0 to {}", root, state_->size - 1));
  if (moves_as_half(*state_, tensor)) return as_bfloat16(gather(tensor.view(torch::kHalf), root));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<torch::Tensor>> output;
  if (state_->rank == root) {
    output.emplace_back();
    for (int64_t r = 0; r < state_->size; ++r) output[0].push_back(torch::empty_like(input[0]));
  }
  c10d::GatherOptions options;
  options.rootRank = root;
  options.timeout = state_->timeout;
  state_->run("gather", [&] { state_->wait(state_->group->gather(output, input, options)); });
  return output.empty() ? std::vector<torch::Tensor>{} : output[0];
}

// Note [Collectives Gloo lacks]
// LibTorch 1.13's Gloo has neither a reduce-scatter nor an all-gather into
// one tensor; 2.6's has both, its reduce-scatter at an all_reduce's cost
// (30 ms against 11 for what follows, 25 MB on 2 ranks here). On both, they
// are made of Gloo's all_to_all, which moves each part once, to the rank it
// is for, as NCCL's ring does: for a reduce-scatter every rank sends part r
// of its input to rank r, which combines the ranks' parts in rank order; for
// an all-gather every rank sends its whole input to each. The parts go
// through the group's working memory, kept for the next call.
void ProcessGroup::all_gather_into_tensor(torch::Tensor& output, const torch::Tensor& input) {
  const int64_t n = state_->size;
  require_output("all_gather_into_tensor", output, input, n * input.numel(),
                 fmt::format("{} ranks times the input's", n));
  torch::NoGradGuard no_grad;
  const bool as_half = moves_as_half(*state_, input);
  torch::Tensor out = as_half ? output.view(torch::kHalf) : output;
  torch::Tensor in = (as_half ? input.view(torch::kHalf) : input).contiguous().view({1, -1});
  c10d::AllToAllOptions to_all;
  to_all.timeout = state_->timeout;
  c10d::AllgatherOptions options;
  options.timeout = state_->timeout;
  state_->run("all_gather_into_tensor", [&] {
    if (state_->backend != "gloo") return state_->wait(state_->group->_allgather_base(out, in, options));
    torch::Tensor copies = state_->working_memory.get(n * in.numel(), in.options());
    copies.view({n, -1}).copy_(in.expand({n, in.numel()}));
    std::vector<int64_t> equal_parts;
    state_->wait(state_->group->alltoall_base(out, copies, equal_parts, equal_parts, to_all));
  });
}

void ProcessGroup::reduce_scatter_tensor(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  const int64_t n = state_->size;
  if (input.numel() % n != 0)
    throw ConfigError(fmt::format(
        "reduce_scatter_tensor of {} elements is not accepted: they must divide by the {} ranks", input.numel(), n));
  require_output("reduce_scatter_tensor", output, input, input.numel() / n,
                 fmt::format("the input's {} divided by the {} ranks", input.numel(), n));
  if (op == ReduceOp::mean && !input.is_floating_point())
    throw ConfigError(fmt::format("reduce_scatter mean of a {} tensor is not accepted: it needs a floating-point tensor",
                                  c10::toString(input.scalar_type())));
  torch::NoGradGuard no_grad;
  torch::Tensor in = input.contiguous();
  if (state_->backend != "gloo") {
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = state_->timeout;
    state_->run("reduce_scatter", [&] { state_->wait(state_->group->_reduce_scatter_base(output, in, options)); });
    if (op == ReduceOp::mean) output.div_(n);
    return;
  }
  const bool as_half = moves_as_half(*state_, in);
  const torch::Tensor parts = state_->working_memory.get(in.numel(), in.options());
  state_->run("reduce_scatter", [&] {
    torch::Tensor to = as_half ? parts.view(torch::kHalf) : parts;
    torch::Tensor from = as_half ? in.view(torch::kHalf) : in;
    c10d::AllToAllOptions options;
    options.timeout = state_->timeout;
    std::vector<int64_t> equal_parts;
    state_->wait(state_->group->alltoall_base(to, from, equal_parts, equal_parts, options));
  });
  // Half and bfloat16 are combined in float32 and rounded once (Note [Gloo
  // without bfloat16]); the rest straight into `output`.
  const torch::Tensor rows = parts.view({n, -1});
  torch::Tensor flat = output.view({-1});
  if (op == ReduceOp::max || op == ReduceOp::min) {
    op == ReduceOp::max ? torch::amax_out(flat, rows, {0}) : torch::amin_out(flat, rows, {0});
  } else if (in.scalar_type() == torch::kHalf || in.scalar_type() == torch::kBFloat16) {
    torch::Tensor sums = rows.sum(0, false, torch::kFloat);
    flat.copy_(op == ReduceOp::mean ? sums.div_(n) : sums);
  } else {
    torch::sum_out(flat, rows, {0});
    if (op == ReduceOp::mean) flat.div_(n);
  }
}

void ProcessGroup::barrier() {
  // An all_reduce of one number: every backend has it, on every device, and it
  // honours the timeout like the other collectives.
  torch::Tensor token = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(state_->device));
  std::vector<torch::Tensor> buffer{token};
  c10d::AllreduceOptions options;
  options.timeout = state_->timeout;
  state_->run("barrier", [&] { state_->wait(state_->group->allreduce(buffer, options)); });
}

}  // namespace fulgor

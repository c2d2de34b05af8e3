#include "fulgor/distributed/backend.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "distributed/process_group_state.h"
#include "fulgor/core/error.h"

namespace fulgor {
namespace {

struct BackendTable {
  std::mutex mutex;
  std::map<std::string, DistributedBackendFactory> factories;
};

BackendTable& table() {
  // Never destroyed: plugins may register from their static initialisers
  // before or after libfulgor's own, and unregister never.
  static auto* instance = new BackendTable();
  return *instance;
}

// The local address this host reaches `host` from, so that gloo listens where
// the peers can connect: 127.0.0.1 for a loopback master, and otherwise the
// address of the interface the route to the master leaves by. Connecting a UDP
// socket sends nothing; it only asks the kernel for the route.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr)
    throw DistributedError(fmt::format("cannot resolve MASTER_ADDR '{}' to an IPv4 address", host));
  std::string result;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr)
      result = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (result.empty()) throw DistributedError(fmt::format("no network route from this host to MASTER_ADDR '{}'", host));
  return result;
}

c10::intrusive_ptr<detail::compat::CollectiveBackend> make_gloo(const DistributedBackendContext& context) {
  // GLOO_SOCKET_IFNAME is the variable Python's gloo setup honours too.
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (interface != nullptr && *interface != '\0')
    return detail::compat::make_gloo_backend(context.store, context.rank, context.world_size, {}, interface,
                                             context.timeout);
  return detail::compat::make_gloo_backend(context.store, context.rank, context.world_size,
                                           local_address_towards(context.master_addr), {}, context.timeout);
}

c10::intrusive_ptr<detail::compat::CollectiveBackend> make_nccl(const DistributedBackendContext& context) {
  return detail::compat::make_nccl_backend(context.store, context.rank, context.world_size, context.timeout);
}

// The built-in backends, registered when libfulgor loads.
const bool builtins_registered = [] {
  if (detail::compat::has_gloo()) register_distributed_backend("gloo", make_gloo);
  if (detail::compat::has_nccl()) register_distributed_backend("nccl", make_nccl);
  return true;
}();

}  // namespace

void register_distributed_backend(const std::string& name, DistributedBackendFactory factory) {
  if (name.empty() || !factory)
    throw ConfigError(
        fmt::format("cannot register distributed backend '{}': it needs a non-empty name and a factory", name));
  BackendTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.factories[name] = std::move(factory);
}

bool has_distributed_backend(const std::string& name) {
  BackendTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.factories.count(name) != 0;
}

std::vector<std::string> distributed_backend_names() {
  BackendTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::string> names;
  for (const auto& entry : t.factories) names.push_back(entry.first);
  return names;
}

void require_distributed_backend(const std::string& name) {
  if (has_distributed_backend(name)) return;
  const std::vector<std::string> known = distributed_backend_names();
  throw ConfigError(
      fmt::format("unknown distributed backend '{}'; registered: {} (an accelerator plugin declares its "
                  "own with REGISTER_DISTRIBUTED_BACKEND)",
                  name, known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "))));
}

c10::intrusive_ptr<detail::compat::CollectiveBackend> make_distributed_backend(
    const std::string& name, const DistributedBackendContext& context) {
  DistributedBackendFactory factory;
  {
    BackendTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.factories.find(name);
    if (it != t.factories.end()) factory = it->second;
  }
  if (!factory) require_distributed_backend(name);
  try {
    return factory(context);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format("distributed backend '{}' could not be created on rank {} of {}: {}", name,
                                       context.rank, context.world_size, detail::message_of(e)));
  }
}

}  // namespace fulgor

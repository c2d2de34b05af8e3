#pragma once

// What both launchers (fulgor-run and the Trainer's own, Note [The Trainer's
// own launcher]) say of the processes they start. Header-only: fulgor-run
// links neither libfulgor nor LibTorch.

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace fulgor::detail {

// "exited with status 3", "was killed by signal 9 (Killed)".
inline std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

// The exit status a launcher takes from a process: its own, or 128 + the
// signal that killed it, as a shell reports it.
inline int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// A TCP port nothing listens on now (the kernel's choice for port 0), or -1
// with errno set. Rank 0 binds it moments later; another program could take it
// in between, which rank 0 then reports.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    errno = error;
    return -1;
  }
  close(fd);
  return ntohs(address.sin_port);
}

}  // namespace fulgor::detail

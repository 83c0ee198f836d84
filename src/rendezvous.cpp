// rendezvous.cpp: the star of TCP connections between rank 0 and the other ranks (POSIX sockets).
#include "rendezvous.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dualcast/error.hpp"

namespace dualcast::dist::detail {

namespace {

constexpr std::uint32_t kMagic = 0x64636173;  // "dcas": a stray connection is refused, not trusted
// Longest description check_same accepts: a larger length means the byte streams are out of step.
constexpr std::uint64_t kMaxDescription = std::uint64_t{1} << 20;

struct Hello {
  std::uint32_t magic;
  std::int32_t rank;
  std::int32_t world_size;
};

std::string errno_text() { return std::strerror(errno); }

void set_timeouts(int fd) {
  const double t = timeout_seconds();
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t);
  tv.tv_usec = static_cast<suseconds_t>((t - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

sockaddr_in resolve(const Env& env) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  DUALCAST_CHECK(rc == 0 && found != nullptr, "dist: rank ", env.rank, ": MASTER_ADDR '",
                 env.master_addr, "' does not resolve to an IPv4 address (", gai_strerror(rc), ")");
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  addr.sin_port = htons(static_cast<std::uint16_t>(env.master_port));
  return addr;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

double timeout_seconds() {
  static const double t = [] {
    const char* s = std::getenv("DUALCAST_DIST_TIMEOUT");
    if (s == nullptr || *s == '\0') return 300.0;
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    DUALCAST_CHECK(end != s && *end == '\0' && v > 0 && v <= 86400, "dist: DUALCAST_DIST_TIMEOUT='",
                   s, "' is not a number of seconds in (0, 86400]");
    return v;
  }();
  return t;
}

Rendezvous::Rendezvous(const Env& env) : rank_(env.rank), size_(env.world_size) {
  if (size_ == 1) return;
  const sockaddr_in addr = resolve(env);
  const auto t0 = Clock::now();
  // Whatever the constructor opened is closed if it throws (the destructor would not run).
  struct CloseOnThrow {
    std::vector<int>& fds;
    bool armed = true;
    ~CloseOnThrow() {
      if (!armed) return;
      for (int& fd : fds)
        if (fd >= 0) close(fd);
      fds.clear();
    }
  } guard{fds_};
  const double timeout = timeout_seconds();
  if (rank_ == 0) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    DUALCAST_CHECK(listener >= 0, "dist: rank 0: socket() failed: ", errno_text());
    const int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener, size_) != 0) {
      const std::string why = errno_text();
      close(listener);
      DUALCAST_FAIL("dist: rank 0: cannot listen on ", env.master_addr, ":", env.master_port, " (",
                    why, "); is another group using MASTER_PORT?");
    }
    fds_.assign(static_cast<std::size_t>(size_), -1);
    for (int joined = 1; joined < size_;) {
      pollfd p{listener, POLLIN, 0};
      const double left = timeout - seconds_since(t0);
      const int ready = left > 0 ? poll(&p, 1, static_cast<int>(left * 1000)) : 0;
      if (ready <= 0) {
        close(listener);
        DUALCAST_FAIL("dist: rank 0: only ", joined, " of ", size_, " ranks joined within ",
                      timeout, " s (DUALCAST_DIST_TIMEOUT); did every rank start?");
      }
      const int fd = accept(listener, nullptr, nullptr);
      if (fd < 0) continue;
      set_timeouts(fd);
      Hello h{};
      if (::recv(fd, &h, sizeof h, MSG_WAITALL) != static_cast<ssize_t>(sizeof h) || h.magic != kMagic ||
          h.rank <= 0 || h.rank >= size_ || fds_[static_cast<std::size_t>(h.rank)] >= 0 ||
          h.world_size != size_) {
        close(fd);  // not one of ours, a duplicate rank, or another world size: refuse it
        if (h.magic == kMagic && h.world_size != size_) {
          close(listener);
          DUALCAST_FAIL("dist: rank 0: rank ", h.rank, " says WORLD_SIZE=", h.world_size,
                        " but rank 0 has ", size_);
        }
        continue;
      }
      fds_[static_cast<std::size_t>(h.rank)] = fd;
      ++joined;
    }
    close(listener);
    const std::int32_t ok = size_;
    for (int k = 1; k < size_; ++k) send(k, &ok, sizeof ok, "rendezvous");
  } else {
    int fd = -1;
    for (;;) {
      fd = socket(AF_INET, SOCK_STREAM, 0);
      DUALCAST_CHECK(fd >= 0, "dist: rank ", rank_, ": socket() failed: ", errno_text());
      if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
      const std::string why = errno_text();
      close(fd);
      DUALCAST_CHECK(seconds_since(t0) < timeout, "dist: rank ", rank_, ": could not connect to rank 0 at ",
                     env.master_addr, ":", env.master_port, " within ", timeout,
                     " s (DUALCAST_DIST_TIMEOUT): ", why);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    set_timeouts(fd);
    fds_.assign(1, fd);
    const Hello h{kMagic, rank_, size_};
    send(0, &h, sizeof h, "rendezvous");
    std::int32_t ok = 0;
    recv(0, &ok, sizeof ok, "rendezvous");
  }
  guard.armed = false;
}

void Rendezvous::shutdown() {
  for (int fd : fds_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

Rendezvous::~Rendezvous() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

int Rendezvous::fd_of(int peer, const char* what) const {
  const bool valid = rank_ == 0 ? (peer > 0 && peer < size_) : peer == 0;
  DUALCAST_CHECK(valid, "dist: rank ", rank_, ": ", what, ": no connection to rank ", peer,
                 " (the group is a star around rank 0)");
  return fds_[rank_ == 0 ? static_cast<std::size_t>(peer) : 0];
}

void Rendezvous::send(int peer, const void* data, std::size_t bytes, const char* what) {
  const int fd = fd_of(peer, what);
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    DUALCAST_CHECK(n > 0, "dist: rank ", rank_, ": ", what, ": sending to rank ", peer, " failed (",
                   errno == EAGAIN || errno == EWOULDBLOCK ? "timed out (DUALCAST_DIST_TIMEOUT)"
                                                            : errno_text(),
                   "); rank ", peer, " has exited or stopped: see its messages");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void Rendezvous::recv(int peer, void* data, std::size_t bytes, const char* what) {
  const int fd = fd_of(peer, what);
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    DUALCAST_CHECK(n != 0, "dist: rank ", rank_, ": ", what, ": rank ", peer,
                   " closed its connection (it exited or failed: see its messages)");
    DUALCAST_CHECK(n > 0, "dist: rank ", rank_, ": ", what, ": waiting for rank ", peer, " failed (",
                   errno == EAGAIN || errno == EWOULDBLOCK
                       ? "no data within DUALCAST_DIST_TIMEOUT=" + std::to_string(timeout_seconds()) + " s"
                       : errno_text(),
                   ")");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void Rendezvous::broadcast_from_root(void* data, std::size_t bytes, const char* what) {
  if (size_ == 1) return;
  if (rank_ == 0) {
    for (int k = 1; k < size_; ++k) send(k, data, bytes, what);
  } else {
    recv(0, data, bytes, what);
  }
}

void Rendezvous::check_same(const std::string& mine, const char* what) {
  if (size_ == 1) return;
  // Rank 0 collects (length, text) from each rank, then answers everyone with the verdict.
  std::string verdict;
  if (rank_ == 0) {
    for (int k = 1; k < size_; ++k) {
      std::uint64_t n = 0;
      recv(k, &n, sizeof n, what);
      DUALCAST_CHECK(n <= kMaxDescription, "dist: rank 0: ", what, ": rank ", k,
                     " sent a description of ", n, " bytes: the ranks are out of step");
      std::string theirs(n, '\0');
      if (n > 0) recv(k, theirs.data(), n, what);
      if (verdict.empty() && theirs != mine)
        verdict = detail_concat_mismatch(what, k, theirs, mine);
    }
    const std::uint64_t n = verdict.size();
    for (int k = 1; k < size_; ++k) {
      send(k, &n, sizeof n, what);
      if (n > 0) send(k, verdict.data(), n, what);
    }
  } else {
    const std::uint64_t n = mine.size();
    send(0, &n, sizeof n, what);
    if (n > 0) send(0, mine.data(), n, what);
    std::uint64_t m = 0;
    recv(0, &m, sizeof m, what);
    DUALCAST_CHECK(m <= kMaxDescription, "dist: rank ", rank_, ": ", what, ": rank 0 sent ", m,
                   " bytes: the ranks are out of step");
    verdict.assign(m, '\0');
    if (m > 0) recv(0, verdict.data(), m, what);
  }
  DUALCAST_CHECK(verdict.empty(), "dist: rank ", rank_, ": ", verdict);
}

std::string Rendezvous::detail_concat_mismatch(const char* what, int rank, const std::string& theirs,
                                               const std::string& root) {
  return dualcast::detail::concat(what, ": rank ", rank, " called it with ", theirs,
                                  " but rank 0 with ", root,
                                  " (every rank must run the same collectives in the same order)");
}

void Rendezvous::barrier(const char* what) {
  // Through check_same, whose messages carry their length and what they are: a rank in a barrier
  // while another runs a collective gets a clear mismatch, never a misread byte stream.
  check_same("barrier", what);
}

}  // namespace dualcast::dist::detail

// rendezvous.hpp: the TCP connections that join the ranks of a group (internal to communicator.cpp).
//
// A star: rank 0 listens on MASTER_ADDR:MASTER_PORT and keeps one connection to every other rank;
// rank k keeps one connection, to rank 0. Every wait has a timeout; a peer that closes its end (it
// exited) is an Error naming it at once. Messages are plain byte blocks: both ends always know how
// many bytes come next, because every rank runs the same sequence of calls.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dualcast/communicator.hpp"

namespace dualcast::dist::detail {

/// Seconds a rank waits for a peer (DUALCAST_DIST_TIMEOUT, default 300).
double timeout_seconds();

class Rendezvous {
 public:
  /// Connects the group (rank 0 accepts world_size - 1 connections; the others connect, retrying
  /// until the timeout while rank 0 is not listening yet). A group of one opens nothing.
  explicit Rendezvous(const Env& env);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

  /// Sends or receives exactly `bytes` to or from `peer` (rank 0 talks to every rank, the others
  /// only to rank 0). `what` names the operation in messages.
  void send(int peer, const void* data, std::size_t bytes, const char* what);
  void recv(int peer, void* data, std::size_t bytes, const char* what);

  /// Every rank gets rank 0's `bytes` bytes (in place).
  void broadcast_from_root(void* data, std::size_t bytes, const char* what);
  /// Rank 0 gets every rank's string (in rank order) and checks they are all equal to its own; a
  /// difference is an Error on every rank, naming the first rank that differs and both strings.
  void check_same(const std::string& mine, const char* what);
  /// Blocks until every rank has called it.
  void barrier(const char* what);
  /// Shuts every connection down (a thread blocked in send or recv returns with an Error at once):
  /// for leaving the group while a collective is still in progress.
  void shutdown();

 private:
  int fd_of(int peer, const char* what) const;
  static std::string detail_concat_mismatch(const char* what, int rank, const std::string& theirs,
                                            const std::string& root);
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> fds_;  ///< rank 0: fds_[k] is rank k's connection; others: fds_[0]
};

}  // namespace dualcast::dist::detail

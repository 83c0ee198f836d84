// communicator_internal.hpp: what communicator.cpp needs of the NCCL backend (communicator_nccl.cpp).
#pragma once

#include <memory>

#include "dualcast/communicator.hpp"
#include "rendezvous.hpp"

namespace dualcast::dist::detail {

/// The NCCL communicator of `env` on CUDA `device`; rank 0's unique id travels over `rdv`. An Error
/// in a build without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(const Env& env, Device device,
                                                     std::unique_ptr<Rendezvous> rdv);

}  // namespace dualcast::dist::detail

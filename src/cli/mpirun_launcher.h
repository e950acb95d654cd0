// `train --nproc N`: the command again under `mpirun -np N` on this machine, with this process as
// mpirun's parent (mpirun_launcher.cpp says why: Ctrl-C as a checkpointed stop of every rank, and a
// rank that dies named with RUNTIME_DISTRIBUTED_RANK_LOST even when no rank survived to say it).
#pragma once

#include <cstdint>

namespace bp::cli {

// Runs mpirun and waits for it; returns the exit code `train` ends with (mpirun's, 130 after an
// interrupt, RUNTIME_DISTRIBUTED_RANK_LOST's when a rank was lost), or throws the coded error.
int run_under_mpirun(int64_t nproc);

}  // namespace bp::cli

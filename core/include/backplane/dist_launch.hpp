// bp::dist launchers: where init_process_group() finds its rank, world size and rendezvous
// address when the options leave them out (PyTorch's env:// initialisation, extended to the
// launchers of HPC clusters).
//
// Note [Launchers]
//   The first family whose rank variable is set decides rank, world size and local rank:
//     1. Backplane    BACKPLANE_RANK, BACKPLANE_WORLD_SIZE, BACKPLANE_LOCAL_RANK (bp-run)
//     2. torchrun     RANK, WORLD_SIZE, LOCAL_RANK
//     3. Open MPI     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (mpirun, prterun)
//     4. PMIx         PMIX_RANK; the size from OMPI_COMM_WORLD_SIZE, SLURM_NTASKS or PMI_SIZE,
//                     the local rank from OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID
//     5. MPICH, Intel PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
//     6. Slurm        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun)
//   The MPI families come before Slurm's because mpirun inside a Slurm allocation starts its
//   ranks through one daemon per node, whose SLURM_PROCID (the node's index) every rank of that
//   node inherits; under `srun --mpi=pmix` both agree.
//   The rendezvous address, in order: BACKPLANE_INIT (file:///dir or tcp://host:port); else
//   tcp://MASTER_ADDR:MASTER_PORT; under Slurm MASTER_ADDR defaults to the first host of
//   SLURM_JOB_NODELIST (where SLURM_PROCID 0 runs) and MASTER_PORT to kDefaultMasterPort.
//   torchrun's agent already listens on MASTER_PORT with a store of its own
//   (TORCHELASTIC_USE_AGENT_STORE=True): Backplane's store then takes MASTER_PORT + 1.
//   MPI launchers give no address: MASTER_ADDR and MASTER_PORT (or BACKPLANE_INIT) must be
//   exported to every rank (mpirun -x MASTER_ADDR -x MASTER_PORT).
//   A value that is not a number, a rank not below the size, a local rank out of range, a
//   family with its rank but not its size, or a group of several ranks with no address is a
//   RendezvousError naming the variable, its value and what would be right.
#pragma once

#include <backplane/export.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace bp::dist {

// The port of the store when MASTER_PORT is not set under Slurm (PyTorch's default).
inline constexpr int kDefaultMasterPort = 29500;

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // "bp-run", "torchrun", "openmpi", "pmix", "mpich", "slurm", or "" (no launcher: a group of
  // one).
  std::string launcher;
  std::string variables;  // the variables rank and size came from: "RANK/WORLD_SIZE"
  // "tcp://host:port" or "file:///dir"; "" for a group of one without any address.
  std::string init_method;
  std::string init_from;  // where the address came from: "MASTER_ADDR/MASTER_PORT"
};

// Reads the launcher variables through `lookup` (nullptr or "" for an unset variable): a
// testable form of launch_env(). RendezvousError on inconsistent or malformed values.
using EnvLookup = std::function<const char*(const char* name)>;
BP_API LaunchEnv launch_env(const EnvLookup& lookup);
// The same from the process environment.
BP_API LaunchEnv launch_env();

// Slurm's compressed host lists: "gpu-[01-04,07],cpu1" is gpu-01 .. gpu-04, gpu-07, cpu1
// (zero padding kept, several bracket groups in one name multiply: "r[1-2]n[1-2]" is r1n1,
// r1n2, r2n1, r2n2). RendezvousError naming the list and the position of an unbalanced
// bracket, an empty name, a reversed or non-numeric range, or more than `max_hosts` hosts.
BP_API std::vector<std::string> expand_slurm_hostlist(std::string_view list,
                                                      size_t max_hosts = 1 << 20);
// The first host of such a list, without expanding the rest (which is still checked).
BP_API std::string first_slurm_host(std::string_view list);

}  // namespace bp::dist

// MPI backend of the Communicator (CPU buffers), built when MOE_HAVE_MPI. MPI types stay out of
// this header so that code above the comm layer never includes <mpi.h>.
#pragma once
#include <memory>
#include <string>

#include "moe/comm/communicator.h"

namespace moe::comm {

// A communicator over MPI_COMM_WORLD (a duplicate of it, with MPI_ERRORS_RETURN so that failures
// become moe::Error). Initialises MPI once per process (MPI_THREAD_MULTIPLE requested; at least
// MPI_THREAD_SERIALIZED required, since the communication scheduler issues calls from a thread of
// its own) and finalises it at exit, unless the program initialised MPI itself.
std::unique_ptr<Communicator> make_mpi_world();

// The thread level MPI granted (MPI_THREAD_*), once make_mpi_world() has run.
int mpi_thread_level();
// Whether that level lets several threads call MPI at once (MPI_THREAD_MULTIPLE).
bool mpi_thread_multiple();

// True when this process was started by an MPI launcher (mpiexec/hydra, srun with PMI/PMIx,
// Open MPI's mpirun): tools pick MPI only then, so a plain `moe-train` stays launcher-free.
bool launched_under_mpi();

// For tools, never for the library: prints "moe: rank R: <message>" to stderr and MPI_Abort()s the
// whole job (every rank exits within seconds instead of hanging in a collective) with `code`
// (1 when code is 0). Without MPI initialised it exits this process with `code`.
[[noreturn]] void abort_job(const std::string& message, int code);

}  // namespace moe::comm

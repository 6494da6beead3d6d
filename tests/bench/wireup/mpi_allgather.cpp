// The peer of the wireup benchmark: the same exchange (every rank gets every other rank's
// <bytes>-byte value) done by Open MPI's MPI_Allgather. Prints one JSON line from rank 0 with
// the slowest rank's time per round.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int bytes = argc > 1 ? std::atoi(argv[1]) : 4096;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 1;
  std::vector<unsigned char> mine(bytes), all(static_cast<std::size_t>(bytes) * size);
  for (int i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>((rank * 131 + i) & 0xff);
  MPI_Barrier(MPI_COMM_WORLD);
  std::string times;
  int errors = 0;
  for (int round = 0; round < rounds; ++round) {
    double start = MPI_Wtime();
    MPI_Allgather(mine.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
    double mine_us = (MPI_Wtime() - start) * 1e6, slowest_us = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (all[static_cast<std::size_t>(peer) * bytes + 1] !=
          static_cast<unsigned char>((peer * 131 + 1) & 0xff)) {
        ++errors;
      }
    }
    MPI_Reduce(&mine_us, &slowest_us, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    times += (round ? "," : "") + std::to_string(static_cast<long long>(slowest_us));
  }
  int total_errors = 0;
  MPI_Reduce(&errors, &total_errors, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("{\"size\":%d,\"errors\":%d,\"exchange_us\":[%s]}\n", size, total_errors,
                times.c_str());
  MPI_Finalize();
  return total_errors == 0 ? 0 : 1;
}

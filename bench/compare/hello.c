/* The smallest MPI program, for launch-time comparisons (tmpi-compare --launch): every rank
 * initializes, says hello and finalizes, like tmpi's examples/src/bin/hello.rs. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("Hello from rank %d of %d\n", rank, size);
    MPI_Finalize();
    return 0;
}

// A process of a run that fails while the others wait for it in a gather: run by ctest under
// mpirun on 2 processes, it must end the whole job within the test's timeout, with the failing
// process's message on stderr (tests/CMakeLists.txt).
#include <vector>

#include "train/processes.hpp"

int main() {
    const relgrad::Processes& processes = relgrad::Processes::world();
    if (processes.rank() == 1) {
        return relgrad::Processes::ending("relgrad: error: a process that fails ends the job", 2);
    }
    std::vector<double> never;
    processes.gather(std::vector<double>{1.0}, never);  // rank 1 never comes: only MPI_Abort ends this
    return 0;
}

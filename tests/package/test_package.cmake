# ctest's package.find_package, run as cmake -P: installs the relgrad build BUILD_DIR into a fresh
# prefix under WORK_DIR, then configures, builds and runs the outside project PROJECT_DIR (this
# folder) against that prefix, as a user of find_package(relgrad) would. Any failing step, or a
# relgrad package found anywhere but in that prefix, fails the test.
cmake_minimum_required(VERSION 3.20)

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix} ${build})  # nothing left from an earlier run may help this one pass

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${what}: failed (${code})\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

step("installing ${BUILD_DIR} into ${prefix}"
     ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --config ${CONFIG})
step("configuring ${PROJECT_DIR}"
     ${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${build} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
     -DCMAKE_BUILD_TYPE=${CONFIG} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
file(STRINGS ${build}/CMakeCache.txt found REGEX "^relgrad_DIR:")
string(FIND "${found}" "${prefix}/" at)
if(NOT at GREATER -1)
  message(FATAL_ERROR "the outside project found relgrad elsewhere than in ${prefix}: ${found}")
endif()
step("building ${PROJECT_DIR}" ${CMAKE_COMMAND} --build ${build} --config ${CONFIG} -j2)

find_program(use_relgrad use_relgrad PATHS ${build} ${build}/${CONFIG} NO_DEFAULT_PATH REQUIRED)
step("running ${use_relgrad}" ${use_relgrad})
message(STATUS "${out}")
# The installed command-line program runs too.
step("running the installed relgrad" ${prefix}/bin/relgrad gradcheck --filter matmul)
# With the CUDA backend built, the installed relgrad opens the installed module (named here; it
# looks in ../lib from bin/ first): the cuda device then runs, or is refused for CUDA's own reason,
# never for a module that cannot be loaded.
file(GLOB module ${prefix}/lib*/librelgrad_cuda.so)
if(module)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env RELGRAD_CUDA_LIBRARY=${module}
                          ${prefix}/bin/relgrad gradcheck --filter add --device cuda RESULT_VARIABLE code
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0 AND (NOT err MATCHES "^relgrad: error: no usable CUDA device: " OR err MATCHES "librelgrad_cuda|cannot load"))
    message(FATAL_ERROR "the installed relgrad did not open ${module} (exit code ${code}):\n${err}")
  endif()
endif()

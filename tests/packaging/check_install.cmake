# check_install.cmake - CTest's packaging test (cmake -P): install the build into a
# temporary prefix, then build tests/packaging/main.c against that install the two ways a
# user would (a CMake project with find_package(vramkit), and the compiler with
# `pkg-config --cflags --libs vramkit`) and run each program on the sim source.
#
# Inputs (-D): BUILD_DIR (the vramkit build to install), WORK_DIR (scratch, wiped),
# C_COMPILER, SANITIZE (the build's VRAMKIT_SANITIZE: a consumer of a sanitized library
# must link the sanitizers' runtime too, so it gets the same flags).
foreach(var BUILD_DIR WORK_DIR C_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_install.cmake: -D${var}=... is required")
  endif()
endforeach()
set(here ${CMAKE_CURRENT_LIST_DIR})
set(C_FLAGS "")
if(SANITIZE)
  set(C_FLAGS "-fsanitize=address,undefined")
endif()
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}")
  endif()
  string(STRIP "${out}" out)
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(file include/vramkit.h)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "not installed: ${file}")
  endif()
endforeach()

# VRAMKIT_SOURCE=sim: the programs must not depend on a GPU or a driver being present.
set(env ${CMAKE_COMMAND} -E env VRAMKIT_SOURCE=sim)

# 1. find_package(vramkit): configure, build, run both the shared and the static link.
run(${CMAKE_COMMAND} -S ${here} -B ${WORK_DIR}/cmake-build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
    "-DCMAKE_C_FLAGS=${C_FLAGS}" -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build)
foreach(exe downstream_shared downstream_static)
  run(${env} ${WORK_DIR}/cmake-build/${exe})
  message(STATUS "find_package, ${exe}: ${last_output}")
endforeach()

# 2. pkg-config, as a Makefile user would: cc main.c $(pkg-config --cflags --libs vramkit).
find_program(PKG_CONFIG pkg-config REQUIRED)
file(GLOB_RECURSE pc_files ${prefix}/vramkit.pc)
list(LENGTH pc_files n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one vramkit.pc under ${prefix}, found: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} ${PKG_CONFIG} --cflags --libs vramkit)
string(STRIP "${last_output}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
separate_arguments(extra UNIX_COMMAND "${C_FLAGS}")
# The library lives outside the loader's path; the rpath is the user's choice, made here.
string(REGEX MATCH "-L[^;]*" libdir_flag "${pc_flags}")
string(SUBSTRING "${libdir_flag}" 2 -1 libdir)
run(${C_COMPILER} ${extra} ${here}/main.c ${pc_flags} -Wl,-rpath,${libdir}
    -o ${WORK_DIR}/downstream_pkgconfig)
run(${env} ${WORK_DIR}/downstream_pkgconfig)
message(STATUS "pkg-config: ${last_output}")

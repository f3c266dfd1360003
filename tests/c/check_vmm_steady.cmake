# check_vmm_steady.cmake - a virtual-memory pool in a training loop's steady state makes no
# driver call: `vramkit replay --source sim:vmm --warm` of the training traces must report
# "device_calls_warm": 0 (the second pass over the same pool maps and unmaps nothing), with
# peak reserved at most 1.03x peak live. A loop's blocks land in other places each step; a
# pool that mapped where the best fit fell would unmap idle granules elsewhere and map
# again every step (gpt2_train: 15 calls a pass before the pool carved such requests from
# mapped free space).
# Usage: cmake -DTOOL=path/to/vramkit -DTRACES_DIR=data/traces -P check_vmm_steady.cmake
if(NOT TOOL OR NOT TRACES_DIR)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DTRACES_DIR=... -P check_vmm_steady.cmake")
endif()
foreach(name gpt2_train stream_prefetch)
  execute_process(COMMAND ${TOOL} replay --source sim:vmm --warm --repeat 1 --json
                          ${TRACES_DIR}/${name}.trace.gz
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "vramkit replay exited with ${rc}:\n${err}")
  endif()
  if(NOT out MATCHES "\"device_calls_warm\": *0[,} ]")
    message(FATAL_ERROR "${name}: the warm pass called the driver:\n${out}")
  endif()
  if(NOT out MATCHES "\"reserved_over_live\": *1\\.0[0-3][0-9]*[,} ]")
    message(FATAL_ERROR "${name}: peak reserved above 1.03x peak live:\n${out}")
  endif()
endforeach()
message(STATUS "vmm steady state: no driver call in the warm passes")

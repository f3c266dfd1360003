# check_fit_under_cap.cmake - on the default settings a pool fits each shared trace under a
# cap of at most 1.03x its peak live bytes: `vramkit replay --source sim --min-capacity`
# (sim models the cuda source, virtual growth included) must report
# "min_capacity_over_live" at most 1.03. Fixed segments alone need 1.44x on
# bert_infer_varlen; the virtual ranges an arena turns to past VRAMKIT_VIRTUAL_THRESHOLD
# of the cap are what close it.
# Usage: cmake -DTOOL=path/to/vramkit -DTRACES_DIR=data/traces -P check_fit_under_cap.cmake
if(NOT TOOL OR NOT TRACES_DIR)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DTRACES_DIR=... -P check_fit_under_cap.cmake")
endif()
foreach(name bert_infer_varlen gpt2_train stream_prefetch)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=VRAMKIT_VIRTUAL_THRESHOLD
                          --unset=VRAMKIT_TIGHT_THRESHOLD --unset=VRAMKIT_SOURCE
                          ${TOOL} replay --source sim --min-capacity --repeat 1 --json
                          ${TRACES_DIR}/${name}.trace.gz
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "vramkit replay exited with ${rc}:\n${err}")
  endif()
  if(NOT out MATCHES "\"min_capacity_over_live\": *1\\.0[0-2][0-9]*[,} ]" AND
     NOT out MATCHES "\"min_capacity_over_live\": *1\\.030*[,} ]")
    message(FATAL_ERROR "${name}: the smallest cap is above 1.03x peak live:\n${out}")
  endif()
endforeach()
message(STATUS "fit under a cap: every trace within 1.03x of its peak live bytes")

# check_fit_under_cap.cmake - on the default settings a pool fits each shared trace under a
# cap of at most 1.03x its peak live bytes: `vramkit replay --source sim --min-capacity`
# (sim models the cuda source, its large blocks in virtual ranges) must report
# "min_capacity_over_live" at most 1.03. Fixed segments alone need 1.44x on
# bert_infer_varlen; virtual ranges, mapped only where live blocks are, close it.
# Usage: cmake -DTOOL=path/to/vramkit -DTRACES_DIR=data/traces -P check_fit_under_cap.cmake
if(NOT TOOL OR NOT TRACES_DIR)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DTRACES_DIR=... -P check_fit_under_cap.cmake")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/replay_tool.cmake)
foreach(name bert_infer_varlen gpt2_train stream_prefetch)
  vk_replay(out ENV --unset=VRAMKIT_VIRTUAL_THRESHOLD --unset=VRAMKIT_TIGHT_THRESHOLD
                    --unset=VRAMKIT_SOURCE --unset=VRAMKIT_LARGE_BLOCKS
                ARGS --source sim --min-capacity --repeat 1 --json ${TRACES_DIR}/${name}.trace.gz)
  if(NOT out MATCHES "\"min_capacity_over_live\": *1\\.0[0-2][0-9]*[,} ]" AND
     NOT out MATCHES "\"min_capacity_over_live\": *1\\.030*[,} ]")
    message(FATAL_ERROR "${name}: the smallest cap is above 1.03x peak live:\n${out}")
  endif()
endforeach()
message(STATUS "fit under a cap: every trace within 1.03x of its peak live bytes")

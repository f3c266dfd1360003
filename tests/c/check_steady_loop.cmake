# check_steady_loop.cmake - a training loop recorded on the card settles, on the default
# settings from its third step and on fixed large segments from its sixth.
# data/recordings/resnet50_train.trace.gz is ResNet-50 training (torchvision, bf16
# autocast, batch 64, 10 steps) recorded with vramkit.save_trace on an H200. Its first
# step is ops 0 to 2,015 and each later one 1,530 ops, so step 3 starts at op 3,546 and
# step 6 at op 8,136. `vramkit replay --source sim --calls-after N` must report
#   - by default (large blocks in virtual ranges): "device_calls_after": 0 from op 3,546,
#     the issue's "no driver call after the second step", and peak reserved over peak live
#     at most 1.02 (1.013 when this check was written);
#   - with VRAMKIT_LARGE_BLOCKS=fixed: 0 from op 8,136 (the peak guard has settled,
#     segment.c, guard_peak; before it remembered the sizes it gave back the loop made 40
#     calls there) and at most 1.05 (1.037).
# Usage: cmake -DTOOL=path/to/vramkit -DRECORDING=path/to/trace -P check_steady_loop.cmake
if(NOT TOOL OR NOT RECORDING)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DRECORDING=... -P check_steady_loop.cmake")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/replay_tool.cmake)

function(check_loop large_blocks calls_after step max_ratio)
  vk_replay(out ENV VRAMKIT_LARGE_BLOCKS=${large_blocks}
                ARGS --source sim --repeat 1 --json --calls-after ${calls_after} ${RECORDING})
  if(NOT out MATCHES "\"device_calls_after\": *0[,} ]")
    message(FATAL_ERROR
            "large blocks ${large_blocks}: the loop still calls the driver from step ${step}:\n${out}")
  endif()
  string(REGEX MATCH "\"reserved_over_live\": *([0-9]+)\\.([0-9][0-9][0-9])" _ "${out}")
  set(ratio "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
  if(ratio STREQUAL "" OR ratio GREATER ${max_ratio})
    message(FATAL_ERROR "large blocks ${large_blocks}: peak reserved over live above "
                        "${max_ratio}/1000:\n${out}")
  endif()
  message(STATUS "steady loop, large blocks ${large_blocks}: no driver call from step ${step}")
endfunction()

check_loop(virtual 3546 3 1020)
check_loop(fixed 8136 6 1050)

# check_steady_loop.cmake - a training loop recorded on the card settles on fixed segments.
# data/recordings/resnet50_train.trace.gz is ResNet-50 training (torchvision, bf16
# autocast, batch 64, 10 steps) recorded with vramkit.save_trace on an H200. Its first
# step is ops 0 to 2,015 and each later one 1,530 ops, so step 5 starts at op 8,136.
# `vramkit replay --source sim --calls-after 8136` must report
#   - "device_calls_after": 0: the pool's peak guard has settled (segment.c, guard_peak);
#     before it remembered the sizes it gave back, the loop made 40 calls there, eight a
#     step;
#   - peak reserved over peak live at most 1.05 (1.037 since the guard's ghosts).
# Usage: cmake -DTOOL=path/to/vramkit -DRECORDING=path/to/trace -P check_steady_loop.cmake
if(NOT TOOL OR NOT RECORDING)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DRECORDING=... -P check_steady_loop.cmake")
endif()
execute_process(COMMAND ${TOOL} replay --source sim --repeat 1 --json --calls-after 8136
                        ${RECORDING}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "vramkit replay exited with ${rc}:\n${err}")
endif()
if(NOT out MATCHES "\"device_calls_after\": *0[,} ]")
  message(FATAL_ERROR "the loop still calls the driver from its sixth step on:\n${out}")
endif()
string(REGEX MATCH "\"reserved_over_live\": *([0-9]+)\\.([0-9][0-9][0-9])" _ "${out}")
set(ratio "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
if(ratio STREQUAL "" OR ratio GREATER 1050)
  message(FATAL_ERROR "peak reserved over live above 1.05:\n${out}")
endif()
message(STATUS "steady loop: no driver call from the sixth step of ResNet-50 training")

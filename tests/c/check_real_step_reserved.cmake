# check_real_step_reserved.cmake - on a real training step recorded on the card under
# vramkit (RoBERTa-base, fp16 autocast, four micro-batches accumulated), the default pool
# holds no more than PyTorch's expandable segments held on the same step: `vramkit replay
# --source S` (S = sim and sim:vmm, far from any cap) must report peak reserved over peak
# live of at most 1.080, expandable segments' figure there (docs/performance.md, Note
# [Whole mappings past a ghost]). Its fp32 logits' gradient is the request that once mapped
# a span the allowance had unmapped, beside an idle end of the range.
# Usage: cmake -DTOOL=path/to/vramkit -DRECORDINGS=data/recordings -P check_real_step_reserved.cmake
if(NOT TOOL OR NOT RECORDINGS)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DRECORDINGS=... -P check_real_step_reserved.cmake")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/replay_tool.cmake)
foreach(source sim sim:vmm)
  vk_replay(out ENV --unset=VRAMKIT_LARGE_BLOCKS --unset=VRAMKIT_VIRTUAL_THRESHOLD
                ARGS --source ${source} --repeat 1 --json ${RECORDINGS}/roberta_accumulate4.trace.gz)
  string(REGEX MATCH "\"reserved_over_live\": *([0-9]+)\\.([0-9][0-9][0-9])" _ "${out}")
  set(ratio "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
  if(ratio STREQUAL "" OR ratio GREATER 1080)
    message(FATAL_ERROR "roberta_accumulate4 on ${source}: peak reserved over live above "
                        "1.080, expandable segments' figure:\n${out}")
  endif()
endforeach()
message(STATUS "the recorded RoBERTa step holds no more than expandable segments")

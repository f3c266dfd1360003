# replay_tool.cmake - the one way the check_*.cmake scripts run `vramkit replay`.
# vk_replay(<out-var> [ENV <cmake -E env arguments>...] ARGS <replay arguments>...) runs
# ${TOOL} replay with those arguments (through `cmake -E env` with the ENV ones, such as
# --unset=VRAMKIT_SOURCE or VRAMKIT_LARGE_BLOCKS=fixed), prints what it wrote, stops the
# check on a non-zero exit status with its stderr, and sets <out-var> to its stdout.
# vk_ratio_at_most(<out> <thousandths> <what>) stops the check, naming <what>, unless the
# replay output <out> reports peak reserved over live of at most <thousandths>/1000.
function(vk_replay out_var)
  cmake_parse_arguments(PARSE_ARGV 1 VK "" "" "ENV;ARGS")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${VK_ENV} ${TOOL} replay ${VK_ARGS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${VK_ENV} ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "vramkit replay ${VK_ARGS} (${VK_ENV}) exited with ${rc}:\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(vk_ratio_at_most out bound what)
  string(REGEX MATCH "\"reserved_over_live\": *([0-9]+)\\.([0-9][0-9][0-9])" _ "${out}")
  set(ratio "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
  if(ratio STREQUAL "" OR ratio GREATER ${bound})
    message(FATAL_ERROR "${what}: peak reserved over live above ${bound}/1000:\n${out}")
  endif()
endfunction()

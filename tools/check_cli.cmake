# check_cli.cmake - the vramkit command's behaviour on bad input, one case per CTest test.
#
# Each case runs the built command the way a new user would and checks its exit status and
# what it says: the status scripts rely on (see the "Exit status" part of `vramkit --help`)
# and a message that names the file or option at fault. The traces a case needs are written
# into WORK first, so the cases depend on nothing but the command itself.
#
# Usage: cmake -DTOOL=path/to/vramkit -DWORK=scratch/dir -DCASE=name -P check_cli.cmake
if(NOT TOOL OR NOT WORK OR NOT CASE)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DWORK=... -DCASE=... -P check_cli.cmake")
endif()
file(MAKE_DIRECTORY "${WORK}")

# The sim source with its default size and no limit, whatever the caller's environment says:
# the cases check the command's defaults, not the machine's settings. The variables are the
# ones `vramkit --help` lists from the library's table (where the tests publish, and the
# tests' own, stay as they are).
execute_process(COMMAND "${TOOL}" --help OUTPUT_VARIABLE help_text)
string(REGEX MATCHALL "\n  VRAMKIT_[A-Z_]+" listed "${help_text}")
foreach(variable IN LISTS listed)
  string(STRIP "${variable}" variable)
  if(NOT variable MATCHES "^VRAMKIT_(PUBLISH|TEST_)")
    unset(ENV{${variable}})
  endif()
endforeach()
set(ENV{VRAMKIT_SOURCE} sim)
# Each variable is listed beside its own help, not its neighbour's.
if(NOT help_text MATCHES "\n  VRAMKIT_SOURCE +auto, sim" OR
   NOT help_text MATCHES "\n  VRAMKIT_LIMIT +a size")
  message(FATAL_ERROR "vramkit --help does not put each variable beside its help:\n${help_text}")
endif()

set(HEADER "# vramkit-trace v1 workload=test")

# Write a trace of the given lines (a list) into WORK/name and set ${name}_path to it.
function(write_trace name)
  string(REPLACE ";" "\n" text "${ARGN}")
  if(NOT text STREQUAL "")
    string(APPEND text "\n")
  endif()
  file(WRITE "${WORK}/${name}" "${text}")
  set(${name}_path "${WORK}/${name}" PARENT_SCOPE)
endfunction()

# run(STATUS n ARGS ... [STDERR regex...] [STDOUT regex...] [NOT_STDERR regex...]
#     [NOT_STDOUT regex...])
# Every STDERR / STDOUT regex must match that stream; no NOT_ regex may match its stream.
function(run)
  cmake_parse_arguments(RUN "" "STATUS" "ARGS;STDERR;STDOUT;NOT_STDERR;NOT_STDOUT" ${ARGN})
  execute_process(COMMAND "${TOOL}" ${RUN_ARGS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE ";" " " shown "${RUN_ARGS}")
  set(context "vramkit ${shown}\n--- exit status ${rc}\n--- stdout\n${out}\n--- stderr\n${err}")
  if(NOT rc STREQUAL "${RUN_STATUS}")
    message(FATAL_ERROR "expected exit status ${RUN_STATUS}:\n${context}")
  endif()
  foreach(pattern IN LISTS RUN_STDERR)
    if(NOT err MATCHES "${pattern}")
      message(FATAL_ERROR "stderr does not match '${pattern}':\n${context}")
    endif()
  endforeach()
  foreach(pattern IN LISTS RUN_STDOUT)
    if(NOT out MATCHES "${pattern}")
      message(FATAL_ERROR "stdout does not match '${pattern}':\n${context}")
    endif()
  endforeach()
  foreach(pattern IN LISTS RUN_NOT_STDERR)
    if(err MATCHES "${pattern}")
      message(FATAL_ERROR "stderr should not match '${pattern}':\n${context}")
    endif()
  endforeach()
  foreach(pattern IN LISTS RUN_NOT_STDOUT)
    if(out MATCHES "${pattern}")
      message(FATAL_ERROR "stdout should not match '${pattern}':\n${context}")
    endif()
  endforeach()
endfunction()

if(CASE STREQUAL "empty_trace")
  write_trace(empty.trace)
  run(STATUS 2 ARGS replay ${empty.trace_path}
      STDERR "empty\\.trace: empty file" "# vramkit-trace v1")
  # The gzip of nothing is just as empty once decompressed.
  file(ARCHIVE_CREATE OUTPUT "${WORK}/empty.trace.gz" PATHS "${empty.trace_path}"
       FORMAT raw COMPRESSION GZip)
  run(STATUS 2 ARGS replay "${WORK}/empty.trace.gz" STDERR "empty\\.trace\\.gz: empty file")

elseif(CASE STREQUAL "missing_header")
  write_trace(bare.trace "a 1 512 0 0" "f 1 0 1")
  run(STATUS 2 ARGS replay ${bare.trace_path}
      STDERR "bare\\.trace:1: not a vramkit trace" "'a 1 512 0 0'")
  write_trace(future.trace "# vramkit-trace v2" "a 1 512 0 0")
  run(STATUS 2 ARGS replay ${future.trace_path}
      STDERR "future\\.trace:1: trace format 'v2' is not one this vramkit reads \\(v1\\)")
  # A comment is not a header either: the format line comes first.
  write_trace(comment_first.trace "# recorded by hand" "${HEADER}" "a 1 512 0 0")
  run(STATUS 2 ARGS replay ${comment_first.trace_path} STDERR "comment_first\\.trace:1: not a vramkit trace")
  # The header alone is a valid trace of no operations.
  write_trace(header_only.trace "${HEADER}")
  run(STATUS 0 ARGS replay --json --repeat 1 ${header_only.trace_path}
      STDOUT "\"trace\": \"header_only\"" "\"ops\": 0,")

elseif(CASE STREQUAL "option_without_value")
  write_trace(one.trace "${HEADER}" "a 1 512 0 0" "f 1 0 1")
  run(STATUS 3 ARGS replay --capacity STDERR "--capacity needs a value")
  # The next argument is an option, not the value: it must not be read as a size.
  run(STATUS 3 ARGS replay --capacity --json ${one.trace_path}
      STDERR "--capacity needs a value, and '--json' after it is an option"
      NOT_STDERR "bad size")
  run(STATUS 0 ARGS replay --capacity=1G --json --repeat 1 ${one.trace_path}
      STDOUT "\"capacity_bytes\": 1073741824")
  # Every other option that takes a value behaves the same way.
  foreach(command "replay;--source" "replay;--repeat" "replay;--calls-after"
                  "bench;random;--source" "bench;pair;--sizes" "bench;pair;--pairs" "bench;scale;--small"
                  "bench;scale;--large" "bench;scale;--ops")
    list(GET command -1 option)
    # The message names the command that was run, and where its options are described.
    set(words ${command})
    list(REMOVE_AT words -1)
    list(JOIN words " " named)
    run(STATUS 3 ARGS ${command}
        STDERR "^vramkit ${named}: ${option} needs a value \\(see vramkit ${named} --help\\)")
    run(STATUS 3 ARGS ${command} --json ${one.trace_path}
        STDERR "^vramkit ${named}: ${option} needs a value, and '--json' after it is an option")
  endforeach()

elseif(CASE STREQUAL "sizes_and_environment")
  write_trace(one.trace "${HEADER}" "a 1 4096 0 0" "f 1 0 1")
  # A negative size is a value the option refuses, named and quoted, not a next option.
  run(STATUS 3 ARGS replay --capacity -1G ${one.trace_path}
      STDERR "--capacity: '-1G' is not a size: a size cannot be negative" NOT_STDERR "option")
  foreach(text "0x10G" "1.5" "1e-300" "5 G" "1G ")
    run(STATUS 3 ARGS replay --capacity "${text}" ${one.trace_path}
        STDERR "--capacity: '${text}' is not a size: ")
  endforeach()
  # A preallocation stays held through empty_cache: not a leak, whatever its size.
  foreach(size 64M 100%)
    set(ENV{VRAMKIT_PREALLOCATE} ${size})
    run(STATUS 0 ARGS replay --json --repeat 1 ${one.trace_path} NOT_STDERR "not released")
  endforeach()
  set(ENV{VRAMKIT_PREALLOCATE} 18446744073709551615)
  run(STATUS 1 ARGS replay --repeat 1 ${one.trace_path} STDERR "VRAMKIT_PREALLOCATE")
  unset(ENV{VRAMKIT_PREALLOCATE})
  # Every refusal of a variable names it and quotes the value.
  set(ENV{VRAMKIT_LEAK_REPORT} abc)
  run(STATUS 3 ARGS replay --repeat 1 ${one.trace_path} STDERR "VRAMKIT_LEAK_REPORT: 'abc'")
  unset(ENV{VRAMKIT_LEAK_REPORT})
  set(ENV{VRAMKIT_LIMIT} 0)
  run(STATUS 3 ARGS replay --repeat 1 ${one.trace_path}
      STDERR "VRAMKIT_LIMIT: '0' is not a limit: .*leave it unset")
  unset(ENV{VRAMKIT_LIMIT})
  # A misspelled name is not silently ignored.
  set(ENV{VRAMKIT_LIMT} 1G)
  run(STATUS 0 ARGS replay --repeat 1 ${one.trace_path}
      STDERR "VRAMKIT_LIMT is not a vramkit variable and is ignored; did you mean VRAMKIT_LIMIT\\?")
  unset(ENV{VRAMKIT_LIMT})
  # A group limit a private sim cannot apply (no device others share) is said, not ignored.
  set(ENV{VRAMKIT_GROUP_LIMIT} 1G)
  run(STATUS 0 ARGS replay --repeat 1 --source sim ${one.trace_path}
      STDERR "the group and soft limits apply to a device other processes share.*: ignored")
  unset(ENV{VRAMKIT_GROUP_LIMIT})

elseif(CASE STREQUAL "skipped_frees")
  # Two frees of IDs not live then: blocks from before the recording began.
  write_trace(partial.trace "${HEADER}" "f 7 0 0" "a 1 4096 0 1" "f 8 0 2" "f 1 0 3")
  run(STATUS 0 ARGS replay --json --repeat 1 ${partial.trace_path}
      STDOUT "\"skipped_frees\": 2[,}]" "\"ops\": 2,"
      STDERR "partial\\.trace: skipped 2 frees of IDs not live then")
  write_trace(whole.trace "${HEADER}" "a 1 4096 0 1" "f 1 0 3")
  run(STATUS 0 ARGS replay --json --repeat 1 ${whole.trace_path}
      STDOUT "\"skipped_frees\": 0[,}]" NOT_STDERR "skipped")
  # A block freed twice: its ID was allocated, so "never allocated" would not be true.
  write_trace(twice.trace "${HEADER}" "a 1 4096 0 1" "f 1 0 2" "f 1 0 3")
  run(STATUS 0 ARGS replay --repeat 1 ${twice.trace_path}
      STDERR "twice\\.trace: skipped 1 free of IDs not live then \\(blocks from "
             "before the recording began, or freed twice\\)")

elseif(CASE STREQUAL "calls_after")
  # The second allocation reuses the first one's cached segment: one source call, made
  # before op 2, none after it. After all 4 ops nothing more is called: 0. Past the end of
  # the trace there is no op N and nothing to count: "-" and null, never a 0 that reads as
  # a loop that settled.
  write_trace(loop.trace "${HEADER}" "a 1 4096 0 0" "f 1 0 1" "a 2 4096 0 2" "f 2 0 3")
  run(STATUS 0 ARGS replay --json --repeat 1 --calls-after 0 ${loop.trace_path}
      STDOUT "\"calls_after_op\": 0, \"device_calls_after\": 1[,}]")
  run(STATUS 0 ARGS replay --json --repeat 1 --calls-after 2 ${loop.trace_path}
      STDOUT "\"calls_after_op\": 2, \"device_calls_after\": 0[,}]")
  run(STATUS 0 ARGS replay --json --repeat 1 --calls-after 4 ${loop.trace_path}
      STDOUT "\"calls_after_op\": 4, \"device_calls_after\": 0[,}]")
  foreach(count 5 99 999999999)
    run(STATUS 0 ARGS replay --json --repeat 1 --calls-after ${count} ${loop.trace_path}
        STDOUT "\"calls_after_op\": ${count}, \"device_calls_after\": null[,}]")
    run(STATUS 0 ARGS replay --repeat 1 --calls-after ${count} ${loop.trace_path}
        STDOUT "calls after\n[^\n]* +0 +-\n" NOT_STDOUT " 0\n")
  endforeach()
  write_trace(header_only.trace "${HEADER}")
  run(STATUS 0 ARGS replay --json --repeat 1 --calls-after 100 ${header_only.trace_path}
      STDOUT "\"device_calls_after\": null[,}]")
  run(STATUS 0 ARGS replay --repeat 1 --calls-after 0 ${header_only.trace_path}
      STDOUT "calls after\n[^\n]* +0 +0\n")
  run(STATUS 0 ARGS replay --repeat 1 --calls-after 2 ${loop.trace_path}
      STDOUT "calls after\n[^\n]* +0 +0\n")
  run(STATUS 0 ARGS replay --json --repeat 1 ${loop.trace_path} NOT_STDOUT "device_calls_after")
  run(STATUS 3 ARGS replay --calls-after x ${loop.trace_path}
      STDERR "--calls-after: expected a whole number")
  run(STATUS 3 ARGS replay --calls-after=-1 ${loop.trace_path}
      STDERR "--calls-after: expected a whole number")

elseif(CASE STREQUAL "sim_capacity")
  # The sim device has the library's default size, 80 GiB, as the documentation states.
  write_trace(fits.trace "${HEADER}" "a 1 85899345920 0 0" "f 1 0 1")
  run(STATUS 0 ARGS replay --json --repeat 1 ${fits.trace_path} STDOUT "\"ooms\": 0")
  write_trace(too_big.trace "${HEADER}" "a 1 85899345921 0 0" "f 1 0 1")
  run(STATUS 1 ARGS replay --json --repeat 1 ${too_big.trace_path}
      STDOUT "\"ooms\": 1" STDERR "capacity (of )?80\\.00? GiB")

  # Past what the sim models, --capacity is a bad command-line value (exit 3): one line
  # naming the option, the value and the largest accepted, before any replay; the largest
  # itself is accepted.
  foreach(size 512T 257T 281474976710657)
    run(STATUS 3 ARGS replay --json --repeat 1 --capacity ${size} ${fits.trace_path}
        STDERR "^vramkit replay: --capacity: '${size}' is more than the largest capacity accepted, "
               "256T \\(281474976710656 bytes\\)\n$"
        NOT_STDOUT "ops")
  endforeach()
  run(STATUS 0 ARGS replay --json --repeat 1 --capacity 256T ${fits.trace_path}
      STDOUT "\"capacity_bytes\": 281474976710656")
  # The same size from the environment is the library's to check (src/pool/options.c takes
  # it; the sim refuses it when the pool is made): the message names the value and range,
  # and the status is the configuration's (3).
  set(ENV{VRAMKIT_SIM_CAPACITY} 512T)
  run(STATUS 3 ARGS replay --json --repeat 1 ${fits.trace_path}
      STDERR "VRAM_ESIMCAPACITY" "562949953421312 bytes \\(VRAMKIT_SIM_CAPACITY\\)"
             "256 TiB"
      NOT_STDERR "--capacity")
  unset(ENV{VRAMKIT_SIM_CAPACITY})
  # Options the library refuses together are the configuration's fault (exit 3), in words
  # that name them: no_split with a virtual-memory source, or with a preallocation.
  set(ENV{VRAMKIT_NO_SPLIT} 1)
  run(STATUS 3 ARGS replay --repeat 1 --source sim:vmm ${fits.trace_path}
      STDERR "no_split \\(VRAMKIT_NO_SPLIT\\) cannot go with a virtual-memory source")
  set(ENV{VRAMKIT_PREALLOCATE} 100M)
  run(STATUS 3 ARGS replay --repeat 1 --source sim ${fits.trace_path}
      STDERR "cannot go with a preallocation \\(VRAMKIT_PREALLOCATE\\)")
  unset(ENV{VRAMKIT_PREALLOCATE})
  unset(ENV{VRAMKIT_NO_SPLIT})

elseif(CASE STREQUAL "size_beyond_any_device")
  # 2^48 + 1 bytes: out of memory (exit 1) naming the size and the device, not an allocator
  # failure (exit 4), and not a claim that rounding the size would overflow.
  write_trace(huge.trace "${HEADER}" "a 1 281474976710657 0 0" "f 1 0 1")
  run(STATUS 1 ARGS replay --repeat 1 ${huge.trace_path}
      STDERR "281474976710657 bytes" "capacity (of )?80\\.00? GiB" NOT_STDERR "overflow")
  run(STATUS 1 ARGS bench pair --source sim --pairs 1 --sizes 1000T
      STDERR "1099511627776000 bytes" "capacity (of )?80\\.00? GiB" NOT_STDERR "overflow")

elseif(CASE STREQUAL "huge_sizes")
  # Two live blocks of 2^63 bytes: the peak of live bytes saturates, said on stderr, and
  # never wraps back to 2^63.
  write_trace(halves.trace "${HEADER}" "a 1 9223372036854775808 0 0"
              "a 2 9223372036854775808 0 1" "f 1 0 2" "f 2 0 3")
  run(STATUS 1 ARGS replay --json --repeat 1 ${halves.trace_path}
      STDOUT "\"peak_live_bytes\": 18446744073709551615," STDERR "saturated")
  # A 6.9e18-byte block: 4x its peak would overflow, and no capacity the sim models holds
  # it, so no search runs and stderr says why.
  write_trace(vast.trace "${HEADER}" "a 1 6900000000000000000 0 0" "f 1 0 1")
  run(STATUS 1 ARGS replay --json --repeat 1 --min-capacity ${vast.trace_path}
      STDOUT "\"min_capacity_bytes\": null"
      STDERR "6900000000000000000 bytes.*largest capacity the sim models.*no capacity to search")
  run(STATUS 1 ARGS replay --repeat 1 --min-capacity ${vast.trace_path}
      STDERR "no capacity to search" NOT_STDOUT "> 4x live")

elseif(CASE STREQUAL "nothing_live")
  # No byte is ever live (no op, or allocations of 0 bytes): reserved over live, the
  # smallest capacity and its ratio over live are all figures of nothing, "-" and null
  # alike, never a capacity of 0 bytes and a ratio of 0.
  write_trace(header_only.trace "${HEADER}")
  write_trace(zero_size.trace "${HEADER}" "a 1 0 0 0" "f 1 0 1")
  foreach(name header_only zero_size)
    run(STATUS 0 ARGS replay --repeat 1 --min-capacity ${${name}.trace_path}
        STDOUT "cap/live\n${name} [^\n]* 0\\.0 MiB +- +[-0-9.]+ +0 +- +-\n"
        NOT_STDOUT "0\\.000")
    run(STATUS 0 ARGS replay --json --repeat 1 --min-capacity ${${name}.trace_path}
        STDOUT "\"reserved_over_live\": null" "\"min_capacity_bytes\": null"
               "\"min_capacity_over_live\": null"
        NOT_STDOUT "0\\.000")
    # The fragmentation table's vramkit column too.
    run(STATUS 0 ARGS replay --repeat 1 --compare ${${name}.trace_path}
        STDOUT "\n${name} +sim +0\\.0 MiB +[0-9.]+ MiB +- +- +-\n" NOT_STDOUT "0\\.000")
  endforeach()
  # Where something is live the figures stay.
  write_trace(one_block.trace "${HEADER}" "a 1 1048576 0 0" "f 1 0 1")
  run(STATUS 0 ARGS replay --json --repeat 1 --min-capacity ${one_block.trace_path}
      STDOUT "\"min_capacity_bytes\": [1-9][0-9]*, \"min_capacity_over_live\": [0-9.]+,")

elseif(CASE STREQUAL "reference_by_identity")
  # PyTorch's figures belong to the op sequence they were measured on, not to a file name:
  # a 2-op trace named after a shared trace gets none, and the table says none were
  # measured; the shared trace itself, under any name, gets its own.
  file(MAKE_DIRECTORY "${WORK}/fake")
  write_trace(fake/gpt2_train.trace "${HEADER}" "a 1 4096 0 0" "f 1 0 1")
  foreach(flag --compare --summary)
    run(STATUS 0 ARGS replay --source sim --repeat 1 ${flag} "${WORK}/fake/gpt2_train.trace"
        STDOUT "\ngpt2_train +sim [^\n]* +- +-\n"
               "PyTorch's figures: none were measured on these traces"
        NOT_STDOUT "1\\.124" "1\\.070" "for reference")
  endforeach()
  set(shared "${CMAKE_CURRENT_LIST_DIR}/../data/traces/gpt2_train.trace.gz")
  configure_file("${shared}" "${WORK}/renamed.trace.gz" COPYONLY)
  foreach(trace "${shared}" "${WORK}/renamed.trace.gz")
    run(STATUS 0 ARGS replay --source sim --repeat 1 --compare "${trace}"
        "${WORK}/fake/gpt2_train.trace"
        STDOUT "\n(gpt2_train|renamed) +sim [^\n]* 1\\.124 +1\\.070\n"
               "\ngpt2_train +sim [^\n]* +- +-\n" "PyTorch's figures, for reference: "
        NOT_STDOUT "none were measured")
  endforeach()
  # The random workload is recognised the same way: its figures stay while its op sequence
  # is the one measured. Every op under the full invariant checker (debug level 3) would
  # take minutes, so that build leaves it to the others.
  if(NOT DEBUG_LEVEL GREATER_EQUAL 3)
    run(STATUS 0 ARGS bench random --source sim
        STDOUT "reserved over live +[0-9.]+ +\\(PyTorch native 1\\.303, "
               "expandable 1\\.147\\)\n"
               "PyTorch's figures, for reference: ")
  endif()

elseif(CASE STREQUAL "cap_below_segment")
  # A capacity below one 2 MiB segment: the report blames the cap, not fragmentation.
  write_trace(tiny.trace "${HEADER}" "a 1 512 0 0" "f 1 0 1")
  run(STATUS 1 ARGS replay --repeat 1 --capacity 1M ${tiny.trace_path}
      STDERR "cause: granularity: the limit of 1\\.0 MiB is smaller than the smallest segment"
      NOT_STDERR "not in one piece")

elseif(CASE STREQUAL "preallocate_report")
  # A preallocation past the device: the pool is not made, and the report says why.
  set(ENV{VRAMKIT_PREALLOCATE} 100G)
  write_trace(one.trace "${HEADER}" "a 1 1048576 0 0" "f 1 0 1")
  run(STATUS 1 ARGS replay --repeat 1 ${one.trace_path}
      STDERR "out of memory creating the pool" "could not preallocate 100\\.00 GiB"
             "cause: preallocate: the preallocation of 100\\.0 GiB is more than the device's"
             "Lower VRAMKIT_PREALLOCATE")
  unset(ENV{VRAMKIT_PREALLOCATE})

elseif(CASE STREQUAL "bad_trace_corpus")
  # The corpus every trace reader must refuse alike (tests/data/bad_traces/make.py): exit
  # status 2 and a message naming the file, the line and the reason.
  set(corpus "${CMAKE_CURRENT_LIST_DIR}/../tests/data/bad_traces")
  file(STRINGS "${corpus}/expected.tsv" cases REGEX "^[^#]")
  foreach(entry IN LISTS cases)
    string(REPLACE "\t" ";" fields "${entry}")
    list(GET fields 0 name)
    list(GET fields 1 line)
    list(GET fields 2 pattern)
    run(STATUS 2 ARGS replay --repeat 1 "${corpus}/${name}" STDERR "${name}:${line}: " "${pattern}"
        NOT_STDOUT "ops")
  endforeach()

elseif(CASE STREQUAL "max_ops")
  # A trace is held in memory for the timed loop: past --max-ops it is refused, naming the
  # limit and the flag, rather than growing without bound.
  write_trace(four.trace "${HEADER}" "a 0 512 0 1" "f 0 0 2" "a 1 512 0 3" "f 1 0 4")
  run(STATUS 2 ARGS replay --repeat 1 --max-ops 3 "${four.trace_path}"
      STDERR "four\\.trace:5: the trace has more than 3 ops" "--max-ops N raises the limit")
  run(STATUS 0 ARGS replay --repeat 1 --max-ops 4 "${four.trace_path}" STDOUT "four +sim +4 ")
  run(STATUS 0 ARGS replay --repeat 1 --max-ops 0 "${four.trace_path}" STDOUT "four +sim +4 ")
  run(STATUS 3 ARGS replay --max-ops lots "${four.trace_path}" STDERR "--max-ops")
  run(STATUS 0 ARGS replay --help STDOUT "--max-ops N")

elseif(CASE STREQUAL "many_streams")
  # Thousands of streams, every op on another: each is found through a hash table, in the
  # loader and in the pool, so this completes; the counts say every op was replayed. Where
  # every op runs the full invariant checker (debug level 3), which walks the whole pool,
  # a tenth of them.
  set(streams 6000)
  if(DEBUG_LEVEL GREATER_EQUAL 3)
    set(streams 600)
  endif()
  set(lines "${HEADER}")
  foreach(s RANGE 1 ${streams})
    list(APPEND lines "a ${s} 4096 ${s} ${s}")
  endforeach()
  foreach(s RANGE 1 ${streams})
    list(APPEND lines "f ${s} ${s} ${s}")
  endforeach()
  write_trace(streams.trace ${lines})
  math(EXPR ops "2 * ${streams}")
  math(EXPR live "4096 * ${streams}")
  run(STATUS 0 ARGS replay --repeat 1 --json "${streams.trace_path}"
      STDOUT "\"ops\": ${ops}," "\"peak_live_bytes\": ${live}," "\"ooms\": 0,"
             "\"skipped_frees\": 0,")

elseif(CASE STREQUAL "exit_status_help")
  # Every help text documents the exit statuses that the cases above check.
  foreach(command "--help" "replay;--help" "bench;--help" "bench;pair;--help")
    run(STATUS 0 ARGS ${command}
        STDOUT "Exit status:" "1  out of memory" "2  bad input file" "3  bad command line"
               "4  failure" "5  missing optional package")
  endforeach()
  run(STATUS 3 ARGS no-such-command STDERR "unknown command 'no-such-command'")
  # --version and --help take nothing after them: anything there is refused as any other
  # command's unexpected argument is, not passed over with a success.
  run(STATUS 0 ARGS --version STDOUT "^vramkit [0-9]")
  foreach(command "--version;extra" "--version;--bogus" "version;extra" "--help;extra"
                  "-h;--bogus")
    list(GET command 0 word)
    list(GET command 1 extra)
    run(STATUS 3 ARGS ${command}
        STDERR "^vramkit ${word}: unknown argument '${extra}' \\(see vramkit --help\\)\n$"
        NOT_STDOUT "vramkit")
  endforeach()
  run(STATUS 3 ARGS replay --no-such-option x STDERR "unknown option '--no-such-option'")
  run(STATUS 2 ARGS replay "${WORK}/does-not-exist.trace" STDERR "does-not-exist\\.trace: cannot open")

else()
  message(FATAL_ERROR "unknown case '${CASE}'")
endif()

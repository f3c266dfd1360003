# check_real_step_reserved.cmake - on real training steps recorded on the card under
# vramkit, the default pool holds no more than PyTorch's expandable segments held on the
# same step: `vramkit replay --source S` (S = sim and sim:vmm, far from any cap) must report
# peak reserved over peak live of at most expandable segments' figure there.
# - RoBERTa-base, fp16 autocast, four micro-batches accumulated: 1.080. Its fp32 logits'
#   gradient is the request that once mapped a span the allowance had unmapped, beside an
#   idle end of the range (docs/performance.md, Note [Whole mappings past a ghost]).
# - A diffusion-style UNet, fp16 autocast, Adafactor, every second block checkpointed:
#   1.067. A pool of about a gigabyte whose slack once doubled on two trims of a few MiB
#   during its first step, and held 1.107 (Note [The kept regime's allowance]).
# Usage: cmake -DTOOL=path/to/vramkit -DRECORDINGS=data/recordings -P check_real_step_reserved.cmake
if(NOT TOOL OR NOT RECORDINGS)
  message(FATAL_ERROR "usage: cmake -DTOOL=... -DRECORDINGS=... -P check_real_step_reserved.cmake")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/replay_tool.cmake)
# recording, then expandable segments' peak reserved over live, in thousandths.
set(steps roberta_accumulate4 1080 unet_fp16_ckpt_some 1067)
list(LENGTH steps n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET steps ${i} name)
  list(GET steps ${j} bound)
  foreach(source sim sim:vmm)
    vk_replay(out ENV --unset=VRAMKIT_LARGE_BLOCKS --unset=VRAMKIT_VIRTUAL_THRESHOLD
                  ARGS --source ${source} --repeat 1 --json ${RECORDINGS}/${name}.trace.gz)
    vk_ratio_at_most("${out}" ${bound} "${name} on ${source} (expandable segments' figure)")
  endforeach()
endforeach()
message(STATUS "the recorded real steps hold no more than expandable segments")

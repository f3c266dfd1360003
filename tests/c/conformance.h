/* conformance.h - what the files of the conformance suite share: the source under test,
 * the helpers that make and check pools, and the tests of each topic file, which
 * test_conformance.c lists and runs. */
#ifndef VT_CONFORMANCE_H
#define VT_CONFORMANCE_H

#include "vt.h"

/* The source under test (argv[1] or $VRAMKIT_TEST_SOURCE). */
extern vt_source g_src;

/* ---- helpers (test_conformance.c) */
void conf_opts(vram_options_t *o);
vram_pool_t *conf_pool(const vram_options_t *o);
void conf_force(vram_pool_t *pool);
vram_pool_t *conf_pool_default(void);
void need_sim(void);
vram_pool_t *conf_pool_events(int event_delay, size_t limit_bytes);
void *conf_malloc(vram_pool_t *pool, size_t size, vram_stream_t stream);
void conf_free(vram_pool_t *pool, void *p);
void conf_destroy(vram_pool_t *pool);
void expect_info(vram_pool_t *pool, void *p, size_t req, vram_stream_t stream);

/* ---- conformance_blocks.c */
void t_round_trip(void **state);
void t_alignment(void **state);
void t_size_zero(void **state);
void t_stats_exact(void **state);
void t_reset_peak(void **state);
void t_reuse_same_stream(void **state);
void t_coalesce(void **state);
void t_coalesce_largest_free_block(void **state);
void t_empty_cache(void **state);

/* ---- conformance_limits.c */
void t_preallocate(void **state);
void t_preallocate_fraction(void **state);
void t_preallocate_at_limit(void **state);
void t_hard_limit(void **state);
void t_capacity_and_ladder(void **state);
void t_set_limit_runtime(void **state);
void t_limit_fraction(void **state);

/* ---- conformance_streams.c */
void t_record_stream_waits(void **state);
void t_active_peak_pending(void **state);
void t_pending_drained(void **state);
void t_other_stream_no_early_reuse(void **state);
void t_release_threshold_zero(void **state);
void t_borrow_preallocated(void **state);
void t_borrow_under_limit(void **state);
void t_preallocated_with_room_grows(void **state);

/* ---- conformance_api.c */
void t_block_info(void **state);
void t_for_each_block(void **state);
void t_summary_and_json(void **state);
void t_destroy_busy(void **state);
void t_mem_info(void **state);
void t_devices(void **state);
void t_snapshot_tiles(void **state);

#endif /* VT_CONFORMANCE_H */

// torch_backend_stats.hpp - the engine's statistics as c10's DeviceStats, for
// torch_backend.cpp (included there, inside its namespace): the rows PyTorch's caching
// allocator keeps (all, small_pool, large_pool), summed over a device's pools, less what
// resetAccumulatedStats set aside. vramkit's small segments (requests up to 1 MiB) are
// PyTorch's small pool, as its own <= 1 MiB rule makes them.
//
// inactive_split is read from the layout at the call (vram_get_split_stats), so it has no
// allocated/freed totals; oversize rows stay 0 and max_split_size is PyTorch's "no limit"
// (-1 as its signed figure): vramkit splits blocks of any size.

// The sums of a device's pools: totals (vram_stats_t) and the two kinds apart.
struct PoolSums {
  vram_stats_t all{};
  vram_split_stats_t split{};
};

// The stats of DeviceStats that carry totals, in one order for every row, and the
// allocator-wide bases that resetAccumulatedStats moves.
constexpr int kTotalledStats = 7;
constexpr int kStatRows = 3;  // c10's StatType: AGGREGATE, SMALL_POOL, LARGE_POOL

struct AccumulatedBase {
  int64_t allocated[kStatRows][kTotalledStats] = {}, freed[kStatRows][kTotalledStats] = {};
  int64_t retries = 0, ooms = 0, device_alloc = 0, device_free = 0, syncs = 0;
};

inline void add_stat(vram_stat_t *sum, const vram_stat_t &s) {
  sum->current += s.current;
  sum->peak += s.peak;
  sum->total += s.total;
}

inline void add_pool_sums(PoolSums *sum, const vram_stats_t &s, const vram_split_stats_t &k) {
#define VRAMKIT_ADD_STAT(name, doc)      \
  add_stat(&sum->all.name, s.name);      \
  add_stat(&sum->split.small.name, k.small.name); \
  add_stat(&sum->split.large.name, k.large.name);
  VRAM_STAT_LIST(VRAMKIT_ADD_STAT)
#undef VRAMKIT_ADD_STAT
#define VRAMKIT_ADD_COUNTER(name, doc) sum->all.name += s.name;
  VRAM_COUNTER_LIST(VRAMKIT_ADD_COUNTER)
#undef VRAMKIT_ADD_COUNTER
  for (auto *kind : {&sum->split.small, &sum->split.large}) {
    const vram_kind_stats_t &from = kind == &sum->split.small ? k.small : k.large;
    add_stat(&kind->inactive_split, from.inactive_split);
    add_stat(&kind->inactive_split_bytes, from.inactive_split_bytes);
  }
  sum->split.num_sync_all_streams += k.num_sync_all_streams;
}

// The seven totalled stats of one row of the sums, in DeviceStats order below.
inline std::array<const vram_stat_t *, kTotalledStats> row_sources(const PoolSums &s, int row) {
  if (row == 0)
    return {&s.all.allocated_bytes, &s.all.requested_bytes, &s.all.reserved_bytes,
            &s.all.active_bytes,    &s.all.allocation,      &s.all.segment,
            &s.all.active};
  const vram_kind_stats_t &k = row == 1 ? s.split.small : s.split.large;
  return {&k.allocated_bytes, &k.requested_bytes, &k.reserved_bytes, &k.active_bytes,
          &k.allocation,      &k.segment,         &k.active};
}

inline std::array<c10::CachingAllocator::Stat *, kTotalledStats> row_targets(DeviceStats &out,
                                                                            int row) {
  return {&out.allocated_bytes[row], &out.requested_bytes[row], &out.reserved_bytes[row],
          &out.active_bytes[row],    &out.allocation[row],      &out.segment[row],
          &out.active[row]};
}

// DeviceStats from the sums, less the bases.
inline DeviceStats device_stats(const PoolSums &s, const AccumulatedBase &base) {
  DeviceStats out;
  for (int row = 0; row < kStatRows; row++) {
    auto sources = row_sources(s, row);
    auto targets = row_targets(out, row);
    for (int i = 0; i < kTotalledStats; i++) {
      targets[i]->current = sources[i]->current;
      targets[i]->peak = sources[i]->peak;
      targets[i]->allocated = sources[i]->total - base.allocated[row][i];
      targets[i]->freed = (sources[i]->total - sources[i]->current) - base.freed[row][i];
    }
  }
  const vram_kind_stats_t *kinds[2] = {&s.split.small, &s.split.large};
  for (int row = 1; row < kStatRows; row++) {
    out.inactive_split[row].current = out.inactive_split[row].peak =
        kinds[row - 1]->inactive_split.current;
    out.inactive_split_bytes[row].current = out.inactive_split_bytes[row].peak =
        kinds[row - 1]->inactive_split_bytes.current;
    out.inactive_split[0].current += out.inactive_split[row].current;
    out.inactive_split_bytes[0].current += out.inactive_split_bytes[row].current;
  }
  out.inactive_split[0].peak = out.inactive_split[0].current;
  out.inactive_split_bytes[0].peak = out.inactive_split_bytes[0].current;
  out.num_alloc_retries = static_cast<int64_t>(s.all.num_alloc_retries) - base.retries;
  out.num_ooms = static_cast<int64_t>(s.all.num_ooms) - base.ooms;
  out.num_device_alloc = static_cast<int64_t>(s.all.num_device_alloc) - base.device_alloc;
  out.num_device_free = static_cast<int64_t>(s.all.num_device_free) - base.device_free;
  out.num_sync_all_streams = static_cast<int64_t>(s.split.num_sync_all_streams) - base.syncs;
  out.max_split_size = -1;
  return out;
}

// resetAccumulatedStats: what is reported now becomes the zero of the totals.
inline void move_bases(AccumulatedBase *base, DeviceStats &now) {
  for (int row = 0; row < kStatRows; row++) {
    auto stats = row_targets(now, row);
    for (int i = 0; i < kTotalledStats; i++) {
      base->allocated[row][i] += stats[i]->allocated;
      base->freed[row][i] += stats[i]->freed;
    }
  }
  base->retries += now.num_alloc_retries;
  base->ooms += now.num_ooms;
  base->device_alloc += now.num_device_alloc;
  base->device_free += now.num_device_free;
  base->syncs += now.num_sync_all_streams;
}

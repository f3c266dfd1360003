// torch_backend_history.hpp - memory history and snapshots for torch_backend.cpp (included
// there, after the class Backend, inside its namespace): PyTorch's _record_memory_history
// and _snapshot answered from the engine's event rings and block layouts, with PyTorch's
// context objects (its captured stacks) kept here by the context ids the engine stores, with
// the compiled region and the user metadata of each call, and one 'snapshot' entry per device
// for each _snapshot() taken while history records (in the traces of the snapshots after it).

inline cca::SnapshotInfo Backend::snapshot(MempoolId_t id, bool include_traces) {
  cca::SnapshotInfo info;
  std::vector<std::pair<vram_pool_t *, std::pair<c10::DeviceIndex, MempoolId_t>>> pools;
  std::lock_guard<std::mutex> g(mutex_);  // held throughout: no pool goes meanwhile
  if (id == MempoolId_t{0, 0})
    for (int d = 0; d < kMaxDevices; d++)
      if (vram_pool_t *pool = used_[d].load())
        pools.push_back({pool, {static_cast<c10::DeviceIndex>(d), MempoolId_t{0, 0}}});
  for (auto &entry : private_pools_)
    if (id == MempoolId_t{0, 0} || entry.second->id == id)
      pools.push_back({entry.second->pool, {entry.second->device, entry.second->id}});
  std::vector<std::vector<TraceEntry>> traces;
  for (auto &p : pools) append_segments(p.first, p.second.first, p.second.second, &info.segments);
  for (auto &p : pools)
    if (include_traces && trace_wanted_.load())
      append_trace(p.first, p.second.first, p.second.second, &traces);
  if (include_traces && trace_wanted_.load()) append_snapshot_marks(&traces);
  // One trace per device, empty where nothing is recorded (context="state" records none),
  // as PyTorch's snapshots have: tools index device_traces by device.
  size_t devices = std::max<size_t>(traces.size(), c10::cuda::device_count());
  for (int d = 0; d < kMaxDevices; d++)
    if (used_[d].load()) devices = std::max<size_t>(devices, d + 1);
  traces.resize(devices);
  // This call's own 'snapshot' entry goes in after its traces were read, as PyTorch's
  // allocator records it: the trace returned ends with the last thing done before it.
  note_snapshot(info.segments);
  for (auto &device_trace : traces)
    std::stable_sort(device_trace.begin(), device_trace.end(),
                     [](const TraceEntry &a, const TraceEntry &b) {
                       return a.time_.t_ < b.time_.t_;
                     });
  info.device_traces = std::move(traces);
  info.config_metadata.garbage_collection_threshold = 0.0;
  info.config_metadata.max_split_size = SIZE_MAX;
  info.config_metadata.expandable_segments = false;
  info.config_metadata.last_allocator_settings = "vramkit";
  return info;
}

// A name from the caller, as an error message shows it: escaped as every report of the
// engine shows foreign text, its first 80 bytes.
inline std::string shown_name(const std::string &name) {
  const size_t len = std::min<size_t>(name.size(), 80);
  std::string out(4 * len + 1, '\0');
  out.resize(vram_escape_text(&out[0], out.size(), name.data(), len));
  return name.size() > len ? out + "..." : out;
}

// The actions _record_memory_history(skip_actions=...) may name, by PyTorch's names.
inline std::set<TraceEntry::Action> parse_skip_actions(const std::vector<std::string> &names) {
  static const std::pair<const char *, TraceEntry::Action> kNames[] = {
      {"alloc", TraceEntry::ALLOC},
      {"free_requested", TraceEntry::FREE_REQUESTED},
      {"free_completed", TraceEntry::FREE_COMPLETED},
      {"segment_alloc", TraceEntry::SEGMENT_ALLOC},
      {"segment_free", TraceEntry::SEGMENT_FREE},
      {"segment_map", TraceEntry::SEGMENT_MAP},
      {"segment_unmap", TraceEntry::SEGMENT_UNMAP},
      {"snapshot", TraceEntry::SNAPSHOT},
      {"oom", TraceEntry::OOM}};
  std::set<TraceEntry::Action> skipped;
  for (const std::string &name : names) {
    const auto *known = std::find_if(std::begin(kNames), std::end(kNames),
                                     [&](const auto &k) { return name == k.first; });
    TORCH_CHECK(known != std::end(kNames), "vramkit: skip_actions: unknown action '",
                shown_name(name),
                "'; known: alloc, free_requested, free_completed, segment_alloc, segment_free, "
                "segment_map, segment_unmap, snapshot, oom");
    skipped.insert(known->second);
  }
  return skipped;
}

inline void Backend::recordHistory(bool enabled, cca::CreateContextFn recorder,
                                   size_t max_entries, RecordContext when, bool clear,
                                   const std::vector<std::string> &skip_actions) {
  // A name PyTorch does not know is refused before anything changes.
  std::set<TraceEntry::Action> skipped = parse_skip_actions(skip_actions);
  std::lock_guard<std::mutex> g(mutex_);
  std::lock_guard<std::mutex> h(history_mutex_);
  // A call while recording changes what is recorded from then on and keeps what was
  // recorded, as PyTorch's allocator does (its history goes when recording stops or
  // clear_history asks); vramkit's rings keep theirs until the next fresh start.
  bool keep = enabled && recording_ && !clear;
  recording_ = enabled;
  recorder_ = enabled && when != RecordContext::NEVER ? recorder : nullptr;
  skipped_actions_ = std::move(skipped);
  // Every allocation asks for a context while recording, stack or not: its entries carry
  // the compiled region and the user metadata of the moment. context="all": each free's
  // entries carry the stack that freed, as PyTorch's do.
  history_flags_ = (enabled ? VRAM_HISTORY_CONTEXTS : 0u) |
                   (recorder_ && when == RecordContext::ALL ? VRAM_HISTORY_FREE_CONTEXTS : 0u) |
                   (keep ? VRAM_HISTORY_KEEP : 0u);
  // PyTorch's default asks for every event (max_entries = sys.maxsize), its trace growing
  // as it goes; the engine's ring is reserved at the start (its pages touched only as it
  // fills), so "every event" keeps the newest kHistoryAll.
  max_entries_ = std::min(max_entries, kHistoryAll);
  trace_wanted_.store(enabled && when != RecordContext::STATE);
  if (clear || (enabled && !keep)) {
    contexts_.clear();
    snapshot_marks_.clear();
  }
  int failed = VRAM_OK;
  std::vector<vram_pool_t *> pools = all_pools_locked();
  for (vram_pool_t *pool : pools) {
    int rc = start_or_stop_history(pool);
    if (rc != VRAM_OK) failed = rc;
  }
  if (failed != VRAM_OK && enabled) {
    // A recording that could not start on every pool is no recording: the pools that did
    // start stop again, and the caller is told, rather than left with a partial history.
    recording_ = false;
    recorder_ = nullptr;
    trace_wanted_.store(false);
    for (vram_pool_t *pool : pools) start_or_stop_history(pool);
  }
  vram_set_context_fn(recording_ ? &context_of_this_allocation : nullptr, this);
  TORCH_CHECK(failed == VRAM_OK, "vramkit: cannot record memory history of ", max_entries_,
              " entries: ", vram_strerror(failed));
}

inline bool Backend::isHistoryEnabled() {
  std::lock_guard<std::mutex> g(history_mutex_);
  return recording_;
}

// PyTorch enters a region at each call of a torch.compile'd graph while
// _record_memory_history(compile_context=True) records; the allocations inside name it.
// As PyTorch's allocator, a region entered while nothing records is not kept.
inline void Backend::pushCompileContext(std::string &region) {
  constexpr size_t kDeepest = 1024;  // regions nest a few deep; more is a leak of pushes
  std::lock_guard<std::mutex> h(history_mutex_);
  if (recording_ && compile_regions_.size() < kDeepest) compile_regions_.push_back(region);
}

inline void Backend::popCompileContext() {
  std::lock_guard<std::mutex> h(history_mutex_);
  if (!compile_regions_.empty()) compile_regions_.pop_back();
}

inline void Backend::setUserMetadata(const std::string &metadata) {
  std::lock_guard<std::mutex> h(history_mutex_);
  user_metadata_ = metadata;
}

inline std::string Backend::getUserMetadata() {
  std::lock_guard<std::mutex> h(history_mutex_);
  return user_metadata_;
}

// Called by the engine at each allocation while contexts are recorded (and at each free
// under context="all"), outside its lock.
inline uint64_t Backend::context_of_this_allocation(void *user) {
  auto *self = static_cast<Backend *>(user);
  cca::CreateContextFn recorder;
  CallContext call;
  {
    std::lock_guard<std::mutex> g(self->history_mutex_);
    recorder = self->recorder_;
    call.compile_context =
        self->compile_regions_.empty() ? kNoCompileContext : self->compile_regions_.back();
    call.user_metadata = self->user_metadata_;
  }
  if (!recorder && call.compile_context == kNoCompileContext && call.user_metadata.empty())
    return 0;  // nothing to say beyond what an entry without a context says
  if (recorder) call.frames = recorder();
  uint64_t id;
  bool crowded;
  {
    std::lock_guard<std::mutex> g(self->history_mutex_);
    id = ++self->next_context_;
    self->contexts_[id] = std::move(call);
    crowded = self->contexts_.size() > 2 * self->max_entries_ + 65536;
  }
  if (crowded) self->prune_contexts(id);
  return id;
}

// Keep the contexts that the rings, the live blocks and the segments still name (and the
// one just made, not yet in any ring). Run with no lock held: it reads every pool.
inline void Backend::prune_contexts(uint64_t newest) {
  std::unordered_set<uint64_t> named{newest};
  std::lock_guard<std::mutex> g(mutex_);
  for (vram_pool_t *pool : all_pools_locked()) {
    for (auto &e : read_history(pool)) named.insert(e.context);
    std::vector<vram_snapshot_segment_t> segments;
    std::vector<vram_snapshot_block_t> blocks;
    read_layout(pool, &segments, &blocks);
    for (auto &s : segments) named.insert(s.context);
    for (auto &b : blocks) named.insert(b.context);
  }
  std::lock_guard<std::mutex> h(history_mutex_);
  for (auto it = contexts_.begin(); it != contexts_.end();)
    it = named.count(it->first) || it->first > newest ? std::next(it) : contexts_.erase(it);
}

inline int Backend::start_or_stop_history(vram_pool_t *pool) {
  if (recording_) return vram_history_start(pool, max_entries_, history_flags_);
  return vram_history_stop(pool);
}

inline std::shared_ptr<c10::GatheredContext> Backend::context(uint64_t id) {
  if (!id) return nullptr;
  std::lock_guard<std::mutex> g(history_mutex_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second.frames;
}

inline CallContext Backend::call_context(uint64_t id) {
  if (id) {
    std::lock_guard<std::mutex> g(history_mutex_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) return it->second;
  }
  return CallContext{nullptr, kNoCompileContext, ""};
}

inline std::vector<vram_event_t> Backend::read_history(vram_pool_t *pool) {
  size_t total = 0;
  if (vram_history_read(pool, nullptr, 0, nullptr, &total, nullptr) != VRAM_OK) return {};
  std::vector<vram_event_t> events(total + 1024);  // room for events recorded meanwhile
  size_t count = 0;
  vram_history_read(pool, events.data(), events.size(), &count, &total, nullptr);
  events.resize(count);
  return events;
}

inline void Backend::read_layout(vram_pool_t *pool, std::vector<vram_snapshot_segment_t> *segments,
                                 std::vector<vram_snapshot_block_t> *blocks) {
  for (;;) {
    size_t n_segments = 0, n_blocks = 0;
    if (vram_snapshot(pool, segments->data(), segments->size(), &n_segments, blocks->data(),
                      blocks->size(), &n_blocks) != VRAM_OK)
      return;
    if (n_segments <= segments->size() && n_blocks <= blocks->size()) {
      segments->resize(n_segments);
      blocks->resize(n_blocks);
      return;
    }
    segments->resize(n_segments + 16);
    blocks->resize(n_blocks + 256);
  }
}

inline void Backend::append_segments(vram_pool_t *pool, c10::DeviceIndex device, MempoolId_t owner,
                                     std::vector<SegmentInfo> *out) {
  std::vector<vram_snapshot_segment_t> segments;
  std::vector<vram_snapshot_block_t> blocks;
  read_layout(pool, &segments, &blocks);
  for (auto &s : segments) {
    SegmentInfo seg;
    seg.device = device;
    seg.address = s.addr;
    seg.total_size = s.size;
    seg.stream = reinterpret_cast<void *>(s.stream);
    seg.is_large = s.size != (size_t{2} << 20);  // the engine's small segments are 2 MiB
    seg.is_expandable = s.is_expandable != 0;
    seg.owner_private_pool_id = owner;
    seg.context_when_allocated = context(s.context);
    for (uint64_t i = s.first_block; i < s.first_block + s.n_blocks; i++) {
      const vram_snapshot_block_t &b = blocks[i];
      BlockInfo block;
      block.size = b.size;
      block.requested_size = b.requested;
      block.allocated = b.state == VRAM_SNAPSHOT_ACTIVE_ALLOCATED;
      block.active = b.state != VRAM_SNAPSHOT_INACTIVE;
      block.context_when_allocated = context(b.context);
      if (block.allocated) seg.allocated_size += b.size;
      if (block.active) seg.active_size += b.size;
      seg.requested_size += b.requested;
      seg.blocks.push_back(std::move(block));
    }
    out->push_back(std::move(seg));
  }
}

// A _snapshot() while history records: one 'snapshot' entry per device it described,
// sized by the device's active bytes, as PyTorch's allocator records each call.
inline void Backend::note_snapshot(const std::vector<SegmentInfo> &segments) {
  std::map<c10::DeviceIndex, size_t> active;
  for (auto &seg : segments) active[static_cast<c10::DeviceIndex>(seg.device)] += seg.active_size;
  std::lock_guard<std::mutex> h(history_mutex_);
  if (!recording_) return;
  for (auto &a : active) {
    auto &marks = snapshot_marks_[a.first];
    marks.push_back({unix_us(), a.second, user_metadata_});
    if (max_entries_ && marks.size() > max_entries_) marks.erase(marks.begin());
  }
}

inline void Backend::append_snapshot_marks(std::vector<std::vector<TraceEntry>> *out) {
  std::lock_guard<std::mutex> h(history_mutex_);
  if (skipped_actions_.count(TraceEntry::SNAPSHOT)) return;
  for (auto &d : snapshot_marks_) {
    if (out->size() <= static_cast<size_t>(d.first)) out->resize(d.first + 1);
    for (auto &m : d.second) {
      TraceEntry entry(TraceEntry::SNAPSHOT, d.first, 0, m.active, nullptr, MempoolId_t{0, 0},
                       0, nullptr, kNoCompileContext, m.user_metadata);
      entry.time_.t_ = static_cast<time_t>(m.time_us);
      (*out)[d.first].push_back(std::move(entry));
    }
  }
}

inline void Backend::append_trace(vram_pool_t *pool, c10::DeviceIndex device, MempoolId_t owner,
                                  std::vector<std::vector<TraceEntry>> *out) {
  // The engine stamps CLOCK_MONOTONIC microseconds; PyTorch's files carry Unix ones.
  int64_t offset = static_cast<int64_t>(unix_us()) -
                   std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
  if (out->size() <= static_cast<size_t>(device)) out->resize(device + 1);
  std::set<TraceEntry::Action> skipped;
  {
    std::lock_guard<std::mutex> h(history_mutex_);
    skipped = skipped_actions_;
  }
  for (auto &e : read_history(pool)) {
    TraceEntry::Action action;
    switch (e.kind) {
      case VRAM_EVENT_ALLOC: action = TraceEntry::ALLOC; break;
      case VRAM_EVENT_FREE_REQUESTED: action = TraceEntry::FREE_REQUESTED; break;
      case VRAM_EVENT_FREE_COMPLETED: action = TraceEntry::FREE_COMPLETED; break;
      case VRAM_EVENT_SEGMENT_ALLOC: action = TraceEntry::SEGMENT_ALLOC; break;
      case VRAM_EVENT_SEGMENT_FREE: action = TraceEntry::SEGMENT_FREE; break;
      case VRAM_EVENT_SEGMENT_MAP: action = TraceEntry::SEGMENT_MAP; break;
      case VRAM_EVENT_SEGMENT_UNMAP: action = TraceEntry::SEGMENT_UNMAP; break;
      case VRAM_EVENT_OOM: action = TraceEntry::OOM; break;
      // The engine notes every layout read (pruning, vramkit's own tools, one per pool);
      // PyTorch one per device and _snapshot() call: those are snapshot_marks_.
      default: continue;  // nor have empty_cache and annotations a PyTorch action
    }
    // Left out as they are read: the engine's ring keeps every kind, so skipping saves the
    // entries' conversion here, not ring slots.
    if (skipped.count(action)) continue;
    // A block's entries carry the size asked for, as PyTorch's do; a segment's its size.
    bool of_block = action == TraceEntry::ALLOC || action == TraceEntry::FREE_REQUESTED ||
                    action == TraceEntry::FREE_COMPLETED;
    size_t size = of_block && e.requested ? e.requested : e.size;
    CallContext call = call_context(e.context);
    TraceEntry entry(action, device, e.addr, size, reinterpret_cast<void *>(e.stream), owner,
                     0, std::move(call.frames), std::move(call.compile_context),
                     std::move(call.user_metadata));
    entry.time_.t_ = static_cast<time_t>(static_cast<int64_t>(e.time_us) + offset);
    (*out)[device].push_back(std::move(entry));
  }
}

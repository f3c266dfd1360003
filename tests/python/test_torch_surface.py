"""PyTorch's view of vramkit, without a GPU: the statistics keys and pool rows PyTorch
2.11's caching allocator reports (vramkit.memory_stats() and, through the backend,
torch.cuda.memory_stats()), its out-of-memory sentences, its allocator settings and its
memory history, each as PyTorch's own code or users read them (issue 37). What needs the
card runs in tests/gpu/test_torch_backend.py and bench/torch_suite.sh.
"""

import warnings

import pytest

import vramkit
from helpers import KiB, MiB, run_python

STAT_NAMES = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split",
              "inactive_split_bytes", "requested_bytes", "allocation", "segment", "active")
FIELDS = ("current", "peak", "allocated", "freed")
# The keys torch.cuda.memory_stats() has under PyTorch 2.11's caching allocator: its
# DeviceStats struct flattened by torch.cuda.memory_stats (read from c10's header).
PYTORCH_KEYS = (
    [f"{s}.{p}.{f}" for s in STAT_NAMES for p in ("all", "small_pool", "large_pool")
     for f in FIELDS]
    + [f"{s}.{f}" for s in ("oversize_allocations", "oversize_segments") for f in FIELDS]
    + ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
       "num_device_free", "max_split_size"])


def test_memory_stats_has_every_key_pytorch_reports():
    stats = vramkit.memory_stats(6)
    missing = [k for k in PYTORCH_KEYS if k not in stats]
    assert not missing, missing
    assert stats["max_split_size"] == -1  # PyTorch's "no limit"
    assert stats["oversize_allocations.current"] == 0


def test_small_and_large_pool_rows_split_as_pytorch_does():
    run_python(f"""
        import vramkit
        small = vramkit.empty(1000, device=0)        # up to 1 MiB: a small segment
        large = vramkit.empty(3 * {MiB}, device=0)   # the rest
        s = vramkit.memory_stats(0)
        assert s["allocated_bytes.small_pool.current"] == 1024, s
        assert s["allocated_bytes.large_pool.current"] == 3 * {MiB}, s
        assert s["requested_bytes.small_pool.current"] == 1000
        assert s["allocation.small_pool.current"] == 1 == s["allocation.large_pool.current"]
        assert s["segment.small_pool.current"] == 1
        assert s["reserved_bytes.small_pool.current"] == 2 * {MiB}
        for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "segment",
                     "requested_bytes", "allocation", "active"):
            for field in ("current", "peak", "allocated", "freed"):
                parts = s[f"{{name}}.small_pool.{{field}}"] + s[f"{{name}}.large_pool.{{field}}"]
                assert s[f"{{name}}.all.{{field}}"] == parts, (name, field, s)
        # The rest of the small segment is free beside a live block: not releasable.
        assert s["inactive_split.small_pool.current"] == 1
        assert s["inactive_split_bytes.small_pool.current"] == 2 * {MiB} - 1024
        assert s["inactive_split_bytes.large_pool.current"] == (
            s["reserved_bytes.large_pool.current"] - 3 * {MiB})
        assert s["inactive_split_bytes.all.current"] == (
            s["inactive_split_bytes.small_pool.current"]
            + s["inactive_split_bytes.large_pool.current"])
        del small
        s = vramkit.memory_stats(0)
        assert s["allocated_bytes.small_pool.current"] == 0
        assert s["allocated_bytes.small_pool.peak"] == 1024
        assert s["allocated_bytes.small_pool.freed"] == 1024
        assert s["inactive_split.small_pool.current"] == 0  # wholly free: releasable
        vramkit.reset_peak_memory_stats(0)
        assert vramkit.memory_stats(0)["allocated_bytes.small_pool.peak"] == 0
        vramkit.empty_cache(0)
        s = vramkit.memory_stats(0)
        assert s["reserved_bytes.small_pool.current"] == 0 == s["segment.small_pool.current"]
        assert s["num_sync_all_streams"] >= 1
        del large
    """)


def test_allocator_settings_map_warn_or_refuse():
    from vramkit.plug import torch_settings

    with pytest.warns(RuntimeWarning) as caught:
        options = torch_settings.map_settings(
            "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4,"
            "garbage_collection_threshold:0.6,release_lock_on_cudamalloc:True,"
            "pinned_use_cuda_host_register:True,backend:native,"
            "per_process_memory_fraction:0.5,no_such_key:1")
    assert options == {"large_blocks": "virtual", "limit": 0.5,
                       torch_settings.TORCH_FRACTION: 0.5}
    # 0 is PyTorch's "nothing may be allocated": a one-byte limit (a limit of 0 is none
    # to vramkit), and get_per_process_memory_fraction() answers 0.0.
    assert torch_settings.map_settings("per_process_memory_fraction:0") == {
        "limit": 1, torch_settings.TORCH_FRACTION: 0.0}
    said = " ".join(str(w.message) for w in caught)
    # Every key without an equivalent is named, with what vramkit does instead.
    for key, equivalent in (("max_split_size_mb", "tight_threshold"),
                            ("roundup_power2_divisions", "512 bytes"),
                            ("garbage_collection_threshold", "release_threshold"),
                            ("release_lock_on_cudamalloc", "lock"),
                            ("no_such_key", "not a setting")):
        assert key in said and equivalent in said, key
    assert "pinned_use_cuda_host_register" not in said  # PyTorch's host allocator serves it
    assert torch_settings.map_settings("expandable_segments:False") == {"large_blocks": "fixed"}
    with pytest.raises(torch_settings.SettingsError, match="cudaMallocAsync"):
        torch_settings.map_settings("backend:cudaMallocAsync")


def test_allocator_settings_split_as_pytorch_splits_them():
    from vramkit.plug import torch_settings

    # A bracketed list is one value: its commas do not start new keys, and whitespace
    # between tokens is ignored, as PyTorch's own parser does.
    with pytest.warns(RuntimeWarning) as caught:
        options = torch_settings.map_settings(
            "roundup_power2_divisions:[256:1,512:2,>:8], expandable_segments : True")
    assert options == {"large_blocks": "virtual"}
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "roundup_power2_divisions:[256:1,512:2,>:8] has no effect" in said[0]
    assert torch_settings.map_settings(",, ,") == {}


@pytest.mark.parametrize("conf, why", [
    ("per_process_memory_fraction:abc", "per_process_memory_fraction is invalid"),
    ("per_process_memory_fraction:1.1", "per_process_memory_fraction is invalid"),
    ("per_process_memory_fraction:-0.1", "per_process_memory_fraction is invalid"),
    ("per_process_memory_fraction:nan", "from 0 to 1"),
    ("expandable_segments:1", "True or False"),
    ("expandable_segments", "True or False"),
    ("backend:cudaMallocAsyn", "native or cudaMallocAsync"),
    ("graph_capture_record_stream_reuse:1", "True or False"),
    ("roundup_power2_divisions:[256:1,512:2,expandable_segments:True", "without its ']'"),
    ("roundup_power2_divisions:256:1],expandable_segments:True", r"without its '\['"),
    # Keys with no equivalent were only warned about, whatever their value.
    ("max_split_size_mb:banana", "expected a size in MiB"),
    ("max_split_size_mb:-5", "expected a size in MiB"),
    ("garbage_collection_threshold:1.5", "strictly between 0 and 1"),
    ("release_lock_on_cudamalloc:yes", "True or False"),
])
def test_allocator_settings_refuse_values_pytorch_refuses(conf, why):
    from vramkit.plug import torch_settings

    # A typo is a ConfigError naming the variable, the key and the value, never a bare
    # float() error or a setting silently read as its opposite.
    with pytest.raises(vramkit.ConfigError, match=why) as raised:
        torch_settings.map_settings(conf, "PYTORCH_CUDA_ALLOC_CONF")
    assert isinstance(raised.value, torch_settings.SettingsError)
    assert str(raised.value).startswith("PYTORCH_CUDA_ALLOC_CONF: " + conf[:20])


def test_allocator_settings_show_foreign_text_escaped():
    from vramkit.plug import torch_settings

    with pytest.warns(RuntimeWarning) as caught:
        torch_settings.map_settings("we\x1bird:1")
    assert "we\\x1bird:1 is not a setting" in str(caught[0].message)
    with pytest.raises(torch_settings.SettingsError) as raised:
        torch_settings.map_settings("expandable_segments:\x1b")
    assert "\x1b" not in str(raised.value) and "\\x1b" in str(raised.value)


def test_settings_set_later_say_what_they_do():
    from vramkit.plug import torch_settings

    seen = []
    hook = torch_settings.settings_hook(seen.append)
    with pytest.warns(RuntimeWarning, match="large_blocks='virtual'.*install"):
        hook("expandable_segments:True")
    assert seen == ["expandable_segments:True"]  # PyTorch still records it


def test_capture_reuse_is_the_backends_switch_now_and_later():
    """graph_capture_record_stream_reuse is served (the backend reuses a block freed in a
    capture once the graph orders its uses): no warning; install() hands it over, and a
    later _set_allocator_settings() turns it on and off at once."""
    from vramkit.plug import torch_settings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch_settings.map_settings("graph_capture_record_stream_reuse:True") == {
            torch_settings.TORCH_CAPTURE_REUSE: True}
        switched, recorded = [], []
        hook = torch_settings.settings_hook(recorded.append, switched.append)
        hook("graph_capture_record_stream_reuse:True")
        hook("graph_capture_record_stream_reuse:False,pinned_use_cuda_host_register:True")
    assert switched == [True, False]
    assert len(recorded) == 2  # PyTorch still records both


def test_settings_set_later_let_pytorch_refuse_first():
    from vramkit.plug import torch_settings

    # PyTorch's own parser sees the string first: what it refuses raises PyTorch's error
    # (here a RuntimeError), as it would without vramkit, and vramkit adds no warning first.
    def pytorch_parser(conf):
        raise RuntimeError(f"PyTorch refuses {conf}")

    hook = torch_settings.settings_hook(pytorch_parser)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="PyTorch refuses"):
            hook("expandable_segments:1,max_split_size_mb:2")
    # What PyTorch takes and vramkit cannot serve is still refused, after PyTorch.
    seen = []
    with pytest.raises(torch_settings.SettingsError, match="is invalid"):
        torch_settings.settings_hook(seen.append)("per_process_memory_fraction:-1")
    assert seen == ["per_process_memory_fraction:-1"]


def test_settings_in_the_environment_let_pytorch_refuse_first():
    """A PYTORCH_CUDA_ALLOC_CONF PyTorch refuses (a key mistyped) fails install() with
    PyTorch's own error, as PyTorch's allocator fails at its first allocation, not with a
    warning that the key has no effect; what PyTorch takes goes on to vramkit's mapping."""
    pytest.importorskip("torch")
    done = run_python("""
        import warnings
        import torch
        from vramkit.plug import torch_settings
        parser = torch_settings.pytorch_parser_of(torch)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                torch_settings.from_environment(parser)
            except ValueError as error:
                print("refused:", error)
            vramkit_said = [str(w.message) for w in said if "vramkit" in str(w.message)]
        print("vramkit warned:", vramkit_said)
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"})
    assert "refused: Unrecognized key 'expandable_segment'" in done.stdout, done.stdout
    assert "vramkit warned: []" in done.stdout
    done = run_python("""
        import torch
        from vramkit.plug import torch_settings
        print(torch_settings.from_environment(torch_settings.pytorch_parser_of(torch)))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert "{'large_blocks': 'virtual'}" in done.stdout, done.stdout

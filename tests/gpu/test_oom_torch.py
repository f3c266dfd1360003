"""Out of memory through PyTorch under vramkit.torch.install(): torch.OutOfMemoryError with
PyTorch's own words and vramkit's report, a CUDA context that survives, and a batch finder
that halves its way to a batch that fits and trains as native PyTorch does."""

NEEDS_TORCH = """
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        raise SystemExit(0)
"""


def test_the_urgent_snippet_raises_and_the_context_lives(gpu_run):
    out = gpu_run(NEEDS_TORCH, """
        import vramkit, vramkit.torch
        vramkit.torch.install()
        torch.cuda.set_per_process_memory_fraction(0.01)
        try:
            x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            caught = exc
        else:
            raise AssertionError(f"no exception; data_ptr={x.data_ptr()}")
        assert isinstance(caught, RuntimeError)
        message = str(caught)
        assert message.startswith("CUDA out of memory."), message[:200]
        assert "vramkit: out of memory on device 0" in message, message[:400]
        assert len(caught.args) == 1                     # Lightning's finder wants one arg
        # The context is intact: small work runs and gives the right answer.
        assert torch.ones(1000, device="cuda").sum().item() == 1000.0
        # Lift the cap: the same request now succeeds and its memory is usable.
        torch.cuda.set_per_process_memory_fraction(1.0)
        x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        assert x.data_ptr() != 0
        x.fill_(3)
        assert x[-1000:].sum().item() == 3000
        torch.cuda.synchronize()
        print("num_ooms", vramkit.memory_stats(0)["num_ooms"])
    """)
    assert "num_ooms 1" in out


def test_report_attribute_and_free_then_allocate(gpu_run):
    gpu_run(NEEDS_TORCH, """
        import vramkit, vramkit.torch
        vramkit.torch.install(limit="1G")
        keep = torch.empty(700 << 20, dtype=torch.uint8, device="cuda")
        try:
            with vramkit.torch.oom_report():
                torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            error = exc
        else:
            raise AssertionError("512 MiB fit beside 700 MiB under a 1 GiB limit")
        report = error.report
        assert report and report == vramkit.last_oom_report()
        assert report in str(error)
        assert "limit" in report
        del keep                                   # free something ...
        again = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")   # ... and it fits
        again.fill_(1)
        assert again[-1000:].sum().item() == 1000
    """)


def test_out_of_memory_in_backward_surfaces_in_the_caller(gpu_run):
    # Backward allocates on autograd's worker thread; the exception must reach the thread
    # that called backward() as the same type.
    gpu_run(NEEDS_TORCH, """
        import vramkit, vramkit.torch
        vramkit.torch.install()
        torch.manual_seed(0)
        layers = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
        x = torch.randn(16384, 4096, device="cuda")
        loss = layers(x).square().mean()
        # Cap the pool just above what forward holds: the gradients cannot fit.
        total = torch.cuda.mem_get_info()[1]
        cap = vramkit.memory_reserved(0) + (64 << 20)
        torch.cuda.set_per_process_memory_fraction(cap / total)
        try:
            loss.backward()
        except torch.OutOfMemoryError as exc:
            assert str(exc).startswith("CUDA out of memory.")
        else:
            raise AssertionError("backward fit in 64 MiB more than forward held")
        del loss
        layers.zero_grad(set_to_none=True)
        del x
        small = torch.randn(64, 4096, device="cuda")
        loss = layers(small).square().mean()
        loss.backward()
        assert torch.isfinite(loss).item()
    """)


def test_lightning_and_accelerate_recognise_the_error(gpu_run):
    out = gpu_run(NEEDS_TORCH, """
        import vramkit, vramkit.torch
        vramkit.torch.install(limit="256M")
        try:
            torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            error = exc
        checked = []
        try:
            from accelerate.utils.memory import should_reduce_batch_size
            assert should_reduce_batch_size(error)
            checked.append("accelerate")
        except ImportError:
            pass
        try:
            from lightning.pytorch.utilities.memory import is_oom_error
        except ImportError:
            try:
                from pytorch_lightning.utilities.memory import is_oom_error
            except ImportError:
                is_oom_error = None
        if is_oom_error is not None:
            assert is_oom_error(error)
            checked.append("lightning")
        print("checked", " ".join(checked))
    """)
    assert "checked" in out


TRAIN = """
    import json, os
    USE_VRAMKIT = os.environ["USE_VRAMKIT"] == "1"
    if USE_VRAMKIT:
        import vramkit, vramkit.torch
        vramkit.torch.install(limit="3G")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True

    def train(batch):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),
                                    torch.nn.Linear(8192, 8192), torch.nn.GELU(),
                                    torch.nn.Linear(8192, 10)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(3):
            x = torch.randn(batch, 2048, device="cuda", generator=gen)
            y = torch.randint(0, 10, (batch,), device="cuda", generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses

    tried = []
    batch = int(os.environ.get("BATCH", "0"))
    if batch:
        losses = train(batch)
    else:
        # The loop of accelerate's find_executable_batch_size, written out so that the test
        # does not depend on accelerate: halve on "CUDA out of memory." until it fits.
        batch = 65536
        while True:
            tried.append(batch)
            try:
                losses = train(batch)
                break
            except RuntimeError as exc:
                if "CUDA out of memory." not in str(exc) or batch == 1:
                    raise
                torch.cuda.empty_cache()
                batch //= 2
    print(json.dumps({"batch": batch, "tried": tried, "losses": losses}))
"""


def test_batch_finder_halves_then_trains_like_native(gpu_run):
    import json

    def result(out):
        return json.loads(next(line for line in out.splitlines() if line.startswith("{")))

    found = result(gpu_run(NEEDS_TORCH, TRAIN, env={"USE_VRAMKIT": "1"}))
    assert len(found["tried"]) >= 2, found              # the first batch did not fit
    assert found["tried"][-1] == found["batch"]
    native = result(gpu_run(NEEDS_TORCH, TRAIN,
                            env={"USE_VRAMKIT": "0", "BATCH": str(found["batch"])}))
    for ours, theirs in zip(found["losses"], native["losses"]):
        assert abs(ours - theirs) <= 1e-5 * max(1.0, abs(theirs)), (found, native)


def test_accelerate_finder_under_vramkit(gpu_run):
    # Each attempt allocates its batch and nothing else, so an attempt that fails leaves
    # nothing behind: under native PyTorch too, a tensor held by a failed attempt's
    # traceback stays allocated until the next collection and fails every smaller batch.
    out = gpu_run(NEEDS_TORCH, """
        try:
            from accelerate.utils import find_executable_batch_size
        except ImportError:
            print("SKIP: accelerate is not installed")
            raise SystemExit(0)
        import vramkit, vramkit.torch
        vramkit.torch.install(limit="1G")
        ROW = 8192 * 4                                   # bytes a row
        tried = []

        @find_executable_batch_size(starting_batch_size=1 << 16)
        def run(batch_size):
            tried.append(batch_size)
            x = torch.empty(batch_size, 8192, device="cuda")
            x.fill_(2.0)
            return batch_size, x[batch_size - 1, 8191].item()

        batch, value = run()
        print("tried", tried)
        assert len(tried) >= 2 and tried == sorted(tried, reverse=True)
        assert batch == tried[-1] and batch * ROW <= 1 << 30 and value == 2.0
        assert tried[-2] * ROW > (1 << 30) - (64 << 20)  # the step before did not fit
    """)
    assert "tried" in out


def test_record_stream_and_frees_from_another_thread(gpu_run):
    gpu_run(NEEDS_TORCH, """
        import threading
        import vramkit, vramkit.torch
        vramkit.torch.install()
        side = torch.cuda.Stream()
        x = torch.ones(1 << 20, device="cuda")
        with torch.cuda.stream(side):
            y = x * 2
        y.record_stream(torch.cuda.current_stream())
        assert y.sum().item() == 2 * (1 << 20)
        tensors = [torch.ones(1 << 16, device="cuda") for _ in range(64)]
        def drop():
            tensors.clear()
        t = threading.Thread(target=drop)
        t.start(); t.join()
        assert vramkit.memory_allocated(0) > 0
        del x, y
        torch.cuda.synchronize()
        z = torch.zeros(10, device="cuda")
        assert z.data_ptr() != 0 and z.sum().item() == 0
    """)

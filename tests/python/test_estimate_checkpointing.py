"""Activation checkpointing of a decoder with a key-value cache: apply_checkpointing on a
real model, and the what-if rows that checkpoint the fake one.

transformers' decoders keep ``config.use_cache`` on in training; a checkpointed block that
is recomputed in backward appends its keys and values to that cache a second time (at one
token, torch.utils.checkpoint refuses the recomputation outright). transformers' own
gradient checkpointing turns the cache off; apply_checkpointing does the same, so that the
what-if table's checkpointing rows are the step a user gets by checkpointing the blocks.
A block that recomputes differently for a reason of its own is the step's error.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import vramkit  # noqa: E402
from vramkit.estimator.variants import apply_checkpointing, repeated_blocks  # noqa: E402

VOCAB = 100


def _tiny_gpt2(seed: int = 0):
    """Without dropout, so that two copies compute the same in training mode."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).train()


@pytest.mark.parametrize("tokens", [1, 16])
def test_checkpointing_a_decoder_turns_its_cache_off_and_keeps_its_gradients(tokens):
    plain, checked = _tiny_gpt2(), _tiny_gpt2()
    assert checked.config.use_cache is True
    assert apply_checkpointing(checked, repeated_blocks(checked)) == [
        "transformer.h.0", "transformer.h.1"]
    assert checked.config.use_cache is False
    ids = torch.randint(0, VOCAB, (2, tokens), generator=torch.Generator().manual_seed(1))
    # A loss of the logits: at one token a language model's shifted loss has no target.
    plain_loss = plain(input_ids=ids).logits.square().mean()
    checked_out = checked(input_ids=ids)
    assert checked_out.past_key_values is None
    checked_loss = checked_out.logits.square().mean()
    plain_loss.backward()
    checked_loss.backward()  # CheckpointError at one token while the cache was on
    assert torch.allclose(plain_loss, checked_loss, atol=1e-6)
    for a, b in zip(plain.parameters(), checked.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def _build(checkpointed_by_transformers: bool, tokens: int):
    def build():
        config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=500,
                                         n_positions=256)
        net = transformers.GPT2LMHeadModel(config).to("cuda")
        if checkpointed_by_transformers:
            net.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        net.train()
        return (net, torch.optim.AdamW(net.parameters()),
                torch.randint(0, 500, (4, tokens), device="cuda"))
    return build


def _train(net, opt, ids):
    net(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_the_what_if_checkpointing_row_is_the_step_checkpointed_as_transformers_does():
    """The row held every block's keys and values in the cache through the forward pass,
    more than the same step checkpointed with transformers' own switch holds."""
    own = vramkit.estimate(_train, build=_build(True, 256))
    rows = {r.variant: r for r in vramkit.advise(_train, build=_build(False, 256),
                                                 processes=1).rows}
    assert rows["checkpointing all 4 blocks"].peak_allocated == own.peak_allocated
    assert own.peak_allocated < rows["as written"].peak_allocated


def test_the_checkpointing_rows_of_a_one_token_step_are_estimated():
    rows = {r.variant: r for r in vramkit.advise(_train, build=_build(False, 1),
                                                 processes=1).rows}
    checkpointing = [r for name, r in rows.items() if "checkpointing" in name]
    assert len(checkpointing) == 3, sorted(rows)
    for row in checkpointing:
        assert row.peak_allocated is not None and row.peak_allocated > 0, row


class _Remembering(torch.nn.Module):
    """A block that keeps what it was given, as a key-value cache does: recomputed in
    backward, its linear layer sees twice the rows it saw in the forward pass."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.seen: list = []

    def forward(self, x):
        self.seen.append(x)
        return self.linear(torch.cat(self.seen))[:x.shape[0]]


def test_a_block_that_recomputes_differently_is_refused_as_the_step_s_own_error():
    """The step's error, raised the same way on a GPU: it was put down to the CPU stand-in
    on a machine without one."""
    def build():
        block = torch.nn.Sequential(_Remembering()).to("cuda")
        apply_checkpointing(block, ["0"])
        return block, torch.randn(4, 8, device="cuda")

    def step(block, x):
        block(x).sum().backward()

    with pytest.raises(vramkit.estimator.UntraceableStep) as refused:
        vramkit.estimate(step, build=build)
    message = str(refused.value)
    assert "CheckpointError" in message and "Recomputed values" in message, message
    assert "stand-in" not in message, message

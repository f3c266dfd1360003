"""Attention under the estimator is called as in the real step.

transformers drops the attention mask it would build from values it knows (an all-ones
padding mask it made itself, positions from ``arange``) and asks PyTorch's attention for
its causal flag instead; but it counts every fake tensor as traced, and under fake
tensors it keeps the mask. The fused kernels then take a bias of batch x length x
length elements per layer that the real step never makes (about 32 MiB a layer for
OPT-125M at 8 x 1024 in fp32). The estimator lets a fake tensor whose value it knows
count as untraced, as the real tensor does; a mask the user passes in, whose values it
cannot know, is still kept, as transformers keeps it."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import vramkit.plan.estimator as estimator  # noqa: E402


def _attention_calls(monkeypatch):
    """Every scaled_dot_product_attention call from here on, as (mask given, causal)."""
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is not None, is_causal))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return calls


def _models():
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, vocab_size=1000)
    bart = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                vocab_size=1000)
    return {"gpt-neox": lambda: transformers.GPTNeoXForCausalLM(
                transformers.GPTNeoXConfig(**tiny)),
            "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
                hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=1000, word_embed_proj_dim=64)),
            "bart": lambda: transformers.BartForConditionalGeneration(
                transformers.BartConfig(**bart))}


@pytest.mark.parametrize("family", ["gpt-neox", "opt", "bart"])
def test_attention_gets_the_mask_the_real_step_gives_it(family, monkeypatch):
    make = _models()[family]
    calls = _attention_calls(monkeypatch)

    def build():
        net = make().to("cuda")
        return net, torch.randint(0, 1000, (2, 32), device="cuda")

    def step(net, ids):
        net(input_ids=ids, labels=ids).loss.backward()

    estimator.estimate(step, build=build, steps=1)
    estimated = sorted(set(calls))
    calls.clear()
    net = make()
    ids = torch.randint(0, 1000, (2, 32))
    net(input_ids=ids, labels=ids).loss.backward()  # the real step, on the CPU
    real = sorted(set(calls))
    assert real and real == estimated, (estimated, real)
    assert all(not masked for masked, _ in estimated), estimated


def test_a_mask_the_user_passes_is_kept(monkeypatch):
    """The batch's own attention mask has values the estimate cannot know: transformers
    keeps it under fake tensors, and the estimate counts the bias it makes."""
    make = _models()["gpt-neox"]
    calls = _attention_calls(monkeypatch)

    def build():
        net = make().to("cuda")
        ids = torch.randint(0, 1000, (2, 32), device="cuda")
        return net, ids, torch.ones_like(ids)

    def step(net, ids, mask):
        net(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()

    estimator.estimate(step, build=build, steps=1)
    assert calls and all(masked for masked, _ in calls), sorted(set(calls))

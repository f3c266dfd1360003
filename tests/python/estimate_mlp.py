"""The small step most estimate tests measure: a two-layer MLP trained with AdamW (or SGD),
with what its parameters hold counted by hand. Shared by test_estimate.py and
test_estimate_value_reads.py; torch is imported only when a model is built."""

WIDTH = 1024
BATCH = 64


def _rounded(n: int) -> int:
    return max(512, -(-n // 512) * 512)


def _mlp_build(batch=BATCH, optimizer="adamw"):
    def build():
        import torch

        net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(),
                                  torch.nn.Linear(4 * WIDTH, WIDTH))
        opt = (torch.optim.AdamW(net.parameters()) if optimizer == "adamw"
               else torch.optim.SGD(net.parameters(), lr=0.1))
        return net, opt, torch.randn(batch, WIDTH)
    return build


def _step(net, opt, x):
    net(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


PARAM_BYTES = sum(_rounded(n * 4) for n in (4 * WIDTH * WIDTH, 4 * WIDTH, WIDTH * 4 * WIDTH, WIDTH))

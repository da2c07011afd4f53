"""Writes examples/mlp.pt, the example model the README's first command composes: a transformer
MLP block (Linear 256->1024, GELU, Linear 1024->256) traced at 1024 tokens, fp32."""
import os

import torch


class MlpBlock(torch.nn.Module):
    def __init__(self, d=256, h=1024):
        super().__init__()
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


if __name__ == "__main__":
    torch.manual_seed(0)
    with torch.no_grad():
        m = torch.jit.trace(MlpBlock().eval(), (torch.randn(1024, 256),))
    m.save(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp.pt"))

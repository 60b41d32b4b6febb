"""The vocoder half of a Piper (VITS) voice as plain ``torch.nn`` modules: the HiFi-GAN
generator with type-2 residual blocks (``dec.*``; shapes in ``torch_vits.VitsShape``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .torch_vits import VitsShape

DEFAULT_SHAPE = VitsShape()  # the bundled voice's (medium quality)


class ResBlock2(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel * d - d) // 2)
            for d in dilations
        )

    def forward(self, x: Tensor) -> Tensor:
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, 0.1))
        return x


class Generator(nn.Module):
    """HiFi-GAN generator: latent [B, 192, T] -> audio [B, 1, T * hop]."""

    def __init__(self, s: VitsShape = DEFAULT_SHAPE) -> None:
        super().__init__()
        self.hop_length = s.hop_length
        self.kernels = len(s.resblock_kernels)
        self.conv_pre = nn.Conv1d(s.hidden, s.upsample_initial, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = s.upsample_initial
        for rate, kernel in zip(s.upsample_rates, s.upsample_kernels):
            self.ups.append(
                nn.ConvTranspose1d(ch, ch // 2, kernel, rate, padding=(kernel - rate) // 2)
            )
            ch //= 2
            for k, d in zip(s.resblock_kernels, s.resblock_dilations):
                self.resblocks.append(ResBlock2(ch, k, d))
        self.conv_post = nn.Conv1d(ch, 1, 7, padding=3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_pre(x)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, 0.1))
            blocks = self.resblocks[i * self.kernels : (i + 1) * self.kernels]
            x = sum(block(x) for block in blocks) / self.kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))


class Decoder(nn.Module):
    """The vocoder half as the voice names it (``dec.*``): latent -> audio [B, 1, T * hop]."""

    def __init__(self, s: VitsShape = DEFAULT_SHAPE) -> None:
        super().__init__()
        self.dec = Generator(s)
        self.hop_length = s.hop_length

    def forward(self, latent: Tensor) -> Tensor:
        return self.dec(latent)

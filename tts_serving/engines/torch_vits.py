"""The inference path of a Piper (VITS) voice as plain ``torch.nn`` modules.

Written from the VITS architecture (Kim et al., 2021) and the hyper-parameters read off the
exported voice's ONNX graph: a relative-position transformer text encoder, the stochastic
duration predictor run in reverse, length regulation, the residual-coupling flow in reverse and
a HiFi-GAN generator with type-2 residual blocks. Parameter names equal the ONNX initializer
names (``enc_p.*``, ``dp.*``, ``flow.*``, ``dec.*``), so ``export/torch_weights.py`` fills them
from the voice itself.

Both halves match the ONNX split the repository serves: ``VitsAcoustic`` maps padded phoneme ids,
their lengths and per-item scales ``[B, 3]`` = (noise_scale, length_scale, noise_w) to the
masked latent ``[B, 192, T]`` and the frames per item; ``torch_decoder.Decoder`` maps latents to
audio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class VitsShape:
    """Hyper-parameters of Piper's "medium" voices (checked against the graph by the loader)."""

    num_symbols: int = 256
    hidden: int = 192
    filter: int = 768
    heads: int = 2
    layers: int = 6
    window: int = 4
    ffn_kernel: int = 3
    flow_layers: int = 4  # residual coupling layers
    wn_layers: int = 4
    wn_kernel: int = 5
    dp_kernel: int = 3
    dp_layers: int = 3
    spline_bins: int = 10
    spline_tail: float = 5.0
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_kernels: tuple[int, ...] = (16, 16, 8)
    upsample_initial: int = 256
    resblock_kernels: tuple[int, ...] = (3, 5, 7)
    resblock_dilations: tuple[tuple[int, int], ...] = ((1, 2), (2, 6), (3, 12))

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)


def sequence_mask(lengths: Tensor, max_length: int) -> Tensor:
    """[B] lengths -> [B, max_length] bool, True inside each item."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


class LayerNorm(nn.Module):
    """Layer norm over the channel axis of [B, C, T]."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        x = F.layer_norm(x.transpose(1, -1), (x.shape[1],), self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


class RelativeAttention(nn.Module):
    """Multi-head self-attention with learned relative-position keys and values (window w)."""

    def __init__(self, channels: int, heads: int, window: int) -> None:
        super().__init__()
        self.heads = heads
        self.window = window
        self.k_channels = channels // heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window + 1, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window + 1, self.k_channels))

    def _relative(self, emb: Tensor, length: int) -> Tensor:
        """The 2L-1 relative embeddings for offsets -(L-1)..L-1 (zero outside the window)."""
        pad = max(length - (self.window + 1), 0)
        start = max((self.window + 1) - length, 0)
        if pad > 0:
            emb = F.pad(emb, (0, 0, pad, pad))
        return emb[:, start : start + 2 * length - 1]

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        b, c, t = x.shape
        h, d = self.heads, self.k_channels
        q = self.conv_q(x).view(b, h, d, t).transpose(2, 3) / math.sqrt(d)
        k = self.conv_k(x).view(b, h, d, t).transpose(2, 3)
        v = self.conv_v(x).view(b, h, d, t).transpose(2, 3)
        scores = q @ k.transpose(-2, -1)  # [b, h, t, t]
        rel_logits = q @ self._relative(self.emb_rel_k, t).transpose(-2, -1)  # [b, h, t, 2t-1]
        scores = scores + _relative_to_absolute(rel_logits)
        scores = scores.masked_fill(~attn_mask, -1e4)
        p = torch.softmax(scores, dim=-1)
        out = p @ v + _absolute_to_relative(p) @ self._relative(self.emb_rel_v, t)
        return self.conv_o(out.transpose(2, 3).reshape(b, c, t))


def _relative_to_absolute(x: Tensor) -> Tensor:
    """[b, h, t, 2t-1] logits by relative offset -> [b, h, t, t] by absolute key position."""
    b, h, t, _ = x.shape
    x = F.pad(x, (0, 1)).reshape(b, h, t * 2 * t)
    x = F.pad(x, (0, t - 1)).reshape(b, h, t + 1, 2 * t - 1)
    return x[:, :, :t, t - 1 :]


def _absolute_to_relative(x: Tensor) -> Tensor:
    """[b, h, t, t] weights by absolute key position -> [b, h, t, 2t-1] by relative offset."""
    b, h, t, _ = x.shape
    x = F.pad(x, (0, t - 1)).reshape(b, h, t * t + t * (t - 1))
    x = F.pad(x, (t, 0)).reshape(b, h, t, 2 * t)
    return x[:, :, :, 1:]


class FeedForward(nn.Module):
    def __init__(self, channels: int, filter: int, kernel: int) -> None:
        super().__init__()
        self.pad = ((kernel - 1) // 2, kernel // 2)
        self.conv_1 = nn.Conv1d(channels, filter, kernel)
        self.conv_2 = nn.Conv1d(filter, channels, kernel)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = torch.relu(self.conv_1(F.pad(x * mask, self.pad)))
        return self.conv_2(F.pad(x * mask, self.pad)) * mask


class AttentionEncoder(nn.Module):
    def __init__(self, s: VitsShape) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(
            RelativeAttention(s.hidden, s.heads, s.window) for _ in range(s.layers)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(s.hidden) for _ in range(s.layers))
        self.ffn_layers = nn.ModuleList(
            FeedForward(s.hidden, s.filter, s.ffn_kernel) for _ in range(s.layers)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(s.hidden) for _ in range(s.layers))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        attn_mask = (mask.unsqueeze(2) * mask.unsqueeze(-1)).bool()  # [b, 1, t, t]
        x = x * mask
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm1(x + attn(x, attn_mask))
            x = norm2(x + ffn(x, mask))
        return x * mask


class TextEncoder(nn.Module):
    def __init__(self, s: VitsShape) -> None:
        super().__init__()
        self.hidden = s.hidden
        self.emb = nn.Embedding(s.num_symbols, s.hidden)
        self.encoder = AttentionEncoder(s)
        self.proj = nn.Conv1d(s.hidden, 2 * s.hidden, 1)

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = (self.emb(ids) * math.sqrt(self.hidden)).transpose(1, 2)
        x = self.encoder(x * mask, mask)
        m, logs = torch.split(self.proj(x) * mask, self.hidden, dim=1)
        return x, m, logs


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (dilation kernel**i) with GELU and layer norm."""

    def __init__(self, channels: int, kernel: int, layers: int) -> None:
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(layers):
            dilation = kernel**i
            self.convs_sep.append(
                nn.Conv1d(
                    channels,
                    channels,
                    kernel,
                    groups=channels,
                    dilation=dilation,
                    padding=(kernel * dilation - dilation) // 2,
                )
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))

    def forward(self, x: Tensor, mask: Tensor, g: Tensor | None = None) -> Tensor:
        if g is not None:
            x = x + g
        for sep, n1, conv, n2 in zip(self.convs_sep, self.norms_1, self.convs_1x1, self.norms_2):
            y = F.gelu(n1(sep(x * mask)))
            x = x + F.gelu(n2(conv(y)))
        return x * mask


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: Tensor, mask: Tensor, g: Tensor) -> Tensor:
        return (x - self.m) * torch.exp(-self.logs) * mask


class Flip(nn.Module):
    def reverse(self, x: Tensor, mask: Tensor, g: Tensor | None = None) -> Tensor:
        return torch.flip(x, [1])


class ConvFlow(nn.Module):
    """Coupling layer whose second half goes through a rational-quadratic spline."""

    def __init__(self, s: VitsShape) -> None:
        super().__init__()
        self.bins = s.spline_bins
        self.tail = s.spline_tail
        self.filter = s.hidden
        self.pre = nn.Conv1d(1, s.hidden, 1)
        self.convs = DDSConv(s.hidden, s.dp_kernel, s.dp_layers)
        self.proj = nn.Conv1d(s.hidden, 3 * s.spline_bins - 1, 1)

    def reverse(self, x: Tensor, mask: Tensor, g: Tensor) -> Tensor:
        x0, x1 = x[:, :1], x[:, 1:]
        h = self.proj(self.convs(self.pre(x0), mask, g)) * mask  # [b, 3*bins-1, t]
        h = h.transpose(1, 2)  # [b, t, 3*bins-1]
        scale = math.sqrt(self.filter)
        widths = h[..., : self.bins] / scale
        heights = h[..., self.bins : 2 * self.bins] / scale
        derivatives = h[..., 2 * self.bins :]
        y1 = inverse_spline(x1[:, 0], widths, heights, derivatives, self.tail)
        return torch.cat([x0, y1.unsqueeze(1)], dim=1) * mask


def inverse_spline(
    y: Tensor,
    widths: Tensor,
    heights: Tensor,
    derivatives: Tensor,
    tail: float,
    min_width: float = 1e-3,
    min_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> Tensor:
    """Inverse of a monotonic rational-quadratic spline on [-tail, tail], identity outside.

    ``y``: [b, t]; ``widths``/``heights``: [b, t, K] unnormalized; ``derivatives``: [b, t, K-1]
    (the boundary derivatives are fixed to 1, so the tails are linear).
    """
    bins = widths.shape[-1]
    boundary = math.log(math.exp(1 - min_derivative) - 1)
    derivatives = F.pad(derivatives, (1, 1), value=boundary)
    d = min_derivative + F.softplus(derivatives)

    def knots(unnormalized: Tensor, minimum: float) -> tuple[Tensor, Tensor]:
        size = minimum + (1 - minimum * bins) * torch.softmax(unnormalized, dim=-1)
        cum = F.pad(torch.cumsum(size, dim=-1), (1, 0))
        cum = 2 * tail * cum - tail
        cum = torch.cat([torch.full_like(cum[..., :1], -tail), cum[..., 1:-1],
                         torch.full_like(cum[..., :1], tail)], dim=-1)  # fmt: skip
        return cum, cum[..., 1:] - cum[..., :-1]

    cum_w, w = knots(widths, min_width)
    cum_h, hgt = knots(heights, min_height)
    inside = (y >= -tail) & (y <= tail)
    yc = y.clamp(-tail, tail)
    # The bin each value falls in (the last knot nudged up so y == tail lands in the last bin).
    edges = torch.cat([cum_h[..., :-1], cum_h[..., -1:] + 1e-6], dim=-1)
    idx = (torch.sum(yc[..., None] >= edges, dim=-1) - 1).clamp(0, bins - 1)[..., None]

    def at(t: Tensor) -> Tensor:
        return t.gather(-1, idx)[..., 0]

    x_k, w_k, y_k, h_k = at(cum_w), at(w), at(cum_h), at(hgt)
    delta = h_k / w_k
    d_k, d_k1 = at(d[..., :-1]), at(d[..., 1:])
    diff = yc - y_k
    a = diff * (d_k + d_k1 - 2 * delta) + h_k * (delta - d_k)
    b = h_k * d_k - diff * (d_k + d_k1 - 2 * delta)
    c = -delta * diff
    root = (2 * c) / (-b - torch.sqrt(b * b - 4 * a * c))
    return torch.where(inside, root * w_k + x_k, y)


class DurationPredictor(nn.Module):
    """The stochastic duration predictor, reverse direction only (noise -> log durations)."""

    def __init__(self, s: VitsShape) -> None:
        super().__init__()
        self.pre = nn.Conv1d(s.hidden, s.hidden, 1)
        self.convs = DDSConv(s.hidden, s.dp_kernel, s.dp_layers)
        self.proj = nn.Conv1d(s.hidden, s.hidden, 1)
        # Indices as in training (affine, then 4 x (spline flow, flip)); reverse skips flow 1.
        self.flows = nn.ModuleDict(
            {"0": ElementwiseAffine(2), **{str(i): ConvFlow(s) for i in (3, 5, 7)}}
        )
        self.flip = Flip()

    def forward(self, x: Tensor, mask: Tensor, noise: Tensor) -> Tensor:
        x = self.proj(self.convs(self.pre(x), mask)) * mask
        z = noise
        for i in ("7", "5", "3"):
            z = self.flip.reverse(z, mask)
            z = self.flows[i].reverse(z, mask, x)
        z = self.flip.reverse(z, mask)
        z = self.flows["0"].reverse(z, mask, x)
        return z[:, :1]  # log durations


class WN(nn.Module):
    """Gated dilated convolutions (WaveNet style), no speaker conditioning."""

    def __init__(self, hidden: int, kernel: int, layers: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.in_layers = nn.ModuleList(
            nn.Conv1d(hidden, 2 * hidden, kernel, padding=(kernel - 1) // 2) for _ in range(layers)
        )
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(hidden, 2 * hidden if i < layers - 1 else hidden, 1) for i in range(layers)
        )

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = torch.zeros_like(x)
        last = len(self.in_layers) - 1
        for i, (inp, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            a = inp(x)
            acts = torch.tanh(a[:, : self.hidden]) * torch.sigmoid(a[:, self.hidden :])
            rs = res_skip(acts)
            if i < last:
                x = (x + rs[:, : self.hidden]) * mask
                out = out + rs[:, self.hidden :]
            else:
                out = out + rs
        return out * mask


class ResidualCoupling(nn.Module):
    """Mean-only affine coupling: the second half is shifted by a function of the first."""

    def __init__(self, s: VitsShape) -> None:
        super().__init__()
        self.half = s.hidden // 2
        self.pre = nn.Conv1d(self.half, s.hidden, 1)
        self.enc = WN(s.hidden, s.wn_kernel, s.wn_layers)
        self.post = nn.Conv1d(s.hidden, self.half, 1)

    def reverse(self, x: Tensor, mask: Tensor) -> Tensor:
        x0, x1 = x[:, : self.half], x[:, self.half :]
        h = self.enc(self.pre(x0) * mask, mask)
        m = self.post(h) * mask
        return torch.cat([x0, (x1 - m) * mask], dim=1)


class Flow(nn.Module):
    def __init__(self, s: VitsShape) -> None:
        super().__init__()
        # Training order is (coupling, flip) x 4; flips hold no weights, so only even indices.
        self.flows = nn.ModuleDict({str(2 * i): ResidualCoupling(s) for i in range(s.flow_layers)})

    def reverse(self, x: Tensor, mask: Tensor) -> Tensor:
        for key in reversed(list(self.flows)):
            x = self.flows[key].reverse(torch.flip(x, [1]), mask)
        return x


class VitsAcoustic(nn.Module):
    """Padded phoneme ids [B, L], lengths [B], scales [B, 4] (noise_scale, length_scale,
    noise_w, speed; [B, 3]: speed 1) -> latent [B, 192, T], frames [B], frames per id [B, L]."""

    def __init__(self, s: VitsShape = VitsShape()) -> None:
        super().__init__()
        self.enc_p = TextEncoder(s)
        self.dp = DurationPredictor(s)
        self.flow = Flow(s)

    def durations(
        self, ids: Tensor, lengths: Tensor, scales: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The encoder and durations: (m_p, logs_p, frames per phoneme [B, L], x_mask)."""
        mask = sequence_mask(lengths, ids.shape[1]).unsqueeze(1).to(torch.float32)
        x, m_p, logs_p = self.enc_p(ids, mask)
        noise_w = scales[:, 2].view(-1, 1, 1)
        noise = torch.randn(x.shape[0], 2, x.shape[2], device=x.device) * noise_w
        logw = self.dp(x, mask, noise)
        w = torch.ceil(torch.exp(logw) * mask * scales[:, 1].view(-1, 1, 1))[:, 0]
        if scales.shape[1] > 3:  # as export/graph.proportional_durations: follow 1/speed
            ends = torch.round(torch.cumsum(w, dim=1) / scales[:, 3:4])
            w = ends - F.pad(ends, (1, 0))[:, :-1]
        return m_p, logs_p, w, mask

    def expand(
        self, ids: Tensor, lengths: Tensor, scales: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The encoder, durations and length regulation: (z_p [B, C, T], y_mask [B, 1, T], frames,
        frames per id [B, L]).

        Always float32: frame counts come from ceil() of the durations, so they must equal
        the float32 voice's.
        """
        m_p, logs_p, w, _ = self.durations(ids, lengths, scales)
        return self.regulate(m_p, logs_p, w, scales)

    def regulate(
        self, m_p: Tensor, logs_p: Tensor, w: Tensor, scales: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Length regulation of ``durations``' output: each phoneme's mean and log-scale
        repeated for its frames, and the noise added: (z_p, y_mask, frames, frames per id).
        Its shapes follow the durations (a host sync for T), so it stays outside CUDA graphs."""
        frames = torch.clamp_min(w.sum(dim=1), 1).long()
        t = int(frames.max())
        y_mask = sequence_mask(frames, t).unsqueeze(1).to(m_p.dtype)
        # Frame j of item b copies phoneme i where cum[i-1] <= j < cum[i].
        cum = torch.cumsum(w, dim=1)  # [B, L]
        j = torch.arange(t, device=w.device, dtype=w.dtype)
        path = (j[None, None, :] < cum[:, :, None]).to(m_p.dtype)  # [B, L, T]
        path = (path - F.pad(path, (0, 0, 1, 0))[:, :-1]) * y_mask
        m, logs = m_p @ path, logs_p @ path  # [B, C, T]
        noise = scales[:, 0].view(-1, 1, 1)
        z_p = m + torch.randn_like(m) * torch.exp(logs) * noise
        return z_p, y_mask, frames, w

    def decode(self, z_p: Tensor, y_mask: Tensor) -> Tensor:
        """The flow in reverse: z_p -> the masked latent (any dtype; the heavy part)."""
        return self.flow.reverse(z_p, y_mask) * y_mask

    def forward(
        self, ids: Tensor, lengths: Tensor, scales: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        z_p, y_mask, frames, durations = self.expand(ids, lengths, scales)
        return self.decode(z_p, y_mask), frames, durations

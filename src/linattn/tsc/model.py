"""The FordA encoder: patch tokens → linear-attention encoder with relative positions → logits.

There is no positional encoding at the input: the only positional information is the learned
relative term ``φ(q_i)·φ(r_{j−i})`` inside each attention layer, so the model depends on where a
pattern sits only through lags between tokens, which suits series that are not aligned in time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.nn import EncoderBlock

__all__ = ["ModelConfig", "FordATransformer", "num_tokens"]

STEMS = ("linear", "conv", "inception")


def num_tokens(length: int, patch: int) -> int:
    """Tokens for a series of ``length`` samples: ``ceil(length / patch)`` (zero padded)."""
    return max(1, math.ceil(length / patch))


@dataclass
class ModelConfig:
    """Everything that defines the architecture (saved as JSON beside the weights).

    ``stem``: ``"linear"`` (each patch of ``patch`` samples through one linear layer, the
    reference recipe), ``"conv"`` (two 1-D convolutions over the raw samples, then a strided
    convolution with kernel and stride ``patch`` to ``d_model``) or ``"inception"`` (parallel
    1-D convolutions with kernels 9, 19 and 39 and a max-pool + 1×1 branch, ``stem_channels / 4``
    channels each, batch norm and GELU, then the patch embedding over all channels).
    ``window``: samples (per channel) each token's embedding sees: 0 = ``patch`` (disjoint
    patches, the reference); a larger window overlaps the neighbouring patches, centred on the
    token's patch (zero padded at the ends), stride ``patch``. ``spectral``: also feed each
    token the log-magnitude spectrum of a Hann window of ``spectral_window`` samples
    (0 = ``2·patch``) centred on its patch.
    ``spectrum_tokens``: append this many tokens made from the log-magnitude spectrum of the
    whole series, split into as many contiguous frequency bands (each band its own linear map).
    """

    length: int = 500
    n_classes: int = 2
    patch: int = 10
    d_model: int = 64
    depth: int = 3
    heads: int = 4
    head_dim: int = 16
    mlp_dim: int = 128
    dropout: float = 0.1
    feature_map: str = "elu"
    stem: str = "linear"
    stem_channels: int = 32
    spectral: bool = False
    spectrum_tokens: int = 0
    window: int = 0
    spectral_window: int = 0

    @property
    def tokens(self) -> int:
        """Time tokens (patches)."""
        return num_tokens(self.length, self.patch)

    @property
    def seq_len(self) -> int:
        """Tokens the encoder sees: the patches, then the spectrum tokens."""
        return self.tokens + self.spectrum_tokens

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model config: unknown keys {unknown}")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for name in ("length", "n_classes", "patch", "d_model", "depth", "heads", "head_dim",
                     "mlp_dim", "stem_channels"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"model config: {name} must be a positive integer, got {v!r}")
        if self.n_classes < 2:
            raise ValueError(f"model config: n_classes must be at least 2, got {self.n_classes}")
        if not isinstance(self.spectrum_tokens, int) or self.spectrum_tokens < 0:
            raise ValueError("model config: spectrum_tokens must be a non-negative integer, "
                             f"got {self.spectrum_tokens!r}")
        if self.stem not in STEMS:
            raise ValueError(f"model config: stem must be one of {', '.join(STEMS)}, "
                             f"got {self.stem!r}")
        if self.stem == "inception" and self.stem_channels % 4:
            raise ValueError("model config: the inception stem needs stem_channels divisible "
                             f"by 4, got {self.stem_channels}")
        if not isinstance(self.window, int) or isinstance(self.window, bool) or \
                (self.window and self.window < self.patch):
            raise ValueError("model config: window must be 0 or an integer >= patch, "
                             f"got {self.window!r}")
        if not isinstance(self.spectral_window, int) or isinstance(self.spectral_window, bool) \
                or (self.spectral_window and self.spectral_window < self.patch):
            raise ValueError("model config: spectral_window must be 0 or an integer >= patch, "
                             f"got {self.spectral_window!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model config: dropout must be in [0, 1), got {self.dropout!r}")


class SpectralPatches(nn.Module):
    """Per-token log-magnitude spectrum: (B, L_pad) -> (B, T, window // 2 + 1).

    Token t sees ``window`` samples (default ``2·patch``) centred on its patch, i.e.
    ``[t·p − (w − p)/2, t·p + p + (w − p)/2)`` (zero padded at the ends), under a Hann window;
    ``log(|rfft|² + 1e-4) / 2``, so silence and scale changes stay finite."""

    def __init__(self, patch: int, window: int = 0) -> None:
        super().__init__()
        self.patch = patch
        self.size = window or 2 * patch
        self.register_buffer("window", torch.hann_window(self.size, periodic=False),
                             persistent=False)

    @property
    def out_features(self) -> int:
        return self.size // 2 + 1

    def forward(self, x: Tensor) -> Tensor:
        p, w = self.patch, self.size
        left = (w - p) // 2
        xp = F.pad(x, (left, w - p - left))
        frames = xp.unfold(-1, w, p) * self.window  # (B, T, w)
        spec = torch.fft.rfft(frames, dim=-1)
        return 0.5 * torch.log(spec.real.square() + spec.imag.square() + 1e-4)


class SpectrumTokens(nn.Module):
    """Global log-magnitude spectrum as k band tokens: (B, L_pad) -> (B, k, d_model).

    ``log(|rfft(x)| + 1e-3)``, standardised by a LayerNorm over all bins (invariant to circular
    shifts and to the amplitude scale), zero padded to k equal bands; band b has its own
    (band, d_model) weights and bias."""

    def __init__(self, length: int, k: int, d_model: int) -> None:
        super().__init__()
        self.bins = length // 2 + 1
        self.k, self.band = k, math.ceil(self.bins / k)
        self.norm = nn.LayerNorm(self.bins)
        self.weight = nn.Parameter(torch.randn(k, self.band, d_model) / math.sqrt(self.band))
        self.bias = nn.Parameter(torch.zeros(k, d_model))

    def forward(self, x: Tensor) -> Tensor:
        spec = torch.log(torch.fft.rfft(x, dim=-1).abs() + 1e-3)
        spec = F.pad(self.norm(spec), (0, self.k * self.band - self.bins))
        bands = spec.view(x.shape[0], self.k, self.band)
        return torch.einsum("bkn,knd->bkd", bands, self.weight) + self.bias


class InceptionStem(nn.Module):
    """One InceptionTime-style module on the raw series: (B, 1, L) -> (B, channels, L).

    Convolutions with kernels 9, 19 and 39 (same padding) and a max-pool (3) + 1×1 convolution,
    ``channels / 4`` each, concatenated, then batch norm and GELU."""

    KERNELS = (9, 19, 39)

    def __init__(self, channels: int) -> None:
        super().__init__()
        ch = channels // 4
        self.convs = nn.ModuleList(nn.Conv1d(1, ch, k, padding=k // 2, bias=False)
                                   for k in self.KERNELS)
        self.pool = nn.Sequential(nn.MaxPool1d(3, stride=1, padding=1),
                                  nn.Conv1d(1, ch, 1, bias=False))
        self.norm = nn.BatchNorm1d(4 * ch)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.cat([conv(x) for conv in self.convs] + [self.pool(x)], dim=1)
        return F.gelu(self.norm(h))


class FordATransformer(nn.Module):
    """Encoder-only linear-attention classifier for univariate series.

    ``(B, L) -> (B, n_classes)`` logits, L ≤ ``config.length`` (shorter series and a final
    partial patch are zero padded to whole patches). Tokens ``T = ceil(length / patch)``; each of
    ``depth`` pre-norm :class:`~linattn.nn.EncoderBlock` s has its own relative vectors
    (``max_len`` = tokens); mean over tokens, LayerNorm, linear to the logits. Optional
    variants (see :class:`ModelConfig`): a convolutional stem, per-patch spectra, and tokens of
    the global spectrum appended after the patches.
    """

    def __init__(self, config: ModelConfig | None = None, **overrides) -> None:
        super().__init__()
        if config is None:
            config = ModelConfig(**overrides)
        elif overrides:
            config = ModelConfig(**{**config.to_dict(), **overrides})
        config.validate()
        self.config = c = config
        self.spectral = SpectralPatches(c.patch, c.spectral_window) if c.spectral else None
        extra = self.spectral.out_features if self.spectral is not None else 0
        self.window = c.window or c.patch
        if c.stem == "linear":
            self.stem = None
            self.embed = nn.Linear(self.window + extra, c.d_model)
        elif c.stem == "inception":
            self.stem = InceptionStem(c.stem_channels)
            self.embed = nn.Linear(c.stem_channels * self.window + extra, c.d_model)
        else:
            ch = c.stem_channels
            self.stem = nn.Sequential(
                nn.Conv1d(1, ch, 7, padding=3),
                nn.BatchNorm1d(ch),
                nn.GELU(),
                nn.Conv1d(ch, ch, 5, padding=2),
                nn.BatchNorm1d(ch),
                nn.GELU(),
            )
            self.embed = nn.Linear(ch * self.window + extra, c.d_model)
        self.spectrum = None
        if c.spectrum_tokens:
            self.spectrum = SpectrumTokens(c.tokens * c.patch, c.spectrum_tokens, c.d_model)
        self.blocks = nn.ModuleList(
            EncoderBlock(c.d_model, c.heads, c.mlp_dim, head_dim=c.head_dim,
                         feature_map=c.feature_map, max_len=c.seq_len, dropout=c.dropout)
            for _ in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.n_classes)

    def tokens(self, x: Tensor) -> Tensor:
        """Token embeddings (B, seq_len, d_model) of series x: (B, L)."""
        c = self.config
        if x.dim() != 2:
            raise ValueError(f"x: expected shape (B, L), got {tuple(x.shape)}")
        if x.shape[1] > c.tokens * c.patch:
            raise ValueError(f"x: series length {x.shape[1]} exceeds the model's {c.length}")
        x = F.pad(x, (0, c.tokens * c.patch - x.shape[1]))
        B, T, w = x.shape[0], c.tokens, self.window
        h = x.unsqueeze(1) if self.stem is None else self.stem(x.unsqueeze(1))  # (B, C, L)
        if w == c.patch:
            feats = h.reshape(B, -1, T, c.patch)
        else:  # overlapping windows centred on the patches: (B, C, T, w)
            left = (w - c.patch) // 2
            h = F.pad(h, (left, w - c.patch - left))
            feats = h.unfold(-1, w, c.patch)
        feats = feats.permute(0, 2, 1, 3).reshape(B, T, -1)
        if self.spectral is not None:
            feats = torch.cat([feats, self.spectral(x)], dim=-1)
        h = self.embed(feats)
        if self.spectrum is not None:
            h = torch.cat([h, self.spectrum(x)], dim=1)
        return h

    def forward(self, x: Tensor) -> Tensor:
        h = self.tokens(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h.mean(dim=1)))

    def relative_kernels(self) -> Tensor:
        """Per block and head, the mean positional feature strength ``mean_ℓ φ(r_m)`` over lags:
        (depth, H, 2T−1) — what each head adds to a score per lag for an average query."""
        out = []
        for block in self.blocks:
            attn = block.attn
            fr = attn.feature_map.forward_keys(attn.rel.detach())
            out.append(fr.mean(-1))
        return torch.stack(out)

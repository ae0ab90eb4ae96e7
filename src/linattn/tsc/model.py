"""The FordA encoder: patch tokens → linear-attention encoder with relative positions → logits.

There is no positional encoding at the input: the only positional information is the learned
relative term ``φ(q_i)·φ(r_{j−i})`` inside each attention layer, so the model depends on where a
pattern sits only through lags between tokens, which suits series that are not aligned in time.

The experiments rejected on validation (convolutional / inception stems, global-spectrum tokens,
other spectral windows; docs/forda.md has their figures) were removed from the code after
linattn 0.1.0; the git history keeps them. Saved configurations that name them at their neutral
value still load (:func:`upgrade_saved`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn._config import (
    Removed,
    check_field_types,
    drop_removed,
    rename_deprecated,
    renamed_keywords,
)
from linattn.feature_maps import FEATURE_MAPS
from linattn.nn import EncoderBlock
from linattn.tsc.training import CheckpointError

__all__ = ["ModelConfig", "FordATransformer", "num_tokens", "RENAMED", "REMOVED_OPTIONS",
           "upgrade_saved", "check_field_types"]

#: Deprecated spellings of :class:`ModelConfig` fields (accepted with a DeprecationWarning in
#: saved configurations and as constructor keywords) → today's name.
RENAMED: dict[str, str] = {"depth": "num_layers", "heads": "num_heads"}


def _neutral_spectral_window(value: Any, saved: Mapping[str, Any]) -> bool:
    # 0 meant 2·patch, the window that stays; without spectral the option had no effect
    return value in (0, 2 * saved.get("patch", ModelConfig.patch)) or not saved.get("spectral")


#: Architecture options removed after linattn 0.1.0 → (test of the neutral value given the whole
#: saved dict, what the option was). A saved config may name them at their neutral value only.
REMOVED_OPTIONS: Removed = {
    "stem": (lambda v, d: v == "linear", "convolutional stems"),
    "stem_channels": (lambda v, d: True, "stem channels"),
    "spectrum_tokens": (lambda v, d: v == 0, "global-spectrum tokens"),
    "spectral_window": (_neutral_spectral_window, "spectral windows other than 2·patch"),
}


def num_tokens(length: int, patch: int) -> int:
    """Tokens for a series of ``length`` samples: ``ceil(length / patch)`` (zero padded)."""
    return max(1, math.ceil(length / patch))


def upgrade_saved(d: Mapping[str, Any], where: str, removed: Removed = REMOVED_OPTIONS) -> dict:
    """A saved dictionary in today's spelling: deprecated names renamed (DeprecationWarning),
    removed options dropped where they hold their neutral value. An option that was in use, or
    both spellings of a name, raise :class:`~linattn.train_loop.CheckpointError` (``where``
    names the file)."""
    out = drop_removed(d, removed, where, error=CheckpointError)
    try:
        return rename_deprecated(out, RENAMED, where, stacklevel=4)
    except TypeError as err:
        raise CheckpointError(str(err)) from None


@dataclass
class ModelConfig:
    """Everything that defines the architecture (saved as JSON beside the weights).

    ``length``: the longest series (samples); ``n_classes``: logits. ``patch``: samples per
    token. ``num_layers`` encoder blocks of ``num_heads`` heads of size ``head_dim`` on width
    ``d_model``, MLP width ``mlp_dim``, ``dropout``, ``feature_map`` (a name of
    :data:`linattn.feature_maps.FEATURE_MAPS`). ``window``: samples each token's embedding sees:
    0 = ``patch`` (disjoint patches, the reference); a larger window overlaps the neighbouring
    patches, centred on the token's patch (zero padded at the ends), stride ``patch``.
    ``spectral``: also feed each token the log-magnitude spectrum of a Hann window of ``2·patch``
    samples centred on its patch. ``circular``: the windows and spectra wrap around the ends
    instead of being zero padded, the series taken as a loop (as the circular-shift augmentation
    treats it), so the first and last tokens carry no padding that marks them; the loop is the
    series zero padded to whole patches (``tokens·patch`` samples), so a final partial patch
    keeps its zeros and they form the one seam (stride ``patch`` cannot tile a loop whose length
    is not a multiple of ``patch``). False (the default, and what configurations saved without
    the field mean) is zero padding. ``global_spectrum``: also add to every token an embedding
    (one linear layer) of the log-magnitude spectrum of the whole series (zero padded to
    ``tokens·patch`` samples) under one Hann window: a second spectral resolution, the same
    vector for every token, so it tells no token apart from another (no position).

    ``depth`` and ``heads`` are deprecated constructor keywords for ``num_layers`` and
    ``num_heads``.
    """

    length: int = 500
    n_classes: int = 2
    patch: int = 10
    d_model: int = 64
    num_layers: int = 3
    num_heads: int = 4
    head_dim: int = 16
    mlp_dim: int = 128
    dropout: float = 0.1
    feature_map: str = "elu"
    spectral: bool = False
    window: int = 0
    circular: bool = False
    global_spectrum: bool = False

    @property
    def tokens(self) -> int:
        """Tokens the encoder sees (patches)."""
        return num_tokens(self.length, self.patch)

    @property
    def embed_features(self) -> int:
        """Inputs of the token embedding: the window's samples, then the spectral bins."""
        return (self.window or self.patch) + (self.patch + 1 if self.spectral else 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "model config") -> ModelConfig:
        """A validated config from a saved dict: deprecated names are renamed, removed options
        at their neutral value dropped (:func:`upgrade_saved`); unknown keys, missing keys and
        wrong types or ranges are a ValueError naming the key."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        d = upgrade_saved(d, where)
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}")
        cfg = cls(**d)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "model config") -> None:
        """ValueError naming the field for a wrong type or a value out of range."""
        check_field_types(self.to_dict(), type(self), where)
        for name in ("length", "patch", "d_model", "num_layers", "num_heads", "head_dim",
                     "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}: {name} must be a positive integer, "
                                 f"got {getattr(self, name)!r}")
        if self.n_classes < 2:
            raise ValueError(f"{where}: n_classes must be at least 2, got {self.n_classes}")
        if self.window < 0 or (self.window and self.window < self.patch):
            raise ValueError(f"{where}: window must be 0 or an integer >= patch, "
                             f"got {self.window!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{where}: dropout must be in [0, 1), got {self.dropout!r}")
        if self.feature_map.lower() not in FEATURE_MAPS:
            raise ValueError(f"{where}: feature_map must be one of "
                             f"{', '.join(sorted(FEATURE_MAPS))}, got {self.feature_map!r}")


# the deprecated spellings as constructor keywords (the signature still shows the fields)
ModelConfig.__init__ = renamed_keywords(RENAMED, "ModelConfig")(ModelConfig.__init__)


def _windows(x: Tensor, size: int, step: int, circular: bool) -> Tensor:
    """Frames of ``size`` samples, one per ``step``, centred on the steps:
    (B, T·step) -> (B, T, size); frame t covers ``[t·step − left, t·step − left + size)`` with
    ``left = (size − step) // 2``. Outside the series: zeros, or with ``circular`` the series
    continued periodically (any ``size``, even one longer than the series)."""
    n = x.shape[-1]
    left = (size - step) // 2
    if not circular:
        return F.pad(x, (left, size - step - left)).unfold(-1, size, step)
    start = torch.arange(0, n, step, device=x.device) - left
    idx = (start[:, None] + torch.arange(size, device=x.device)) % n  # (T, size)
    return x[:, idx]


def log_magnitude(frames: Tensor) -> Tensor:
    """``log(|rfft(frames)|² + 1e-4) / 2`` along the last dimension (already tapered): silence
    and scale changes stay finite."""
    spec = torch.fft.rfft(frames, dim=-1)
    return 0.5 * torch.log(spec.real.square() + spec.imag.square() + 1e-4)


class SpectralPatches(nn.Module):
    """Per-token log-magnitude spectrum: (B, T·patch) -> (B, T, patch + 1).

    Token t sees the ``w = 2·patch`` samples centred on its patch, i.e.
    ``[t·p − p/2, t·p + 3p/2)`` (zero padded at the ends, or wrapped around them with
    ``circular``), under a Hann window; ``log(|rfft|² + 1e-4) / 2``, so silence and scale
    changes stay finite."""

    def __init__(self, patch: int, circular: bool = False) -> None:
        super().__init__()
        self.patch = patch
        self.size = 2 * patch
        self.circular = circular
        self.register_buffer("window", torch.hann_window(self.size, periodic=False),
                             persistent=False)

    @property
    def out_features(self) -> int:
        return self.size // 2 + 1

    def forward(self, x: Tensor) -> Tensor:
        return log_magnitude(_windows(x, self.size, self.patch, self.circular) * self.window)


class SeriesSpectrum(nn.Module):
    """Log-magnitude spectrum of the whole series under a Hann window:
    (B, N) -> (B, N // 2 + 1), :func:`log_magnitude` as in :class:`SpectralPatches`.

    The taper matters: a FordA series is cut out of a longer recording, and without it the jump
    between its ends leaks into every bin (docs/forda.md, "Baselines")."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(n, periodic=False), persistent=False)

    @property
    def out_features(self) -> int:
        return self.window.shape[0] // 2 + 1

    def forward(self, x: Tensor) -> Tensor:
        return log_magnitude(x * self.window)


class FordATransformer(nn.Module):
    """Encoder-only linear-attention classifier for univariate series.

    ``(B, L) -> (B, n_classes)`` logits, L ≤ ``config.length`` (shorter series and a final
    partial patch are zero padded to whole patches). Tokens ``T = ceil(length / patch)``, each
    embedded by one linear layer from its window of samples (and its spectrum with
    ``spectral``; both wrapped around the ends with ``circular``); each of ``num_layers``
    pre-norm :class:`~linattn.nn.EncoderBlock` s has its own relative vectors (``max_len`` = T);
    mean over tokens, LayerNorm, linear to the logits.

    With ``circular``, rolling a series of ``T·patch`` samples by a multiple of ``patch`` rolls
    the token features exactly. The logits still change a little: the relative lags ``j − i``
    are not circular (token 0 sees lags 0 … T−1, token T−1 sees −(T−1) … 0), so attention
    itself can still tell the ends apart.
    """

    def __init__(self, config: ModelConfig | None = None, **overrides) -> None:
        super().__init__()
        if config is None:
            config = ModelConfig(**overrides)
        elif overrides:
            overrides = rename_deprecated(overrides, RENAMED, "FordATransformer")
            config = ModelConfig(**{**config.to_dict(), **overrides})
        config.validate()
        self.config = c = config
        self.spectral = SpectralPatches(c.patch, c.circular) if c.spectral else None
        self.window = c.window or c.patch
        self.embed = nn.Linear(c.embed_features, c.d_model)
        self.series_spectrum = SeriesSpectrum(c.tokens * c.patch) if c.global_spectrum else None
        self.global_embed = (nn.Linear(self.series_spectrum.out_features, c.d_model)
                             if self.series_spectrum is not None else None)
        self.blocks = nn.ModuleList(
            EncoderBlock(c.d_model, c.num_heads, c.mlp_dim, head_dim=c.head_dim,
                         feature_map=c.feature_map, max_len=c.tokens, dropout=c.dropout)
            for _ in range(c.num_layers)
        )
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.n_classes)

    def padded(self, x: Tensor) -> Tensor:
        """Series x: (B, L), checked, zero padded to whole patches: (B, tokens·patch)."""
        c = self.config
        if x.dim() != 2:
            raise ValueError(f"x: expected shape (B, L), got {tuple(x.shape)}")
        if x.shape[1] > c.tokens * c.patch:
            raise ValueError(f"x: series length {x.shape[1]} exceeds the model's {c.length}")
        return F.pad(x, (0, c.tokens * c.patch - x.shape[1]))

    def token_features(self, x: Tensor) -> Tensor:
        """What the token embedding reads, (B, T, embed_features), of series x: (B, L): each
        token's window of samples, then its spectral bins."""
        return self._features(self.padded(x))

    def _features(self, x: Tensor) -> Tensor:
        c = self.config
        w = self.window
        if w == c.patch:
            feats = x.reshape(x.shape[0], c.tokens, c.patch)
        else:  # overlapping windows centred on the patches: (B, T, w)
            feats = _windows(x, w, c.patch, c.circular)
        if self.spectral is not None:
            feats = torch.cat([feats, self.spectral(x)], dim=-1)
        return feats

    def tokens(self, x: Tensor) -> Tensor:
        """Token embeddings (B, T, d_model) of series x: (B, L); with ``global_spectrum`` each
        plus the embedding of the series' spectrum."""
        x = self.padded(x)
        h = self.embed(self._features(x))
        if self.series_spectrum is not None:
            h = h + self.global_embed(self.series_spectrum(x))[:, None, :]
        return h

    def forward(self, x: Tensor) -> Tensor:
        h = self.tokens(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h.mean(dim=1)))

    def relative_kernels(self) -> Tensor:
        """Per block and head, the mean positional feature strength ``mean_ℓ φ(r_m)`` over lags:
        (num_layers, H, 2T−1) — what each head adds to a score per lag for an average query."""
        out = []
        for block in self.blocks:
            attn = block.attn
            fr = attn.feature_map.forward_keys(attn.rel.detach())
            out.append(fr.mean(-1))
        return torch.stack(out)

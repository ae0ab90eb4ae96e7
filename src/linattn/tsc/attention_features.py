"""Random linear-attention features: fixed, untrained attention heads over a series' tokens,
pooled into features a ridge can read (issue 27, round 14).

A learned token net overfits small training sets; a ridge on many fixed random features does
not (the ROCKET family's lesson). This applies that lesson to the mixer: ``heads`` linear
attention heads with random query and key maps relate every token to every other, and what
each head passes on is pooled over the tokens.

For tokens ``t_1 … t_S`` (standardised, F features each) head ``h`` computes

    q_s = φ(W_q t_s),  k_r = φ(W_k t_r)  (W_q, W_k: F -> key_dim, Gaussian / √F),
    φ(x) = exp(sharpness · x)  (a positive feature map: the kernel is a sum of exponentials),
    o_s = Σ_r (q_s · k_r) v_r / Σ_r (q_s · k_r),

with the value ``v_r`` a random subset of ``values`` of token ``r``'s own features, and with
``causal=True`` the sums over ``r ≤ s`` only (the order of the tokens then matters). Its
features are the mean and the maximum of ``o_s`` over ``s``: (n, heads · values · 2).

Replacing the attention by pooling (every weight equal) makes every ``o_s`` the tokens' mean,
and the features the pooled tokens' own: the ablation keeps nothing the head added.
"""

from __future__ import annotations

import numpy as np
import torch

from linattn.tsc.conv_tokens import at_least, check_param

__all__ = ["RandomAttentionFeatures"]

#: Series per chunk of the transform: bounds the (chunk, heads, S, S, key_dim) log weights in
#: memory (67 MB at the defaults and 16 tokens).
_CHUNK = 32


class RandomAttentionFeatures:
    """Fixed random linear-attention heads over tokens: (n, S, F) -> (n, heads · values · 2).

    ``heads``: attention heads; ``key_dim``: the query and key maps' width; ``values``: token
    features each head passes on; ``sharpness``: β of φ(x) = exp(βx) (0 gives every weight
    equal: the pooled tokens); ``causal``: each token attends to itself and the tokens before
    it only; ``random_state``: the draw of the maps and the value features.
    """

    def __init__(self, heads: int = 256, key_dim: int = 8, values: int = 8,
                 sharpness: float = 1.0, causal: bool = False, random_state: int = 0) -> None:
        for name, value, low in (("heads", heads, 1), ("key_dim", key_dim, 1),
                                 ("values", values, 1)):
            check_param("RandomAttentionFeatures", name, value, at_least(low))
        if not (isinstance(sharpness, int | float) and np.isfinite(sharpness)
                and sharpness >= 0):
            raise ValueError("RandomAttentionFeatures: sharpness must be a finite number >= 0, "
                             f"got {sharpness!r}")
        self.heads, self.key_dim, self.values = int(heads), int(key_dim), int(values)
        self.sharpness, self.causal = float(sharpness), bool(causal)
        self.random_state = random_state

    def fit(self, tokens: np.ndarray) -> RandomAttentionFeatures:
        """Draw the maps for tokens of ``tokens.shape[2]`` features (only the shape is read)."""
        tokens = _check_tokens(tokens, "RandomAttentionFeatures.fit")
        F = tokens.shape[2]
        g = torch.Generator().manual_seed(int(self.random_state or 0))
        scale = 1.0 / np.sqrt(F)
        self.query_ = torch.randn(F, self.heads * self.key_dim, generator=g) * scale
        self.key_ = torch.randn(F, self.heads * self.key_dim, generator=g) * scale
        # each head's own value features, without repeats within a head where F allows
        if F >= self.values:
            self.value_index_ = torch.stack([torch.randperm(F, generator=g)[:self.values]
                                             for _ in range(self.heads)])
        else:
            self.value_index_ = torch.randint(F, (self.heads, self.values), generator=g)
        self.n_token_features_ = F
        return self

    @property
    def n_features(self) -> int:
        return self.heads * self.values * 2

    def transform(self, tokens: np.ndarray) -> np.ndarray:
        """Features (n, heads · values · 2) float32: per head, the mean over the tokens of what
        it passes on, then the maximum."""
        if not hasattr(self, "query_"):
            raise RuntimeError("RandomAttentionFeatures: call fit before transform")
        tokens = _check_tokens(tokens, "RandomAttentionFeatures.transform")
        if tokens.shape[2] != self.n_token_features_:
            raise ValueError(f"RandomAttentionFeatures.transform: tokens have {tokens.shape[2]} "
                             f"features; fitted on {self.n_token_features_}")
        out = np.empty((len(tokens), self.n_features), dtype=np.float32)
        for i in range(0, len(tokens), _CHUNK):
            out[i:i + _CHUNK] = self._chunk(torch.from_numpy(tokens[i:i + _CHUNK])).numpy()
        return out

    def fit_transform(self, tokens: np.ndarray) -> np.ndarray:
        return self.fit(tokens).transform(tokens)

    def _chunk(self, t: torch.Tensor) -> torch.Tensor:
        n, S, _ = t.shape
        H, m = self.heads, self.key_dim
        q = (t @ self.query_).view(n, S, H, m).transpose(1, 2)  # (n, H, S, m)
        k = (t @ self.key_).view(n, S, H, m).transpose(1, 2)
        # q_s · k_r = Σ_m exp(β(q_sm + k_rm)), taken in log space: far-out tokens (a feature
        # that hardly varied in training, standardised) would otherwise underflow every
        # weight of a row to 0 and make 0 / 0
        logits = torch.logsumexp(self.sharpness * (q[:, :, :, None] + k[:, :, None]), -1)
        if self.causal:
            logits = logits.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -torch.inf)
        # a constant per row cancels in the ratio: the largest weight of each row becomes 1
        weights = torch.exp(logits - logits.amax(-1, keepdim=True))  # (n, H, S, S)
        v = t[:, :, self.value_index_].permute(0, 2, 1, 3)  # (n, H, S, values)
        o = (weights @ v) / weights.sum(-1, keepdim=True)  # (n, H, S, values)
        return torch.cat([o.mean(2), o.amax(2)], -1).reshape(n, -1)


def _check_tokens(tokens, where: str) -> np.ndarray:
    tokens = np.ascontiguousarray(tokens, dtype=np.float32)
    if tokens.ndim != 3 or 0 in tokens.shape:
        raise ValueError(f"{where}: tokens must be a non-empty (n, S, F) array, got shape "
                         f"{tokens.shape}")
    if not np.isfinite(tokens).all():
        raise ValueError(f"{where}: tokens contain NaN or infinite values")
    return tokens

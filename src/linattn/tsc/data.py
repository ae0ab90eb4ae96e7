"""Data helpers for time-series classification: splits, label encoding, augmentation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

# torch is imported where it is used: `linattn forda` reads a run's split before loading torch
if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["stratified_split", "validation_split", "encode_labels", "augment", "epoch_generator",
           "fill_nan_padding", "MISSING", "VAL_FRACTION", "VAL_SEED"]

#: The validation split every FordA choice is made on: this fraction of each class of TRAIN,
#: drawn with this seed. `forda train`'s val stage and `forda evaluate --split val` both use
#: :func:`validation_split`, so they cannot drift apart.
VAL_FRACTION = 0.2
VAL_SEED = 0


def stratified_split(
    y: np.ndarray, val_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, val)``: ``round(val_fraction · n_c)`` of each class c go to val
    (at least one where the class has two or more members); both sorted."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    rng = np.random.default_rng(seed)
    y = np.asarray(y)
    val = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        k = int(round(val_fraction * len(idx)))
        if len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        else:
            k = 0
        val.append(idx[:k])
    val_idx = np.sort(np.concatenate(val))
    train_idx = np.setdiff1d(np.arange(len(y)), val_idx)
    return train_idx, val_idx


def validation_split(y: np.ndarray, seed: int = VAL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, val)`` of the standard validation split: :func:`stratified_split` with
    :data:`VAL_FRACTION` and ``seed`` (default :data:`VAL_SEED`)."""
    return stratified_split(y, VAL_FRACTION, seed=seed)


def real_series(X, where: str):
    """``X`` (as an array when it is a list); a one-line ValueError naming ``where`` for
    complex values. Cast to float32 their imaginary part is dropped (the convolutional
    estimator did so silently, and scikit-learn's check refused them in 15 lines)."""
    if not hasattr(X, "dtype"):  # a list; arrays and sparse matrices (refused later, by
        X = np.asarray(X)        # scikit-learn's check, in its words) keep their type
    if X.ndim != 2:  # scikit-learn's refusal spans lines and prints the array
        raise ValueError(f"{where}: X must have shape (n_series, length), got {X.shape} "
                         "(Reshape your data: X.reshape(1, -1) for one series)")
    if np.issubdtype(np.dtype(X.dtype), np.complexfloating):
        # scikit-learn's wording opens the line (its estimator checks look for it)
        raise ValueError(f"{where}: Complex data not supported: X holds {X.dtype} values; the "
                         "series must be real numbers")
    return X


def encode_labels(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)``: the sorted distinct labels and each label's index among them."""
    classes, codes = np.unique(np.asarray(y), return_inverse=True)
    return classes, codes.astype(np.int64)


#: What :func:`fill_nan_padding` (and the estimator's ``missing``) may do with NaN inside a
#: series: refuse it, or interpolate linearly along time.
MISSING = ("error", "interpolate")


def fill_nan_padding(X: np.ndarray, name: str = "X", missing: str = "error",
                     first_line: int | None = None) -> np.ndarray:
    """Series (n, L) with the UCR archive's convention for variable length, trailing NaN after
    a shorter series, turned into zeros: the padding the model gives a series shorter than
    its length anyway. NaN inside a series (a missing value: NaN before the row's last value)
    is refused in one line naming ``name``, the row and the sample (``missing="error"``), or
    replaced by linear interpolation between the row's neighbouring values, the first value
    repeated before it (``missing="interpolate"``). A row of NaN only and infinities are
    always refused. Returns ``X`` itself when it is all finite, else a copy. With
    ``first_line``, ``name`` is a file whose row i is line ``i + first_line``, and the
    messages say so (``FordA_TRAIN.tsv line 4: ...``)."""

    def row(i: int) -> str:
        return f"{name}: row {i}" if first_line is None else f"{name} line {i + first_line}"

    if missing not in MISSING:
        raise ValueError(f"missing: expected one of {MISSING}, got {missing!r}")
    X = np.asarray(X)
    finite = np.isfinite(X)
    if finite.all():
        return X
    inf = np.isinf(X)
    if inf.any():
        i, j = np.argwhere(inf)[0]
        raise ValueError(f"{row(i)} holds an infinite value (sample {j}); only finite "
                         "values and NaN are accepted")
    nan = ~finite
    # a row's valid length: up to its last non-NaN sample; NaN before that is a missing value
    length = X.shape[1] - np.argmax(~nan[:, ::-1], axis=1)
    length[nan.all(axis=1)] = 0
    empty = np.flatnonzero(length == 0)
    if len(empty):
        raise ValueError(f"{row(empty[0])} is all NaN (an empty series); drop it")
    inner = nan & (np.arange(X.shape[1]) < length[:, None])
    if inner.any() and missing == "error":
        i, j = np.argwhere(inner)[0]
        raise ValueError(
            f"{row(i)} has a missing value (NaN) at sample {j}, inside the series; pass "
            "missing='interpolate' or impute first, e.g. make_pipeline(SimpleImputer(), "
            "LinearAttentionClassifier()) (trailing NaN, variable-length padding, is accepted)")
    out = np.where(nan, np.zeros((), X.dtype), X)
    t = np.arange(X.shape[1])
    for i in np.flatnonzero(inner.any(axis=1)):
        ok = ~nan[i]
        out[i, inner[i]] = np.interp(t[inner[i]], t[ok], X[i, ok])
    return out


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of one epoch's shuffle and augmentation: a function of (seed, epoch) only,
    so a resumed run draws exactly what an uninterrupted one would."""
    import torch

    return torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7919) % (2**63))


def augment(
    x: Tensor, shifts: Tensor | None, scales: Tensor | None
) -> Tensor:
    """Circular time shift by ``shifts[b]`` samples and amplitude scale by ``scales[b]``.

    x: (B, L); shifts: (B,) int64 or None; scales: (B,) or None."""
    import torch

    if shifts is not None:
        L = x.shape[1]
        idx = (torch.arange(L).unsqueeze(0) - shifts.unsqueeze(1)) % L
        x = x.gather(1, idx)
    if scales is not None:
        x = x * scales.unsqueeze(1).to(x.dtype)
    return x

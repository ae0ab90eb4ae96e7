"""A scikit-learn classifier around :class:`~linattn.tsc.model.FordATransformer`.

``LinearAttentionClassifier`` takes ``X`` of shape (n_series, length) (any length: the series is
zero padded to whole patches) and labels of any type and number of classes; ``predict`` returns
labels in their original encoding. ``save(dir)`` writes ``model.safetensors`` (weights) and
``config.json`` (hyper-parameters, architecture, classes) — no pickle — and
``LinearAttentionClassifier.load(dir)`` restores an estimator with identical predictions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from linattn._io import atomic_path
from linattn.tsc.data import encode_labels
from linattn.tsc.model import FordATransformer, ModelConfig
from linattn.tsc.training import CheckpointError, TrainConfig, Trainer, predict_logits, write_json

__all__ = ["LinearAttentionClassifier", "FORMAT"]

#: The ``format`` field of a saved model's config.json.
FORMAT = "linattn.tsc.LinearAttentionClassifier/1"

_MODEL_PARAMS = ("patch", "d_model", "depth", "heads", "head_dim", "mlp_dim", "dropout",
                 "feature_map", "stem", "stem_channels", "spectral", "spectrum_tokens", "window",
                 "spectral_window")
_TRAIN_PARAMS = ("epochs", "batch_size", "lr", "weight_decay", "pct_start", "label_smoothing",
                 "clip", "shift", "scale_low", "scale_high", "mixup", "cutmix")


class _ThreadLimit:
    """Run a block with ``torch.set_num_threads(n)`` (None: leave as is), then restore."""

    def __init__(self, n: int | None) -> None:
        self.n, self.old = n, None

    def __enter__(self):
        if self.n is not None:
            self.old = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.old is not None:
            torch.set_num_threads(self.old)


class LinearAttentionClassifier(ClassifierMixin, BaseEstimator):
    """Linear-attention transformer for time-series classification (scikit-learn API).

    The defaults are the FordA reference recipe: patches of 10 samples → d_model 64, 3 pre-norm
    blocks of 4-head linear attention (d = 16, 1+elu, relative positions, no input positions),
    MLP 128, dropout 0.1, mean pooling; AdamW (wd 0.05), one-cycle LR to 1e-3, batch 64, label
    smoothing 0.05, clipping at 1, 80 epochs, random circular shifts and amplitude scaling
    U(0.8, 1.2). Variants (off by default): ``stem`` "conv" / "inception", ``window`` (overlapping
    patch embedding), ``spectral`` (with ``spectral_window``), ``spectrum_tokens`` (see
    :class:`~linattn.tsc.model.ModelConfig`); ``mixup`` / ``cutmix`` (see
    :class:`~linattn.tsc.training.TrainConfig`).

    ``tta``: number of circular shifts averaged at prediction time (1 = none), spread evenly over
    the series. ``random_state``: seeds initialisation, shuffling, augmentation and dropout.
    ``n_threads``: torch threads during fit/predict (None: torch's setting).
    """

    def __init__(
        self,
        *,
        patch: int = 10,
        d_model: int = 64,
        depth: int = 3,
        heads: int = 4,
        head_dim: int = 16,
        mlp_dim: int = 128,
        dropout: float = 0.1,
        feature_map: str = "elu",
        stem: str = "linear",
        stem_channels: int = 32,
        spectral: bool = False,
        spectrum_tokens: int = 0,
        window: int = 0,
        spectral_window: int = 0,
        epochs: int = 80,
        batch_size: int = 64,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        pct_start: float = 0.3,
        label_smoothing: float = 0.05,
        clip: float = 1.0,
        shift: bool = True,
        scale_low: float = 0.8,
        scale_high: float = 1.2,
        mixup: float = 0.0,
        cutmix: float = 0.0,
        tta: int = 1,
        random_state: int = 0,
        n_threads: int | None = None,
        verbose: bool = False,
    ) -> None:
        self.patch, self.d_model, self.depth, self.heads = patch, d_model, depth, heads
        self.head_dim, self.mlp_dim, self.dropout = head_dim, mlp_dim, dropout
        self.feature_map, self.stem, self.stem_channels = feature_map, stem, stem_channels
        self.spectral, self.spectrum_tokens, self.window = spectral, spectrum_tokens, window
        self.spectral_window = spectral_window
        self.epochs, self.batch_size, self.lr = epochs, batch_size, lr
        self.weight_decay, self.pct_start = weight_decay, pct_start
        self.label_smoothing, self.clip = label_smoothing, clip
        self.shift, self.scale_low, self.scale_high = shift, scale_low, scale_high
        self.mixup, self.cutmix = mixup, cutmix
        self.tta, self.random_state, self.n_threads = tta, random_state, n_threads
        self.verbose = verbose

    # -- configuration --------
    def model_config(self, length: int, n_classes: int) -> ModelConfig:
        cfg = ModelConfig(length=int(length), n_classes=int(n_classes),
                          **{k: getattr(self, k) for k in _MODEL_PARAMS})
        cfg.validate()
        return cfg

    def train_config(self) -> TrainConfig:
        seed = self.random_state
        if seed is None:
            seed = 0
        if not isinstance(seed, (int, np.integer)):
            raise ValueError("random_state: expected an int (a RandomState instance is not "
                             f"supported), got {type(seed).__name__}")
        for name in ("mixup", "cutmix"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name}: expected a number >= 0 (0 = off), got {v!r}")
        if self.mixup and self.cutmix:
            raise ValueError("mixup and cutmix: use at most one of them")
        return TrainConfig(seed=int(seed), **{k: getattr(self, k) for k in _TRAIN_PARAMS})

    def _tta_shifts(self) -> tuple[int, ...]:
        k = int(self.tta)
        if k < 1:
            raise ValueError(f"tta: expected a positive integer, got {self.tta!r}")
        L = self.n_features_in_
        return tuple(sorted({round(i * L / k) for i in range(k)}))

    # -- scikit-learn API --------
    def fit(self, X, y, **trainer_kwargs):
        """Train on X: (n, length), y: (n,). Extra keyword arguments go to
        :class:`~linattn.tsc.training.Trainer` (``X_val``, ``checkpoint_dir``, ``progress`` …)."""
        X, y = validate_data(self, X, y, dtype=np.float32, ensure_min_samples=2)
        check_classification_targets(y)
        classes, codes = encode_labels(y)
        if len(classes) < 2:
            raise ValueError(f"y: needs samples of at least 2 classes, got 1 class ({classes[0]})")
        self.classes_ = classes
        config = self.model_config(X.shape[1], len(classes))
        tcfg = self.train_config()
        resume = trainer_kwargs.pop("resume", False)
        if trainer_kwargs.get("y_val") is not None:
            yv = np.asarray(trainer_kwargs["y_val"])
            unseen = np.setdiff1d(yv, classes)
            if len(unseen):
                raise ValueError(f"y_val: labels not in y: {unseen[:5].tolist()}")
            trainer_kwargs["y_val"] = np.searchsorted(classes, yv)
        with _ThreadLimit(self.n_threads):
            torch.manual_seed(tcfg.seed)
            self.model_ = FordATransformer(config)
            trainer = Trainer(self.model_, X, codes, tcfg, progress=self.verbose,
                              **trainer_kwargs)
            resumed = trainer.load_checkpoint() if resume else False
            metrics = trainer.metrics_path
            if not resumed and metrics is not None and metrics.exists():
                metrics.unlink()  # a fresh start logs from epoch 1
            self.history_ = trainer.run()
        self.model_.eval()
        return self

    def _logits(self, X) -> torch.Tensor:
        check_is_fitted(self, "model_")
        X = validate_data(self, X, dtype=np.float32, reset=False)
        with _ThreadLimit(self.n_threads):
            return predict_logits(self.model_, X, shifts=self._tta_shifts())

    def predict_proba(self, X) -> np.ndarray:
        """(n, n_classes) class probabilities, columns in the order of ``classes_``."""
        return torch.softmax(self._logits(X), -1).double().numpy()

    def predict_log_proba(self, X) -> np.ndarray:
        return torch.log_softmax(self._logits(X), -1).double().numpy()

    def predict(self, X) -> np.ndarray:
        """Predicted labels, in the encoding of the ``y`` given to :meth:`fit`."""
        codes = self._logits(X).argmax(-1).numpy()
        return self.classes_[codes]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags

    # -- persistence --------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into folder ``path`` (created)."""
        from safetensors.torch import save_file

        check_is_fitted(self, "model_")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = {k: v.detach().contiguous() for k, v in self.model_.state_dict().items()}
        with atomic_path(path / "model.safetensors") as tmp:
            save_file(weights, str(tmp))
        classes = self.classes_.tolist()
        write_json(path / "config.json", {
            "format": FORMAT,
            "params": self.get_params(),
            "model": self.model_.config.to_dict(),
            "classes": classes,
            "classes_dtype": self.classes_.dtype.str,
            "n_features_in": int(self.n_features_in_),
        })
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> LinearAttentionClassifier:
        """Restore an estimator written by :meth:`save`. Raises CheckpointError (a ValueError)
        naming the file for a missing folder, a missing or corrupt file."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such model folder")
        cfg_path, w_path = path / "config.json", path / "model.safetensors"
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise CheckpointError(f"{p}: missing (not a saved LinearAttentionClassifier)")
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{cfg_path}: not valid JSON ({err})") from None
        if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
            raise CheckpointError(f"{cfg_path}: not a {FORMAT} config")
        try:
            est = cls(**cfg["params"])
            model_cfg = ModelConfig.from_dict(cfg["model"])
            classes = np.asarray(cfg["classes"], dtype=np.dtype(cfg["classes_dtype"]))
            n_features = int(cfg["n_features_in"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{cfg_path}: invalid config ({err})") from None
        try:
            weights = load_file(str(w_path))
        except (OSError, SafetensorError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{w_path}: corrupt weights file ({err})") from None
        model = FordATransformer(model_cfg)
        try:
            model.load_state_dict(weights)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0]
            raise CheckpointError(f"{w_path}: weights do not fit the config ({first})") from None
        model.eval()
        est.model_, est.classes_, est.n_features_in_ = model, classes, n_features
        return est

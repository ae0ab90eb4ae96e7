"""Evaluation of a trained classifier: metrics, the two logistic-regression baselines, plots and
a markdown report."""

from __future__ import annotations

import json
import numbers
from pathlib import Path

import numpy as np

from linattn._io import atomic_path, write_atomic
from linattn.train_loop import CheckpointError
from linattn.tsc.data import VAL_FRACTION, VAL_SEED, encode_labels, stratified_split
from linattn.tsc.metrics import accuracy, confusion_matrix, macro_f1, roc_auc

__all__ = ["classification_metrics", "log_spectrum", "spectrum_features", "SPECTRUM_GRID",
           "tune_spectrum_baseline", "describe_choice", "baselines", "read_metrics",
           "plot_curves", "plot_confusion", "plot_kernels", "write_report"]


def classification_metrics(classes: np.ndarray, y_true: np.ndarray, proba: np.ndarray) -> dict:
    """Accuracy, macro F1, confusion matrix (rows true, columns predicted, in ``classes`` order)
    and ROC AUC of class probabilities ``proba`` (n, n_classes) against labels ``y_true``."""
    codes = np.searchsorted(classes, y_true)
    pred = proba.argmax(1)
    k = len(classes)
    return {
        "n": int(len(y_true)),
        "accuracy": accuracy(codes, pred),
        "macro_f1": macro_f1(codes, pred, k),
        "roc_auc": roc_auc(codes, proba),
        "confusion_matrix": confusion_matrix(codes, pred, k).tolist(),
        "classes": classes.tolist(),
    }


def log_spectrum(X: np.ndarray) -> np.ndarray:
    """log(|rfft(x)| + 1e-6) of each series: (n, L) -> (n, L // 2 + 1). Invariant to circular
    shifts, which is why it works on series that are not aligned in time."""
    return np.log(np.abs(np.fft.rfft(np.asarray(X, dtype=np.float64), axis=1)) + 1e-6)


#: The choices the tuned spectral baseline makes on the validation split: the taper applied
#: before the FFT, how the magnitudes are scaled, the fraction of the frequency bins kept (the
#: lowest ones) and the inverse regularisation strength C of the logistic regression.
SPECTRUM_GRID: dict[str, tuple] = {
    "window": ("none", "hann"),
    "scale": ("log-magnitude", "magnitude"),
    "keep": (1.0, 0.5),
    "C": (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0),
}


def spectrum_features(X: np.ndarray, window: str = "none", scale: str = "log-magnitude",
                      keep: float = 1.0) -> np.ndarray:
    """Spectral features of each series X (n, L): ``|rfft|`` of the series (times a Hann taper
    with ``window="hann"``), as is (``scale="magnitude"``) or as ``log(|·| + 1e-6)``
    (``"log-magnitude"``), the lowest ``ceil(keep · (L // 2 + 1))`` bins. ``window="none"``,
    ``scale="log-magnitude"``, ``keep=1`` is :func:`log_spectrum`."""
    if window not in SPECTRUM_GRID["window"]:
        raise ValueError(f"window: expected one of {SPECTRUM_GRID['window']}, got {window!r}")
    if scale not in SPECTRUM_GRID["scale"]:
        raise ValueError(f"scale: expected one of {SPECTRUM_GRID['scale']}, got {scale!r}")
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
        raise ValueError(f"keep: expected a fraction in (0, 1], got {keep!r}")
    X = np.asarray(X, dtype=np.float64)
    if window == "hann":
        X = X * np.hanning(X.shape[1])
    mag = np.abs(np.fft.rfft(X, axis=1))
    mag = mag[:, : max(1, int(np.ceil(keep * mag.shape[1])))]
    return np.log(mag + 1e-6) if scale == "log-magnitude" else mag


def _logistic(C: float = 1.0, max_iter: int = 5000):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))


def tune_spectrum_baseline(X_train, y_train, X_test=None, y_test=None, *,
                           val_fraction: float = VAL_FRACTION, seed: int = VAL_SEED,
                           grid: dict[str, tuple] | None = None) -> dict:
    """The spectral logistic regression with its choices made on the validation split.

    Every combination of ``grid`` (default :data:`SPECTRUM_GRID`: taper, scaling, bins kept,
    C) is fitted on the training part of the validation split of TRAIN and scored (macro F1)
    on its validation part; the best one (the first in grid order on ties, C ascending, so the
    stronger regularisation wins a tie) is refitted on all of TRAIN and, if X_test is given,
    scores TEST once. Returns ``{"choice": {...}, "val_f1", "test_f1" (with X_test),
    "grid": [{**combination, "val_f1"}, ...]}``."""
    import itertools

    grid = dict(SPECTRUM_GRID if grid is None else grid)
    missing = sorted(set(SPECTRUM_GRID) - set(grid)) + sorted(set(grid) - set(SPECTRUM_GRID))
    if missing or any(not isinstance(v, (tuple, list)) or not v for v in grid.values()):
        raise ValueError(f"grid: expected non-empty tuples for exactly "
                         f"{', '.join(SPECTRUM_GRID)}, got {sorted(grid)}")
    classes, codes = encode_labels(y_train)
    tr, va = stratified_split(codes, val_fraction, seed=seed)
    rows, best = [], None
    feats = {}
    for window, scale, keep in itertools.product(grid["window"], grid["scale"], grid["keep"]):
        F = feats[window, scale, keep] = spectrum_features(X_train, window, scale, keep)
        for C in sorted(grid["C"]):
            clf = _logistic(C).fit(F[tr], codes[tr])
            f1 = macro_f1(codes[va], clf.predict(F[va]), len(classes))
            rows.append({"window": window, "scale": scale, "keep": keep, "C": C, "val_f1": f1})
            if best is None or f1 > best["val_f1"]:
                best = rows[-1]
    choice = {k: best[k] for k in SPECTRUM_GRID}
    out = {"choice": choice, "val_f1": best["val_f1"], "grid": rows}
    if X_test is not None:
        spec = {k: choice[k] for k in ("window", "scale", "keep")}
        clf = _logistic(choice["C"]).fit(feats[tuple(spec.values())], codes)
        pred = clf.predict(spectrum_features(X_test, **spec))
        out["test_f1"] = macro_f1(np.searchsorted(classes, y_test), pred, len(classes))
    return out


def describe_choice(choice: dict) -> str:
    """A tuned baseline's choice in words, e.g. ``hann, log-magnitude, all bins, C = 0.01``."""
    bins = "all bins" if choice["keep"] == 1 else f"lowest {choice['keep']:g} of the bins"
    return f"{choice['window']} window, {choice['scale']}, {bins}, C = {choice['C']:g}"


def baselines(X_train, y_train, X_test=None, y_test=None, *,
              val_fraction: float = VAL_FRACTION, seed: int = VAL_SEED,
              tuned: bool = True, threads: int | None = 1) -> dict:
    """Logistic regression (standardised features, C = 1) on raw samples and on the
    log-magnitude spectrum (untuned, as before), and, with ``tuned``, the spectral one whose
    taper, scaling, bins and C were chosen on the validation split
    (:func:`tune_spectrum_baseline`; its row also holds ``choice``). Validation figures use the
    validation split of TRAIN (by default :func:`~linattn.tsc.data.validation_split`, the one
    training uses; pass a run's recorded ``val_fraction`` and ``seed``); test figures (if
    X_test is given) are fitted on all of TRAIN. ``threads``: BLAS / OpenMP threads of the
    fits (None: the libraries' default); the default 1 because these small fits gain nothing
    from more, and on a busy 2-core machine two spinning BLAS threads made them 20× slower
    (236 s instead of 10 s for FordA, load ≈ 7)."""
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

    with threadpool_limits(limits=threads):
        return _baselines(X_train, y_train, X_test, y_test, val_fraction, seed, tuned)


def _baselines(X_train, y_train, X_test, y_test, val_fraction: float, seed: int,
               tuned: bool) -> dict:
    classes, codes = encode_labels(y_train)
    tr, va = stratified_split(codes, val_fraction, seed=seed)
    out = {}
    for name, feat in (("raw samples", np.asarray), ("log-magnitude spectrum", log_spectrum)):
        F_train = feat(X_train)
        clf = _logistic(max_iter=2000)  # as in linattn 0.1: the untuned figures stay put
        clf.fit(F_train[tr], codes[tr])
        row = {"val_f1": macro_f1(codes[va], clf.predict(F_train[va]), len(classes))}
        if X_test is not None:
            clf.fit(F_train, codes)
            pred = clf.predict(feat(X_test))
            row["test_f1"] = macro_f1(np.searchsorted(classes, y_test), pred, len(classes))
        out[name] = row
    if tuned:
        t = tune_spectrum_baseline(X_train, y_train, X_test, y_test,
                                   val_fraction=val_fraction, seed=seed)
        row = {k: t[k] for k in ("val_f1", "test_f1", "choice") if k in t}
        out[f"spectrum tuned on validation ({describe_choice(t['choice'])})"] = row
    return out


#: The fields of a ``metrics.jsonl`` record the report reads: required, optional.
_RECORD_FIELDS = (("epoch", "train_loss", "time_s"), ("val_loss", "val_acc", "val_f1"))


def read_metrics(path: Path) -> list[dict]:
    """The records of a training stage's ``metrics.jsonl`` (none if there is no file);
    :class:`~linattn.train_loop.CheckpointError` naming the file and line for one that is not
    a training record (malformed JSON, missing or non-numeric fields)."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text") from None
    records = []
    required, optional = _RECORD_FIELDS
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            r = None
        ok = isinstance(r, dict) and all(
            isinstance(r.get(k), numbers.Real) and not isinstance(r.get(k), bool)
            for k in required) and all(
            r.get(k) is None or (isinstance(r[k], numbers.Real) and not isinstance(r[k], bool))
            for k in optional)
        if not ok:
            raise CheckpointError(f"{path}: line {i}: not a training record")
        records.append(r)
    return records


def _save_figure(fig, path: Path) -> Path:
    """``fig`` laid out and saved as PNG ``path``, atomically (no half-written file on a full
    disk), then closed (also when saving fails). Returns path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=90)
    finally:
        plt.close(fig)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(stages: dict[str, list[dict]], path: Path) -> Path | None:
    """Training loss (and validation F1 where recorded) per epoch for each stage."""
    if not any(stages.values()):
        return None
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, hist in stages.items():
        ep = [r["epoch"] for r in hist]
        ax1.plot(ep, [r["train_loss"] for r in hist], label=f"{name}: train loss")
        if any("val_loss" in r for r in hist):
            ax1.plot(ep, [r.get("val_loss") for r in hist], "--", label=f"{name}: val loss")
            ax2.plot(ep, [r.get("val_f1") for r in hist], label=f"{name}: val macro F1")
    ax1.set_xlabel("epoch"), ax1.set_ylabel("cross-entropy"), ax1.legend()
    ax2.set_xlabel("epoch"), ax2.set_ylabel("macro F1"), ax2.set_ylim(0.5, 1.0)
    if ax2.lines:
        ax2.legend()
    return _save_figure(fig, path)


def plot_confusion(cm: list[list[int]], classes: list, path: Path) -> Path:
    plt = _plt()
    cm = np.asarray(cm)
    fig, ax = plt.subplots(figsize=(3.6, 3.2))
    ax.imshow(cm, cmap="Blues")
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center",
                    color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_xticks(range(len(classes)), [str(c) for c in classes])
    ax.set_yticks(range(len(classes)), [str(c) for c in classes])
    ax.set_xlabel("predicted"), ax.set_ylabel("true"), ax.set_title("confusion matrix")
    return _save_figure(fig, path)


def plot_kernels(kernels: np.ndarray, patch: int, path: Path) -> Path:
    """kernels: (num_layers, H, 2T−1) mean φ(r_m) per block and head, plotted against the lag in
    samples (m · patch)."""
    plt = _plt()
    num_layers, heads, n = kernels.shape
    T = (n + 1) // 2
    lags = (np.arange(n) - (T - 1)) * patch
    fig, axes = plt.subplots(1, num_layers, figsize=(3.6 * num_layers, 3.0), squeeze=False)
    for b in range(num_layers):
        ax = axes[0, b]
        for h in range(heads):
            ax.plot(lags, kernels[b, h], label=f"head {h}")
        ax.set_title(f"block {b + 1}: mean φ(r) per lag")
        ax.set_xlabel("lag j − i (samples)")
    axes[0, 0].legend(fontsize=7)
    return _save_figure(fig, path)


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.4f}"


def write_report(out: Path, *, run: dict, test: dict, base: dict, stages: dict[str, list[dict]],
                 kernels: np.ndarray, patch: int, split: str = "test") -> Path:
    """report.md with its plots in folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    curves = plot_curves(stages, out / "training_curves.png")
    plot_confusion(test["confusion_matrix"], test["classes"], out / "confusion_matrix.png")
    plot_kernels(kernels, patch, out / "relative_kernels.png")
    cm = test["confusion_matrix"]
    pct = round(100 * run.get("val_split", {}).get("fraction", VAL_FRACTION))
    lines = [
        "# FordA: linear-attention transformer", "",
        f"Model: `{run.get('model_dir', '')}` — recipe `{run.get('recipe', '?')}`, "
        f"seed {run.get('seed', '?')}, {run.get('n_params', '?')} parameters.", "",
        ("## Test set (evaluated once for this configuration)" if split == "test" else
         f"## Validation split (stratified {pct}% of TRAIN), validation-stage model(s)"), "",
        "| metric | value |", "| --- | --- |",
        f"| accuracy | {test['accuracy']:.4f} |",
        f"| macro F1 | {test['macro_f1']:.4f} |",
        f"| ROC AUC | {test['roc_auc']:.4f} |",
        f"| series | {test['n']} |", "",
        f"Confusion matrix on {split} (rows true, columns predicted, classes "
        f"{', '.join(str(c) for c in test['classes'])}): `{cm}`", "",
        "![confusion matrix](confusion_matrix.png)", "",
    ]
    val = stages.get("val") or []
    if val:
        last = val[-1]
        lines += [f"## Validation (stratified {100 - pct}/{pct} split of TRAIN)", "",
                  f"Final epoch {last['epoch']}: macro F1 {_fmt(last.get('val_f1'))}, "
                  f"accuracy {_fmt(last.get('val_acc'))}, loss {_fmt(last.get('val_loss'))}; "
                  f"training time {last['time_s']:.0f} s.", ""]
    full = stages.get("full") or []
    if full:
        lines += [f"Final model trained on all of TRAIN: {full[-1]['epoch']} epochs, "
                  f"{full[-1]['time_s']:.0f} s.", ""]
    if "wall_s" in run:
        lines += [f"Wall time of `linattn forda train`: {run['wall_s']:.0f} s "
                  f"({run.get('threads', '?')} thread(s)).", ""]
    if curves is not None:
        lines += ["![training curves](training_curves.png)", ""]
    lines += ["## Baselines (logistic regression, standardised features; C = 1 unless tuned)",
              "",
              "| features | validation macro F1 | test macro F1 |", "| --- | --- | --- |"]
    for name, row in base.items():
        lines.append(f"| {name} | {_fmt(row.get('val_f1'))} | {_fmt(row.get('test_f1'))} |")
    lines += ["", "## Learned relative-position kernels", "",
              "Mean over features of φ(r_m) for every lag m, per block and head: how much each "
              "head's positional term adds to the score of a key m patches away.", "",
              "![relative kernels](relative_kernels.png)", ""]
    path = out / "report.md"
    write_atomic(path, "\n".join(lines).encode())
    return path

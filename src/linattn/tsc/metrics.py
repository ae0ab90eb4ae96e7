"""Classification metrics in NumPy (no scikit-learn needed while training)."""

from __future__ import annotations

import numpy as np

__all__ = ["confusion_matrix", "macro_f1", "accuracy", "roc_auc"]


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = true class, columns = predicted (integer codes)."""
    cm = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(cm, (np.asarray(y_true), np.asarray(y_pred)), 1)
    return cm


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> float:
    """Unweighted mean over classes of F1 = 2·TP / (2·TP + FP + FN) (0 for an absent class)."""
    cm = confusion_matrix(y_true, y_pred, n_classes)
    tp = np.diag(cm).astype(np.float64)
    denom = cm.sum(0) + cm.sum(1)
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float(f1.mean())


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def roc_auc(y_true: np.ndarray, proba: np.ndarray) -> float:
    """ROC AUC: binary from the positive-class column, else the unweighted one-vs-rest mean.
    Mann–Whitney form with average ranks for ties. proba: (n, n_classes)."""
    y_true = np.asarray(y_true)
    proba = np.asarray(proba, dtype=np.float64)
    classes = [1] if proba.shape[1] == 2 else range(proba.shape[1])
    aucs = []
    for c in classes:
        pos = y_true == c
        n_pos, n_neg = int(pos.sum()), int((~pos).sum())
        if n_pos == 0 or n_neg == 0:
            continue
        s = proba[:, c]
        order = np.argsort(s, kind="mergesort")
        ranks = np.empty(len(s))
        sorted_s = s[order]
        # average ranks over ties
        _, start, counts = np.unique(sorted_s, return_index=True, return_counts=True)
        avg = start + (counts + 1) / 2.0
        ranks[order] = np.repeat(avg, counts)
        aucs.append((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return float(np.mean(aucs)) if aucs else float("nan")

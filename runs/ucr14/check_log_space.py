"""Round 14: the features the exploration's lanes computed (the weights' first form, a
maximum taken out of each exponent, written out here) against the module's log-space form,
on the validation tokens of Adiac, ECG200 and CBF (split 1), for the three attention variants."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ucr12"))
import ridge_diff_weights as W  # noqa: E402

from linattn.tsc.attention_features import RandomAttentionFeatures  # noqa: E402
from linattn.tsc.conv_tokens import ConvTokens  # noqa: E402

U = W.R.U


def first_form(a, tokens):
    t = torch.from_numpy(tokens)
    n, S, _ = t.shape
    q = (t @ a.query_).view(n, S, a.heads, a.key_dim).transpose(1, 2)
    k = (t @ a.key_).view(n, S, a.heads, a.key_dim).transpose(1, 2)
    q = torch.exp(a.sharpness * (q - q.amax((2, 3), keepdim=True)))
    k = torch.exp(a.sharpness * (k - k.amax((2, 3), keepdim=True)))
    w = q @ k.transpose(2, 3)
    if a.causal:
        w = w.tril()
    v = t[:, :, a.value_index_].permute(0, 2, 1, 3)
    o = (w @ v) / w.sum(-1, keepdim=True)
    return torch.cat([o.mean(2), o.amax(2)], -1).reshape(n, -1).numpy()


worst = 0.0
for name in ("Adiac", "ECG200", "CBF"):
    X, y, classes, tr, va, row = U._inner_data(name, 1)
    T = U._scaled_tokens(ConvTokens(16, 2000, 9, random_state=0), X, tr, va)
    for kw in (dict(sharpness=1.0), dict(sharpness=2.0), dict(sharpness=1.0, causal=True)):
        a = RandomAttentionFeatures(random_state=0, **kw).fit(T[0])
        worst = max(worst, float(np.abs(a.transform(T[1]) - first_form(a, T[1])).max()))
print(f"max difference over 3 sets x 3 variants: {worst:.1e}")

"""Round 15: ``explore.loo_decision`` against brute force, 30 ridges each refitted without one
series (sklearn ``Ridge``, intercept), on a random 30 × 50 problem with three ±1 targets."""
import os
import sys

import numpy as np
from sklearn.linear_model import Ridge

sys.path.insert(0, os.path.dirname(__file__))
import explore as E  # noqa: E402

rng = np.random.default_rng(0)
F, Y = rng.standard_normal((30, 50)), np.sign(rng.standard_normal((30, 3)))
got = E.loo_decision(F, Y, 2.0)
want = np.array([Ridge(alpha=2.0).fit(np.delete(F, i, 0), np.delete(Y, i, 0))
                 .predict(F[i:i + 1])[0] for i in range(30)])
print(f"max |loo_decision - refits| {np.abs(got - want).max():.1e} (values up to "
      f"{np.abs(want).max():.2f})")

"""Named FordA recipes: estimator parameters on top of the reference defaults.

``reference`` is the published linear-attention recipe (the estimator's defaults). ``final`` is
the configuration chosen on the validation split (see docs/forda.md for the evidence).
"""

from __future__ import annotations

RECIPES: dict[str, dict] = {
    "reference": {},
    "final": {},
}

"""The (gated) delta rule (DeltaNet, Gated DeltaNet).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.delta.op import check_beta, delta_rule, delta_rule_step, l2_normalised

__all__ = ["delta_rule", "delta_rule_step", "l2_normalised", "check_beta"]

"""The quadratic reference is the ground truth: hold it to the definition, written as loops."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

import linattn
import linattn.ops
from linattn import reference

pytestmark = pytest.mark.usefixtures("single_thread")


def _loop_attention(fmap, q, k, v, is_causal, pad=None):
    """o_i = Σ_j w_ij v_j / (Σ_j w_ij + eps), w_ij = φ(q_i)·φ(k_j), over unpadded j (≤ i when
    causal), eps the map's default; 0 where the normaliser is exactly 0."""
    Tq, Tk = q.shape[0], k.shape[0]
    out = torch.zeros(Tq, v.shape[-1], dtype=v.dtype)
    for i in range(Tq):
        js = [j for j in range(Tk) if (not is_causal or j <= i) and (pad is None or not pad[j])]
        if not js:
            continue  # no key at all: zero output
        w = torch.stack([fmap.forward_queries(q[i]) @ fmap.forward_keys(k[j]) for j in js])
        den = w.sum() + fmap.eps
        if den != 0:
            out[i] = (w[:, None] * v[js]).sum(0) / den
    return out


@pytest.mark.parametrize("is_causal", [False, True])
def test_reference_matches_loops(make_map, qkv, is_causal):
    feature_map = make_map(3)
    q, k, v = qkv(2, T=6, D=3, Dv=2)
    ref = reference.linear_attention(q, k, v, feature_map=feature_map, is_causal=is_causal)
    for b in range(2):
        want = _loop_attention(feature_map, q[b], k[b], v[b], is_causal)
        torch.testing.assert_close(ref[b], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
def test_reference_matches_loops_with_padding(make_map, qkv, is_causal):
    feature_map = make_map(3)
    q, k, v = qkv(3, 2, T=5, D=3, Dv=2)
    pad = torch.tensor(
        [[False, True, False, False, True], [True, True, True, True, True], [True] * 4 + [False]]
    )
    ref = reference.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=is_causal, key_padding_mask=pad
    )
    for b in range(3):
        for h in range(2):
            want = _loop_attention(feature_map, q[b, h], k[b, h], v[b, h], is_causal, pad[b])
            torch.testing.assert_close(ref[b, h], want, rtol=1e-12, atol=1e-12)


def test_reference_different_lengths(make_map, qkv):
    feature_map = make_map(2)
    q, k, v = qkv(T=3, Tk=7, D=2, Dv=4)
    ref = reference.linear_attention(q, k, v, feature_map=feature_map)
    torch.testing.assert_close(
        ref, _loop_attention(feature_map, q, k, v, False), rtol=1e-12, atol=1e-12
    )


# --- the references are standalone (issue 23 §4) -------------------------------------------

_OPS_DIR = Path(linattn.ops.__file__).parent
#: Modules a reference may import: torch, the standard library, the feature maps (an input of
#: the op, tested on their own) and the references' own argument checks. Nothing of an op.
_ALLOWED_LINATTN = {"linattn.feature_maps", "linattn.ops._reference_checks"}


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in ``path``; relative imports as '.'-prefixed names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(("." * node.level + (node.module or ""), node.lineno))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "__import__":
            found.append(("__import__", node.lineno))
    return found


def _allowed(module: str, *, checks_too: bool) -> bool:
    top = module.split(".")[0]
    if module.startswith(".") or top in ("importlib", "__import__"):
        return False  # relative or dynamic imports could reach anything
    if top in ("torch", "__future__") or top in sys.stdlib_module_names:
        return True
    return checks_too and module in _ALLOWED_LINATTN


def test_every_op_has_a_reference_module():
    assert sorted(p.parent.name for p in _OPS_DIR.glob("*/reference.py")) == sorted(
        linattn.ops.OPS)


@pytest.mark.parametrize("op", sorted(linattn.ops.OPS))
def test_reference_imports_nothing_of_the_op(op):
    """A helper shared by an op and its reference would be on both sides of every comparison,
    so a bug in it could never be seen: references import torch, the standard library,
    linattn.feature_maps and linattn.ops._reference_checks, nothing else."""
    path = _OPS_DIR / op / "reference.py"
    bad = [f"{op}/reference.py:{line} imports {m}" for m, line in _imports(path)
           if not _allowed(m, checks_too=True)]
    assert not bad, bad


def test_reference_checks_are_standalone_and_only_for_references():
    """_reference_checks imports torch and the standard library only, and no module but a
    reference imports it (the ops have their own checks)."""
    checks = _OPS_DIR / "_reference_checks.py"
    bad = [f"{m} (line {line})" for m, line in _imports(checks)
           if not _allowed(m, checks_too=False)]
    assert not bad, bad
    src = _OPS_DIR.parent
    users = [p.relative_to(src).as_posix() for p in sorted(src.rglob("*.py"))
             if p.name != "reference.py" and p != checks
             and any("_reference_checks" in m for m, _ in _imports(p))]
    assert not users, users


def test_constants_restated_in_the_references_equal_the_ops():
    """The constants a reference restates rather than imports agree with the op's."""
    from linattn.ops.cosformer import op as cosformer_op
    from linattn.ops.cosformer import reference as cosformer_ref
    from linattn.ops.delta import op as delta_op
    from linattn.ops.delta import reference as delta_ref
    from linattn.ops.flowformer import op as flow_op
    from linattn.ops.flowformer import reference as flow_ref

    assert cosformer_ref.DEFAULT_EPS == cosformer_op.CosFormerFeatures.eps
    assert flow_ref.FLOW_EPS == flow_op.FLOW_EPS
    assert delta_ref.L2_EPS == delta_op.L2_EPS
    # Flowformer's "sigmoid" map: the same features, the same size, the same default eps
    ref_map, op_map = flow_ref._feature_map("sigmoid"), flow_op.flow_feature_map("sigmoid")
    assert isinstance(ref_map, flow_ref.SigmoidFeatures)
    x = torch.cat([torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator()
                               .manual_seed(0)) * 10,
                   torch.tensor([[[-1e3, 0.0, 1e3, -40.0]] * 5], dtype=torch.float64)])
    for side in ("forward_queries", "forward_keys"):
        torch.testing.assert_close(getattr(ref_map, side)(x), getattr(op_map, side)(x),
                                   rtol=0, atol=0)
    assert ref_map.num_features(4) == op_map.num_features(4)
    assert ref_map.eps == op_map.eps and ref_map.tokenwise == op_map.tokenwise
    # the other names resolve to the same maps as in the op
    for name in ("elu", "ReLU"):
        assert type(flow_ref._feature_map(name)) is type(flow_op.flow_feature_map(name))


def test_gated_and_delta_references_agree_where_the_rules_meet():
    """Two loops, written apart: with β_t = 1 and a state that cannot recall k_t (S'ᵀk_t = 0,
    orthonormal keys from a zero state) the delta rule writes k_t v_tᵀ, as the gated one."""
    T, K, V = 4, 4, 3
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, T, K, dtype=torch.float64, generator=g)
    k = torch.eye(K, dtype=torch.float64)[:T].expand(2, T, K)
    v = torch.randn(2, T, V, dtype=torch.float64, generator=g)
    gates = torch.randn(2, T, dtype=torch.float64, generator=g) * 0.1
    o_g, S_g = reference.gated_linear_attention(q, k, v, gates)
    o_d, S_d = reference.delta_rule(q, k, v, torch.ones(2, T, dtype=torch.float64), gates)
    torch.testing.assert_close(o_d, o_g, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(S_d, S_g, rtol=1e-14, atol=1e-14)


# -------------------- the exports of linattn
# Every public op is importable from ``linattn`` itself, lazily, from the one table of ops.


def test_every_public_op_is_exported_from_linattn():
    for name in linattn.ops.EXPORTS:
        assert name in linattn.__all__, name
        assert getattr(linattn, name) is getattr(linattn.ops, name), name


def test_exports_and_all_agree_and_come_from_the_table_of_ops():
    """``_EXPORTS`` (the lazy imports) and ``__all__`` name the same things, every op name of
    the one table :data:`linattn.ops.OPS` among them, and each lazy name resolves."""
    assert set(linattn._EXPORTS) == set(linattn.__all__) - {"__version__"}
    assert set(linattn.ops.EXPORTS) <= set(linattn._EXPORTS)
    for name in linattn._EXPORTS:
        assert getattr(linattn, name) is not None


def test_every_reference_has_its_op():
    """linattn.reference holds the ground truth of each whole-sequence op, under the op's name."""
    for name in linattn.reference.__all__:
        assert callable(getattr(linattn.reference, name))
        assert getattr(linattn, name) is not getattr(linattn.reference, name)

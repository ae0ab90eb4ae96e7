"""The one dispatcher (ops/dispatch.py) and the calibration behind ``impl="auto"``
(ops/calibration.py): the same ``impl=`` means the same thing for every op."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import linattn
from linattn._native_env import setting
from linattn.ops import calibration, dispatch, native
from linattn.ops.dispatch import Backend, Choice
from linattn.ops.linear import native as lnative
from linattn.ops.linear import op as linear_mod

needs_native = pytest.mark.skipif(
    lnative.kernels() is None, reason=f"compiled path: {lnative.unavailable()}"
)


def _qkv(T=40, D=16, Dv=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, T, d, generator=g) for d in (D, D, Dv)]


def _delta_args(T=8, V=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, T, 8, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(1, 2, T, V, generator=g, dtype=dtype)
    return q, k, v, torch.rand(1, 2, T, generator=g, dtype=dtype)


@pytest.fixture(autouse=True)
def fresh_choices():
    """select() remembers its answers per call facts: start and end each test without them
    (tests below change what the calibration says without changing those facts)."""
    dispatch._memo.clear()
    yield
    dispatch._memo.clear()


@pytest.fixture
def calls(monkeypatch):
    """Which path each linear_attention call took: a list of "native" / "fused" entries."""
    seen: list[str] = []
    for name, label in (("native_linear_attention", "native"),
                        ("fused_linear_attention", "fused")):
        real = getattr(linear_mod, name)
        monkeypatch.setattr(linear_mod, name,
                            lambda *a, _r=real, _l=label, **kw: seen.append(_l) or _r(*a, **kw))
    return seen


def test_policy_validates_and_nests():
    assert dispatch.policy() == dispatch.Policy()
    with pytest.raises(ValueError, match="impl"):
        dispatch.Policy(impl="fastest")
    with pytest.raises(ValueError, match="block_size"):
        dispatch.Policy(block_size=0)
    with dispatch.use(impl="portable", block_size=8) as outer:
        assert outer.impl == "portable" and outer.block_size == 8
        with dispatch.use(chunk_size=4) as inner:
            assert (inner.impl, inner.block_size, inner.chunk_size) == ("portable", 8, 4)
        assert dispatch.policy() == outer
    assert dispatch.policy() == dispatch.Policy()


def test_block_holds_whole_chunks():
    pol = dispatch.Policy(block_size=8)
    assert pol.block_for(4) == 8 and pol.block_for(3) == 6 and pol.block_for(16) == 16


def test_small_blocks_really_cross_block_boundaries(fast_path_calls, monkeypatch):
    """The test fixture's promise: T = 9 spans two blocks (and three causal chunks)."""
    seen = []
    target = "native_linear_attention" if lnative.kernels() else "fused_linear_attention"
    real = getattr(linear_mod, target)
    monkeypatch.setattr(linear_mod, target,
                        lambda *a, **kw: seen.append((kw["block"], kw["chunk"])) or real(*a, **kw))
    q, k, v = _qkv(T=9, D=4, Dv=3)
    linattn.linear_attention(q, k, v, is_causal=True)
    assert seen == [(8, 4)]


def test_portable_and_forced_paths(calls):
    q, k, v = _qkv()
    with dispatch.use(impl="portable"):
        want = linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == []
    with dispatch.use(impl="fused"):
        got = linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["fused"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with dispatch.use(impl="torch"):  # what runs with LINATTN_NATIVE=0: portable below 2048
        linattn.linear_attention(q, k, v, is_causal=True)
    with dispatch.use(impl="torch", fused_min_t=16):
        linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["fused", "fused"]
    with dispatch.use(impl="native"), pytest.raises(ValueError, match="cannot take this call"):
        linattn.linear_attention(q, k, v, feature_map="taylor")


@needs_native
def test_native_means_the_same_for_every_op():
    """impl="native" on a call the compiled path cannot take is a ValueError naming why, for
    linear_attention and the delta rule alike (it used to run torch silently in the latter);
    on a call it can take, it runs the compiled kernels."""
    q, k, v = (x.double() for x in _qkv())
    dq, dk, dv, beta = _delta_args(dtype=torch.float64)
    with dispatch.use(impl="native"):
        with pytest.raises(ValueError, match=r"linear_attention cannot take .*float64"):
            linattn.linear_attention(q, k, v)
        with pytest.raises(ValueError, match=r"delta_rule cannot take .*float64"):
            linattn.delta_rule(dq, dk, dv, beta)
        with pytest.raises(ValueError, match=r"delta_rule cannot take .*float64"):
            linattn.delta_rule_step(dq[:, :, 0], dk[:, :, 0], dv[:, :, 0], beta[:, :, 0])
        with pytest.raises(ValueError, match="multiple of 16"):
            linattn.delta_rule(*_delta_args(V=12))
        linattn.delta_rule(*_delta_args())  # float32, V = 16: taken
        x = _delta_args()  # float32 with a gradient: the compiled backward takes it
        linattn.delta_rule(x[0].requires_grad_(), *x[1:]).sum().backward()
        assert x[0].grad is not None and torch.isfinite(x[0].grad).all()
        x = _delta_args(dtype=torch.bfloat16)  # bfloat16 with a gradient: widened, taken
        linattn.delta_rule(x[0].requires_grad_(), *x[1:]).float().sum().backward()
        assert x[0].grad.dtype == torch.bfloat16 and torch.isfinite(x[0].grad).all()
        with pytest.raises(ValueError, match="no gradient for the decoding step"):
            x = _delta_args()
            linattn.delta_rule_step(x[0][:, :, 0].requires_grad_(), x[1][:, :, 0],
                                    x[2][:, :, 0], x[3][:, :, 0])


def test_named_backends_an_op_lacks_are_errors():
    x = _delta_args()
    with dispatch.use(impl="fused"), pytest.raises(ValueError, match="has no 'fused' backend"):
        linattn.delta_rule(*x)
    with dispatch.use(impl="portable"):  # every op has a portable backend
        linattn.delta_rule(*x)
        linattn.linear_attention(*_qkv())


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    monkeypatch.setenv("LINATTN_NATIVE_ISA", "nonsense")  # never read when off
    assert dispatch.native_setting() == "0"
    linattn.linear_attention(*_qkv())
    linattn.delta_rule(*_delta_args())
    with dispatch.use(impl="native"), pytest.raises(ValueError, match="LINATTN_NATIVE=0"):
        linattn.delta_rule(*_delta_args())


def test_the_memo_follows_the_environment_from_call_to_call(monkeypatch):
    """The memo's key holds the settings as the environment holds them now (read cheaply,
    still encoded: :func:`linattn._config.env_raw`), so setting or clearing one between two
    calls changes the next choice."""
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    facts = ("delta_rule", "step", torch.float32, "cpu", False, ("V:16",), None, False)
    first = dispatch.select(*facts)
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    assert dispatch.select(*facts).backend != "native"
    monkeypatch.delenv("LINATTN_NATIVE")
    assert dispatch.select(*facts) == first


def test_raw_settings_read_the_environment_as_it_is_now(monkeypatch):
    from linattn._config import env_raw
    monkeypatch.setenv("LINATTN_TEST_RAW", "x1")
    before = env_raw("LINATTN_TEST_RAW")
    monkeypatch.setenv("LINATTN_TEST_RAW", "x2")
    assert env_raw("LINATTN_TEST_RAW") not in (None, before)
    monkeypatch.delenv("LINATTN_TEST_RAW")
    assert env_raw("LINATTN_TEST_RAW") is None
    # an environment that is a plain mapping (a test's, an embedding's): read as such
    monkeypatch.setattr("os.environ", {"LINATTN_TEST_RAW": "x3"})
    assert env_raw("LINATTN_TEST_RAW") == "x3"


@pytest.mark.parametrize("value, want", [("0", "0"), ("off", "0"), ("False", "0"), ("no", "0"),
                                         ("1", "1"), ("on", "1"), ("TRUE", "1"), ("", "auto"),
                                         ("auto", "auto")])
def test_native_setting_spellings(monkeypatch, value, want):
    monkeypatch.setenv("LINATTN_NATIVE", value)
    assert dispatch.native_setting() == want


def test_unknown_settings_warn_once_naming_the_variable_and_are_ignored(monkeypatch):
    """One rule for every setting (issue 51: a bad LINATTN_NATIVE_ISA was a traceback at the
    first compiled call, where LINATTN_NATIVE and LINATTN_CC_TIMEOUT warned)."""

    monkeypatch.setattr("linattn._native_env._warned", set())
    monkeypatch.setenv("LINATTN_NATIVE", "sometimes")
    with pytest.warns(RuntimeWarning, match="LINATTN_NATIVE='sometimes' is not one of"):
        assert dispatch.native_setting() == "auto"
    monkeypatch.setenv("LINATTN_NATIVE_ISA", "nonsense")
    with pytest.warns(RuntimeWarning, match="LINATTN_NATIVE_ISA='nonsense' is not one of "
                                            "native, avx512, avx2, generic, scalar; using the "
                                            "calibration's choice") as caught:
        assert dispatch.isa_setting() is None
        assert dispatch.isa_setting() is None  # warned once
    assert len(caught) == 1
    monkeypatch.setenv("LINATTN_NATIVE_ISA", "GENERIC")  # any case
    assert dispatch.isa_setting() == "generic"
    monkeypatch.setenv("LINATTN_AMX", "later")
    with pytest.warns(RuntimeWarning, match="LINATTN_AMX='later' is not one of 0, 1, off"):
        assert setting("LINATTN_AMX") == "1"
    monkeypatch.setenv("LINATTN_AMX", "Off")
    assert setting("LINATTN_AMX") == "0"


@needs_native
def test_a_compiled_call_under_an_unknown_build_runs(monkeypatch):
    """Was a ValueError traceback at the first compiled call (bench, lm and recall)."""

    monkeypatch.setattr("linattn._native_env._warned", set())
    monkeypatch.setenv("LINATTN_NATIVE", "1")
    monkeypatch.setenv("LINATTN_NATIVE_ISA", "nonsense")
    with pytest.warns(RuntimeWarning, match="LINATTN_NATIVE_ISA='nonsense'"):
        got = linattn.delta_rule(*_delta_args())
    monkeypatch.delenv("LINATTN_NATIVE_ISA")
    torch.testing.assert_close(got, linattn.delta_rule(*_delta_args()), rtol=0, atol=0)


def test_the_settings_know_every_build():
    from linattn import _cbuild
    from linattn.ops.native import ISA_FLAGS

    assert _cbuild.ISA_NAMES == tuple(ISA_FLAGS)


def test_traced_calls_only_take_traceable_backends():
    """Inside a graph being traced the eager-only fused path is never a candidate: ``fast``
    falls through to the compiled or the portable backend, and naming it is an error."""
    args = ("linear_attention", "causal forward", torch.float32, "cpu", False,
            ("map:tokenwise",), None, True)
    with dispatch.use(impl="fast"):
        assert dispatch.select(*args).backend == "portable"
    with dispatch.use(impl="fused"), pytest.raises(ValueError, match="torch.compile"):
        dispatch.select(*args)


@needs_native
def test_auto_follows_the_measurement(calls, monkeypatch):
    """``auto`` takes the compiled path only where the calibration says it wins, in the build
    it names; ``LINATTN_NATIVE=1`` takes it regardless, ``LINATTN_NATIVE=0`` never."""
    q, k, v = _qkv()
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    monkeypatch.delenv("LINATTN_NATIVE_ISA", raising=False)
    isas = []
    monkeypatch.setattr(calibration, "winner", lambda op, form, b, i, t, p: None)
    linattn.linear_attention(q, k, v)
    assert calls == []  # T = 40 < fused_min_t: portable

    def causal_wins(op, form, backend, candidates, torch_names, problem):
        isas.append(candidates)
        return candidates[-1] if form.startswith("causal") else None

    monkeypatch.setattr(calibration, "winner", causal_wins)
    dispatch._memo.clear()
    linattn.linear_attention(q, k, v)
    linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["native"]
    assert isas and all(c == native.runnable_isas() for c in isas)
    monkeypatch.setattr(calibration, "winner", lambda *a: pytest.fail("measured"))
    dispatch._memo.clear()
    monkeypatch.setenv("LINATTN_NATIVE", "1")
    linattn.linear_attention(q, k, v)
    assert calls == ["native", "native"]
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["native", "native"]


# ------------------------------------------------------------------------------ calibration
@pytest.fixture
def toy(monkeypatch, tmp_path):
    """A registered op "toy" with a compiled backend (builds "native" and "avx2") and a portable
    one, and a calibration whose timings are scripted: ``toy.ms`` maps candidate -> seconds,
    ``toy.measured`` counts the measurements. The cache file lives in a temporary folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    monkeypatch.delenv("LINATTN_NATIVE_ISA", raising=False)
    # patched where dispatch looks it up (it imports the name): on an AVX2-only CPU the real
    # list is ["native"] alone, and the scripted timings below name two builds
    monkeypatch.setattr(dispatch, "runnable_isas", lambda: ["native", "avx2"])
    calibration.forget()

    class Toy:
        ms = {"native:native": 2.0, "native:avx2": 1.0, "portable": 3.0}
        measured = 0
        threads: list[str] = []

    def problem():
        Toy.measured += 1
        Toy.threads.append(threading.current_thread().name)

        def run(choice: Choice):
            def thunk():
                return choice
            thunk.key = f"native:{choice.isa}" if choice.isa else choice.backend
            return thunk
        return run

    monkeypatch.setattr(calibration, "_seconds", lambda fn: Toy.ms[fn.key])
    dispatch.register(Backend("toy", "native", compiled=True, available=lambda isa: None))
    dispatch.register(Backend("toy", "portable"))
    dispatch.register_calibration("toy", {"f": problem})
    yield Toy
    dispatch._REGISTRY.pop("toy", None)
    dispatch._PROBLEMS.pop("toy", None)
    calibration.forget()


def _toy_select():
    return dispatch.select("toy", "f", torch.float32, "cpu", False)


def test_calibration_picks_the_fastest_build_and_is_cached(toy):
    assert _toy_select() == Choice("native", "avx2")
    assert toy.measured == 1 and set(toy.threads) == {"linattn-calibration"}
    cached = json.loads(calibration.cache_path().read_text())
    (entry,) = cached.values()
    assert entry["winner"] == "avx2" and entry["ms"]["portable"] == 3000.0
    # A new process reads the file instead of measuring again.
    calibration.forget()
    dispatch._memo.clear()
    assert _toy_select() == Choice("native", "avx2")
    assert toy.measured == 1
    # a build within the margin of native's time does not displace it
    toy.ms = {"native:native": 1.0, "native:avx2": 0.8, "portable": 3.0}
    calibration.cache_path().unlink()
    calibration.forget()
    dispatch._memo.clear()
    assert _toy_select() == Choice("native", "native")
    # torch faster than every build: the torch rule
    toy.ms = {"native:native": 2.0, "native:avx2": 2.5, "portable": 1.0}
    calibration.cache_path().unlink()
    calibration.forget()
    dispatch._memo.clear()
    assert _toy_select() == Choice("portable")


@pytest.mark.parametrize("garbage", ["[1, 2]", "{", '{"x": 1}', "7", ""])
def test_a_malformed_cache_file_is_measured_again(toy, garbage):
    path = calibration.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(garbage)
    assert _toy_select() == Choice("native", "avx2")
    assert toy.measured == 1
    assert isinstance(json.loads(path.read_text()), dict)


def test_a_malformed_entry_is_measured_again(toy):
    _toy_select()
    path = calibration.cache_path()
    cached = json.loads(path.read_text())
    for bad in ({"ms": 1, "winner": "avx2"}, {"winner": "avx2"}, 1,
                {"ms": {"native:native": "x"}, "winner": "avx2"}):
        key = next(iter(cached))
        path.write_text(json.dumps({key: bad}))
        calibration.forget()
        dispatch._memo.clear()
        before = toy.measured
        assert _toy_select() == Choice("native", "avx2")
        assert toy.measured == before + 1


def test_a_failed_measurement_means_torch_with_a_warning(toy, monkeypatch):
    def broken(fn):
        raise RuntimeError("no timer")

    monkeypatch.setattr(calibration, "_seconds", broken)
    with pytest.warns(RuntimeWarning, match="could not measure"):
        assert _toy_select() == Choice("portable")
    assert not calibration.cache_path().exists()


def test_an_isa_setting_is_the_only_build_measured(toy, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE_ISA", "native")
    assert _toy_select() == Choice("native", "native")
    (entry,) = json.loads(calibration.cache_path().read_text()).values()
    assert set(entry["ms"]) == {"native:native", "portable"}


def test_a_thread_started_during_a_narrowing_reuses_the_calibration(toy):
    """The calibration's key holds the user's thread count: a thread whose torch count was
    first set while another thread ran a small call (narrowed to 1) finds the verdict measured
    for the user's count, and nothing is measured twice. The interleaving that made
    test_calibration_is_isolated_from_the_triggering_call fail 1 run in 10, forced."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _toy_select() == Choice("native", "avx2") and toy.measured == 1
        narrowed, started, ended = threading.Event(), threading.Event(), threading.Event()
        chosen, errors = [], []

        def narrowing():
            with native.torch_on_one_thread(True):
                narrowed.set()
                started.wait(10)
            ended.set()

        def starting():
            try:
                assert narrowed.wait(10)
                torch.get_num_threads()  # its first torch count, as a first parallel op sets it
                started.set()
                assert ended.wait(10)  # the call after the narrowing is over
                chosen.append((native.torch_threads(), _toy_select()))
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                started.set()

        threads = [threading.Thread(target=f) for f in (narrowing, starting)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        torch.set_num_threads(before)
    assert not errors, errors
    assert chosen == [(2, Choice("native", "avx2"))]
    assert toy.measured == 1


def test_the_calibration_thread_count_stays_in_its_thread():
    """The calibration thread runs with the caller's count, and only it: a thread starting
    meanwhile copies the user's count (torch.set_num_threads there set the default every new
    thread copies, and restored a count that could be another thread's narrowed 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = {}

    def measure():
        seen["calibration"] = torch.get_num_threads()
        t = threading.Thread(target=lambda: seen.setdefault("other", torch.get_num_threads()))
        t.start()
        t.join()

    try:
        calibration._in_clean_thread(measure, 1)
        t = threading.Thread(target=lambda: seen.setdefault("after", torch.get_num_threads()))
        t.start()
        t.join()
        assert seen == {"calibration": 1, "other": 2, "after": 2}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@needs_native
def test_calibration_problems_use_default_sizes_and_gradients():
    """The measurement may be triggered from inference code or from inside a policy: it still
    times gradients, with the default sizes (it runs in a clean thread)."""
    seen = []
    real = linear_mod.native_linear_attention

    def spy(*a, **kw):
        seen.append(kw["block"])
        return real(*a, **kw)

    problem = dispatch._PROBLEMS["linear_attention"]["causal fwd+bwd"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linear_mod, "native_linear_attention", spy)
        with torch.inference_mode(), dispatch.use(block_size=8, chunk_size=4):
            calibration._in_clean_thread(lambda: problem()(Choice("native", "native"))(), 1)
    assert seen == [dispatch.Policy().block_size]


@needs_native
def test_calibration_is_isolated_from_the_triggering_call(monkeypatch, tmp_path):
    """The first call may run under a float64 default dtype, inside activation checkpointing
    (whose recording must not see the measurement's tensors) and from several threads at
    once: the calibration measures once, in float32, in a thread of its own."""
    from torch.utils.checkpoint import checkpoint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    monkeypatch.setattr(calibration, "REPEATS", 1)
    calibration.forget()
    runs = []
    real = calibration._measure

    def measure(*a):
        runs.append(threading.current_thread().name)
        return real(*a)

    monkeypatch.setattr(calibration, "_measure", measure)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.randn(1, 2, 32, 16, dtype=torch.float32, requires_grad=True)
        errors = []

        def call():
            try:
                out = checkpoint(lambda a: linattn.linear_attention(a, a, a, is_causal=True), x,
                                 use_reentrant=False)
                out.sum().backward()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_default_dtype(before)
        calibration.forget()
    assert not errors, errors
    assert runs == ["linattn-calibration"]
    (entry,) = json.loads(calibration.cache_path().read_text()).values()  # not a failure
    assert all(ms > 0 for ms in entry["ms"].values())


@needs_native
def test_report_names_the_backend_and_build_of_every_form():
    rows = dispatch.report()
    forms = {(r["op"], r["form"]) for r in rows}
    assert ("linear_attention", "causal fwd+bwd") in forms and ("delta_rule", "step") in forms
    for r in rows:
        assert r["backend"] in ("native", "torch")
        assert (r["isa"] is None) == (r["backend"] == "torch")


def test_policy_chunk_size_reaches_every_chunked_op(monkeypatch):
    """Policy.chunk_size is the default chunk of every chunked op, not only linear attention's."""
    from linattn.ops.delta import chunk as delta_chunk
    from linattn.ops.gated import chunk as gated_op

    seen = []
    real_d, real_g = delta_chunk.chunked_form, gated_op.chunked_form
    monkeypatch.setattr(delta_chunk, "chunked_form", lambda *a: seen.append(a[-1]) or real_d(*a))
    monkeypatch.setattr(gated_op, "chunked_form", lambda *a: seen.append(a[-1]) or real_g(*a))
    q, k, v, beta = _delta_args(T=20)
    with dispatch.use(impl="portable", chunk_size=4):
        linattn.delta_rule(q, k, v, beta)
        linattn.gated_linear_attention(q, k, v)
    assert seen == [4, 4]


def test_removed_module_globals_point_to_the_policy():
    with pytest.raises(AttributeError, match="dispatch.use"):
        _ = linear_mod.FUSED_MIN_T


# ------------------------------------------------------------------ every ISA build this CPU runs

ISAS = list(native.ISA_FLAGS)
EXPECTED_WIDTH = {"avx512": 16, "avx2": 8, "scalar": 1}


@pytest.mark.parametrize("isa", ISAS)
def test_every_isa_build_matches_the_reference(monkeypatch, isa):
    """Each build variant this CPU can run (the vector width and register tiles differ) against
    the float64 reference: one-pass kernels (widths multiples of 16, partial chunks), block
    passes (a padding mask), forward and backward."""
    if lnative.kernels(isa) is None:
        pytest.skip(f"{isa} build: {lnative.unavailable(isa)}")
    lib = native.load(isa)
    if isa in EXPECTED_WIDTH:
        assert lib.la_width() == EXPECTED_WIDTH[isa]
    monkeypatch.setenv("LINATTN_NATIVE_ISA", isa)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 83, d, generator=g) * 0.8 for d in (32, 32, 16))
    w = torch.randn(2, 2, 83, 16, generator=g)
    mask = torch.zeros(2, 83, dtype=torch.bool)
    mask[1, 70:] = True
    for is_causal in (False, True):
        for kpm in (None, mask):
            kw = dict(is_causal=is_causal, key_padding_mask=kpm)
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            with dispatch.use(impl="native"):
                out = linattn.linear_attention(*leaves, chunk_size=16, **kw)
            (out * w).sum().backward()
            ref_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
            ref = linattn.reference.linear_attention(*ref_leaves, **kw)
            (ref * w.double()).sum().backward()
            torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)
            for a, b in zip(leaves, ref_leaves, strict=True):
                scale = b.grad.abs().max().item()
                assert (a.grad.double() - b.grad).abs().max().item() < 2e-5 * scale


@needs_native
@pytest.mark.parametrize("is_causal", [False, True])
def test_bfloat16_without_bf16_units_widens_to_float32(monkeypatch, is_causal):
    """Block passes (here: a padding mask) on a CPU without bfloat16 products run in float32
    and round the output once: the float32 result, rounded."""
    monkeypatch.setattr(lnative, "bf16_products", lambda: False)
    q, k, v = (x.bfloat16() for x in _qkv(T=37, D=8, Dv=8))
    mask = torch.zeros(1, 37, dtype=torch.bool)
    mask[0, -5:] = True
    with torch.no_grad(), dispatch.use(impl="native"):
        got = linattn.linear_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask)
        want = linattn.linear_attention(q.float(), k.float(), v.float(), is_causal=is_causal,
                                        key_padding_mask=mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.bfloat16(), rtol=0, atol=0)


def test_refused_sizes_raise_even_under_python_O():
    with pytest.raises(RuntimeError, match="la_causal_forward refused"):
        native.check_rc(-1, "la_causal_forward")
    native.check_rc(0, "la_causal_forward")

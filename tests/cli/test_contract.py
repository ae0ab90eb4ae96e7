"""The command-line contract, table-driven (docs/design.md, issue 24): every subcommand, given a
bad option, a bad file or a failing disk, prints exactly one line on stderr and exits with
status 2 — no traceback, no crash, no hang, no half-written file left behind.

Each row runs the real command in a fresh process (``python -m linattn ...``), all rows in a
small pool. Rows marked ``before_torch`` run with torch made unimportable: the option must be
refused before torch (or any data) is loaded, which is what keeps such errors instant. A full
disk is simulated without root by ``RLIMIT_FSIZE``: a write past the limit fails with EFBIG,
an OSError like ENOSPC (Python ignores SIGXFSZ). The limit is set in the child by a trampoline
that then runs ``linattn`` exactly as ``-m`` does (a ``preexec_fn`` is unsafe in a parent with
threads, and this pool is threads). ``/dev/full`` stands in for a full standard output.

The rows run real processes where only a real process shows the contract: a refusal before
torch, a full disk, a full or closed standard output, a crash. What the same layers do after a
model is loaded (non-finite weights, a diverging run, a failed write of the report's output) is
tested in process, where torch is loaded already (tests/tsc/test_cli.py, tests/cli/test_lm.py,
tests/lm/, tests/tsc/test_estimator.py), to keep this table to about half a minute.

A new option or subcommand is covered by adding its rows to :data:`CASES`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("safetensors")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "FordA"  # the committed subset: 64 TRAIN, 40 TEST series
HAS_FULL = os.path.exists("/dev/full")

#: The trampoline: ``RLIMIT_FSIZE`` (argv[1], 0: none), ``RLIMIT_AS`` (argv[2], 0: none),
#: torch made unimportable (argv[3]), then ``linattn`` run as ``python -m linattn`` runs it.
TRAMPOLINE = """
import resource, runpy, sys
limit, memory, no_torch = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if memory:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
if no_torch:
    sys.modules["torch"] = None  # import torch: ImportError, so the row must fail before it
sys.argv = ["linattn", *sys.argv[4:]]
runpy.run_module("linattn", run_name="__main__", alter_sys=True)
"""
#: The address space of the rows that ask for absurd sizes: were their estimate to let them
#: through, the allocation fails here instead of taking the machine's memory.
ABSURD_AS = 8 * 2**30

#: `linattn bench` with its measuring tables stubbed out (a real run takes a minute): what is
#: left is the SDPA crossover at one tiny length and the plot, whose write is under test.
BENCH_STUBBED = """
import resource, sys
from linattn.cli import bench, main
bench.selection_table = lambda: None
bench.efficiency_table = lambda args, dtype: None
sys.exit(main(sys.argv[1:]))
"""
#: `linattn recall train` where another run finishes into --out between the command's first
#: look at the folder (its probe) and its taking the folder's lock: the result.json that run
#: wrote must be refused under the lock, never overwritten (issue 51 probe: it was).
RECALL_RACED = """
import sys
from pathlib import Path
from linattn.cli import main, recall
probe = recall.probe_output_dir
def raced(path, option):
    probe(path, option)
    Path(path).mkdir(parents=True, exist_ok=True)
    (Path(path) / "result.json").write_text('{"old_run": true}\\n')
recall.probe_output_dir = raced
sys.exit(main(sys.argv[1:]))
"""
#: `linattn lm train` started beside another run into the same new --out: that run's probe of
#: the folder (made, written, removed) removes it between this one's look and its test write
#: (issue 51 third probe: '--out: ...: No such file or directory' for one of two runs).
PROBE_RACED = """
import os, sys, tempfile
from linattn.cli import main
made = tempfile.TemporaryFile
def raced(*args, dir=None, **kw):
    tempfile.TemporaryFile = made
    os.rmdir(dir)
    return made(*args, dir=dir, **kw)
tempfile.TemporaryFile = raced
sys.exit(main(sys.argv[1:]))
"""
#: The same on a full disk: files of at most 2,000 bytes.
BENCH_PLOT_ONLY = BENCH_STUBBED.replace(
    "from linattn.cli", "resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))\nfrom linattn.cli")

FORDA_PARAMS = {"patch": 20, "d_model": 8, "num_layers": 1, "num_heads": 2, "head_dim": 4,
                "mlp_dim": 16, "epochs": 1, "min_steps": 0, "min_batches": 0, "random_state": 0}
LM_TINY = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--context", "32",
           "--batch-size", "4", "--corpus-bytes", "300000", "--val-tokens", "512",
           "--eval-every", "2", "--threads", "1", "--quiet", "--warmup", "2"]
FORDA_TINY = [f"--set={k}={v}" for k, v in FORDA_PARAMS.items() if k != "random_state"]


@dataclass(frozen=True)
class Case:
    """One row: ``argv(f, d)`` is the command line after ``linattn`` (``f``: the shared
    fixtures, ``d``: this row's own folder, where its outputs go)."""

    id: str
    argv: Callable[[SimpleNamespace, Path], list[str]]
    match: str  # in the one line on stderr
    status: int = 2
    before_torch: bool = False  # refused before torch is imported
    fsize: int = 0  # RLIMIT_FSIZE in bytes (0: none): a full disk
    memory: int = 0  # RLIMIT_AS in bytes (0: none): the absurd sizes' rows
    stdout: str = ""  # "full": /dev/full; "head": the reader leaves after a few bytes
    absent: tuple[str, ...] = ()  # paths under the row's folder that must not exist after
    setup: Callable[[SimpleNamespace, Path], None] | None = None
    code: str = ""  # python -c code instead of the trampoline (the bench plot's stubs)
    stdin: bytes = b""
    env: tuple[tuple[str, str], ...] = ()  # more environment variables
    closed: str = ""  # "stdout" or "stderr": started with that stream closed (`>&-`, `2>&-`)
    stderr: str = ""  # "full": standard error is /dev/full (what is written there is lost)
    #: more checks of what the row left in its folder, ``check(d)`` (a link still a link, ...)
    check: Callable[[Path], None] | None = None


def _lm(*extra: str) -> Callable:
    return lambda f, d: ["lm", "train", "--out", str(d / "run"), "--steps", "2", *LM_TINY,
                         *extra]


def _gen(*extra: str, model: str = "lm") -> Callable:
    return lambda f, d: ["lm", "generate", "--model", str(getattr(f, model)), "--prompt", "def ",
                         "--threads", "1", *extra]


def _forda_train(*extra: str) -> Callable:
    return lambda f, d: ["forda", "train", "--out", str(d / "run"), "--subset", "64",
                         "--quiet", "--threads", "1", "--data-dir", str(DATA), *FORDA_TINY,
                         *extra]


def _forda_on(data: str, *extra: str) -> Callable:
    return lambda f, d: ["forda", "train", "--out", str(d / "run"), "--subset", "64", "--quiet",
                         "--threads", "1", "--data-dir", str(f.bad_data[data]), *FORDA_TINY,
                         *extra]


def _resume(run_json: str) -> Callable:
    return lambda f, d: ["forda", "train", "--resume", "--out", str(getattr(f, run_json)),
                         "--data-dir", str(DATA), "--threads", "1", "--quiet"]


def _evaluate(model: str = "forda", *extra: str) -> Callable:
    return lambda f, d: ["forda", "evaluate", "--model", str(getattr(f, model)), "--data-dir",
                         str(DATA), "--no-baselines", "--threads", "1", "--report-dir",
                         str(d / "report"), *extra]


def _link_to_png(f: SimpleNamespace, d: Path) -> None:
    (d / "real.png").write_bytes(b"old")
    (d / "link.png").symlink_to("real.png")


def _still_a_link(d: Path) -> None:
    assert (d / "link.png").is_symlink(), "the link was replaced"
    assert (d / "real.png").read_bytes().startswith(b"\x89PNG"), "its file was not written"


def _dangling_links(f: SimpleNamespace, d: Path) -> None:
    """``gone.png``: a link into a folder that does not exist; ``new.png``: a link to a file
    not made yet in a folder that exists, through a second link (``via.png``)."""
    (d / "gone.png").symlink_to(d / "no" / "such" / "x.png")
    (d / "sub").mkdir()
    (d / "via.png").symlink_to("sub/new.png")
    (d / "new.png").symlink_to("via.png")


def _links_kept(made: bool) -> Callable[[Path], None]:
    def check(d: Path) -> None:
        for name in ("gone.png", "via.png", "new.png"):
            assert (d / name).is_symlink(), f"the link {name} was replaced"
        assert not (d / "no").exists(), "the missing folder was created"
        png = d / "sub" / "new.png"
        assert png.is_file() == made, "the link's file was not written" if made else png
        if made:
            assert png.read_bytes().startswith(b"\x89PNG")
    return check


def _fifo(f: SimpleNamespace, d: Path) -> None:
    os.mkfifo(d / "fifo")


def _fifo_checkpoint_in(rel: str) -> Callable[[SimpleNamespace, Path], None]:
    def setup(f: SimpleNamespace, d: Path) -> None:
        (d / rel).mkdir()
        os.mkfifo(d / rel / "checkpoint.pt")
    return setup


_fifo_checkpoint = _fifo_checkpoint_in("m")


def _data_with_a_fifo(split: str) -> Callable[[SimpleNamespace, Path], None]:
    """d/data: the committed FordA subset with FordA_{split}.tsv a FIFO that nobody writes."""
    def setup(f: SimpleNamespace, d: Path) -> None:
        (d / "data").mkdir()
        for other in ("TRAIN", "TEST"):
            if other != split:
                shutil.copy(DATA / f"FordA_{other}.tsv.gz", d / "data")
        os.mkfifo(d / "data" / f"FordA_{split}.tsv")
    return setup


def _still_a_fifo(d: Path) -> None:
    assert stat.S_ISFIFO(os.lstat(d / "fifo").st_mode), "the FIFO was replaced"


def _devices_stay(d: Path) -> None:
    for dev in (os.devnull, "/dev/full"):
        if os.path.exists(dev):
            assert stat.S_ISCHR(os.lstat(dev).st_mode), f"{dev} was replaced"


#: Run folders that this process owns while the table runs (:func:`_held`).
_HELD: list = []


def _held(rel: str) -> Callable[[SimpleNamespace, Path], None]:
    """A setup that takes the lock of the run folder ``d/rel`` in this process, as a run
    already training there would hold it."""
    def setup(f: SimpleNamespace, d: Path) -> None:
        from linattn._io import FolderLock

        _HELD.append(FolderLock(d / rel))
    return setup


def _deep_cell(f: SimpleNamespace, d: Path) -> None:
    """The cell file of :func:`_recall_table`'s one cell, nested 100,000 deep."""
    (d / "grid").mkdir()
    (d / "grid" / "softmax-d16-T16-P2.json").write_text("[" * 100_000 + "]" * 100_000)


def _fifo_cell(f: SimpleNamespace, d: Path) -> None:
    """The cell file of :func:`_recall_table`'s one cell, a FIFO that nobody writes."""
    (d / "grid").mkdir()
    os.mkfifo(d / "grid" / "softmax-d16-T16-P2.json")


def _finished_recall_run(f: SimpleNamespace, d: Path) -> None:
    (d / "run").mkdir()
    (d / "run" / "result.json").write_text('{"old_run": true}\n')


def _still_the_old_run(d: Path) -> None:
    _match(d / "run", ["result.json"])
    assert json.loads((d / "run" / "result.json").read_text()) == {"old_run": True}, \
        "the finished run's result.json was overwritten"


def _odd_lock(kind: str) -> Callable[[SimpleNamespace, Path], None]:
    """A setup that makes ``d/run/run.lock`` a symbolic link to ``d/victim`` or a FIFO."""
    def setup(f: SimpleNamespace, d: Path) -> None:
        (d / "run").mkdir()
        (d / "victim").write_text("keep me\n")
        lock = d / "run" / _io_lock_file()
        lock.symlink_to(d / "victim") if kind == "symlink" else os.mkfifo(lock)
    return setup


def _odd_lock_kept(kind: str) -> Callable[[Path], None]:
    def check(d: Path) -> None:
        assert (d / "victim").read_text() == "keep me\n", "written through the link"
        mode = os.lstat(d / "run" / _io_lock_file()).st_mode
        assert (stat.S_ISLNK if kind == "symlink" else stat.S_ISFIFO)(mode), "replaced"
    return check


def _io_lock_file() -> str:
    from linattn._io import LOCK_FILE

    return LOCK_FILE


def _match(folder: Path, names: list[str], not_in: str = "") -> None:
    """``folder`` holds exactly the files ``names`` (the busy run's own, nothing the refused
    one wrote), none of which contains ``not_in``."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    if not_in:
        for name in names:
            assert not_in not in (folder / name).read_text(), f"{name} was not replaced"


def _copy_forda_run(f: SimpleNamespace, d: Path) -> None:
    shutil.copytree(f.forda, d / "run")


RECALL_TINY = ["--lr", "1e-3", "--seq-len", "16", "--pairs", "2", "--vocab-size", "32",
               "--train-examples", "32", "--val-examples", "8", "--test-examples", "8",
               "--epochs", "1", "--batch-size", "16", "--train-mix", "", "--quiet"]


def _recall(*extra: str) -> Callable:
    return lambda f, d: ["recall", "train", "--mixer", "softmax", "--out", str(d / "run"),
                         "--d-model", "16", *RECALL_TINY, *extra]


def _recall_table(*extra: str) -> Callable:
    return lambda f, d: ["recall", "table", "--mixers", "softmax", "--d-models", "16", "--out",
                         str(d / "grid"), *RECALL_TINY, *extra]


def _bench(*extra: str) -> Callable:
    return lambda f, d: ["bench", "-T", "16", "-H", "1", "-d", "4", "--repeats", "1",
                         "--threads", "1", "--plot", str(d / "b.png"), *extra]


CASES: list[Case] = [
    # -- the command itself
    Case("no-such-command", lambda f, d: ["frobnicate"], "invalid choice", before_torch=True),
    Case("unknown-flag", lambda f, d: ["lm", "train", "--bogus"], "unrecognized arguments",
         before_torch=True),
    # LINATTN_* settings: one rule for all three, a bad value warns once (one line) and is
    # ignored (a bad LINATTN_NATIVE_ISA was a traceback at the first compiled call)
    *(Case(f"{cmd}-env-{var[8:].lower().replace('_', '-')}-junk", argv,
           f"{var}='junk' is not ", status=0, env=((var, "junk"),), code=code)
      for cmd, argv, code in (("lm", _lm(), ""), ("recall", _recall(), ""),
                              ("bench", _bench("--crossover", "8", "--no-portable"),
                               BENCH_STUBBED))
      for var in ("LINATTN_NATIVE_ISA", "LINATTN_NATIVE", "LINATTN_CC_TIMEOUT")),
    # a capped --threads (or a bad setting) and a user error: the error is the only line
    Case("lm-threads-capped-and-a-bad-context",
         _lm("--threads", "100000", "--context", "40000", "--batch-size", "1"),
         "--context: 40000 needs at least", absent=("run",),
         env=(("LINATTN_NATIVE_ISA", "junk"),)),
    Case("forda-threads-capped-and-bad-data", _forda_on("one_class", "--threads", "100000"),
         "every series has the label 1", absent=("run",)),
    Case("evaluate-threads-capped-and-bad-data",
         lambda f, d: ["forda", "evaluate", "--model", str(f.forda), "--data-dir",
                       str(f.bad_data["three_classes"]), "--no-baselines", "--threads",
                       "100000", "--report-dir", str(d / "report")],
         "label 3 is not a class of the model"),
    Case("generate-threads-capped-and-a-bad-checkpoint",
         _gen("--threads", "100000", model="lm_garbage"), "cannot load a model"),
    Case("recall-threads-capped-and-out-in-use", _recall("--threads", "100000"),
         "in use by another linattn run", setup=_held("run")),
    # help and version into a full standard output: one line, not a silent exit 0
    Case("help-stdout-full", lambda f, d: ["--help"], "cannot write the output",
         stdout="full", before_torch=True),
    Case("version-stdout-full", lambda f, d: ["--version"], "cannot write the output",
         stdout="full", before_torch=True),
    Case("lm-train-help-stdout-full", lambda f, d: ["lm", "train", "--help"],
         "cannot write the output", stdout="full", before_torch=True),
    # -- solve
    Case("solve-empty-input", lambda f, d: ["solve"], "empty input", before_torch=True),
    Case("solve-header-of-4000-digits", lambda f, d: ["solve"], "expected 3·N·d values (a "
         "number of about 4001 digits) after the header, got 3", before_torch=True,
         stdin=b"9" * 4000 + b" 1\n1\n1\n1\n"),
    Case("solve-stdout-full", lambda f, d: ["solve"], "cannot write the output", stdout="full",
         stdin=b"1 1\n1\n1\n1\n"),
    # -- forda train: options, folders, run.json, the disk, divergence
    Case("forda-epochs-0", _forda_train("--epochs", "0"), "--epochs: expected a positive "
         "integer, got 0", before_torch=True, absent=("run",)),
    Case("forda-threads-0", _forda_train("--threads", "0"), "--threads: expected a positive "
         "integer", before_torch=True, absent=("run",)),
    Case("forda-set-patch-wider-than-the-recipes-window", _forda_train("--set", "patch=100000",
                                                                       "--set", "window=40"),
         "--set: window must be 0 or an integer >= patch", absent=("run",)),
    Case("forda-set-patch-alone", lambda f, d: ["forda", "train", "--out", str(d / "run"),
                                                "--data-dir", str(DATA), "--set",
                                                "patch=100000"],
         "--set: patch=100000 is wider than the final recipe's window=40", absent=("run",)),
    # --set random_state was overwritten by --seed without a word (issue 51, second probe)
    Case("forda-set-random-state", _forda_train("--set", "random_state=5"),
         "--set: random_state is set by --seed", absent=("run",)),
    # a --subset of one class (one series) was a traceback from inside the estimator's fit
    *(Case(f"forda-subset-{n}", _forda_train("--subset", n), "--subset: the first "
           f"{n} TRAIN series", absent=("run",)) for n in ("1", "2")),
    Case("forda-stages", _forda_train("--stages", "test"), "--stages: expected val and/or full",
         before_torch=True),
    Case("forda-recipe", _forda_train("--recipe", "magic"), "--recipe: unknown recipe 'magic'",
         before_torch=True),
    Case("forda-out-at-a-file", lambda f, d: ["forda", "train", "--out", str(f.a_file / "x")],
         "--out: ", before_torch=True),
    Case("forda-out-in-proc", lambda f, d: ["forda", "train", "--out", "/proc/linattn-x"],
         "--out: /proc/linattn-x: ", before_torch=True),
    Case("forda-resume-garbage", _resume("run_garbage"), "run.json: not valid JSON",
         before_torch=True),
    Case("forda-resume-empty", _resume("run_empty"), "run.json: not valid JSON",
         before_torch=True),
    Case("forda-resume-not-an-object", _resume("run_list"), "run.json: expected a JSON object",
         before_torch=True),
    Case("forda-resume-bad-params", _resume("run_params"), "run.json: params: expected an "
         "object", before_torch=True),
    Case("forda-resume-bad-stages", _resume("run_stages"), "run.json: stages: expected",
         before_torch=True),
    Case("forda-resume-deep-json", _resume("run_deep"), "run.json: not valid JSON (nested too "
         "deeply)", before_torch=True),
    Case("forda-d-model-absurd", _forda_train("--set", "d_model=1000000000"), "--set: "
         "d_model: training this model needs about", memory=ABSURD_AS, absent=("run",)),
    # parameters that fit, activations that do not: it ran for minutes (issue 51 fifth probe)
    Case("forda-num-heads-activations-absurd", _forda_train("--set", "num_heads=1000000"),
         "--set: num_heads: training this model needs about", memory=ABSURD_AS,
         absent=("run",)),
    # issue 51 probe: OUT/run.lock a symbolic link had the owner's pid written through it
    # (the file it points to lost) and the link deleted; a FIFO there was deleted
    *(Case(f"{cmd}-lock-file-{kind}", argv, "run.lock: not a regular file", setup=_odd_lock(kind),
           check=_odd_lock_kept(kind))
      for cmd, argv in (("lm", _lm()), ("forda", _forda_train()), ("recall", _recall()))
      for kind in ("symlink", "fifo")),
    Case("forda-out-in-use", _forda_train(), "in use by another linattn run",
         setup=_held("run"), check=lambda d: _match(d / "run", [_io_lock_file()])),
    # seeds past what the generators take (issue 51): named, before torch, no run left
    *(Case(f"{name}-seed-huge", argv, f"--{flag}: expected an integer in [0, 4294967295], got "
           f"{2**70}", before_torch=True, absent=("run", "grid"))
      for name, flag, argv in (
          ("forda", "seed", _forda_train("--seed", str(2**70))),
          ("recall", "seed", _recall("--seed", str(2**70))),
          ("recall-table", "seeds", _recall_table("--seeds", f"0,{2**70}")),
          ("lm", "seed", _lm("--seed", str(2**70))),
          ("generate", "seed", _gen("--seed", str(2**70))))),
    Case("forda-resume-seed-huge", _resume("run_seed"), "run.json: params: random_state: "
         f"expected an integer in [0, 4294967295], got {2**70}"),
    Case("forda-out-disk-full", _forda_train(), "run.json: File too large", fsize=200,
         absent=("run",)),
    Case("forda-export-disk-full",
         lambda f, d: ["forda", "train", "--resume", "--out", str(d / "run"), "--data-dir",
                       str(DATA), "--threads", "1", "--quiet", "--export", str(d / "export")],
         "export/model.safetensors: File too large", fsize=2000, setup=_copy_forda_run,
         absent=("export/model.safetensors", "export/config.json", "export/test.json")),
    # a user's own data files: one line naming the file, line and what is wrong, no run
    *(Case(f"forda-data-{name.replace('_', '-')}", _forda_on(name), match, absent=("run",))
      for name, match in (
          ("one_class", "FordA_TRAIN.tsv: every series has the label 1; a classifier needs at "
                        "least 2 classes"),
          ("nan_inside", "FordA_TRAIN.tsv line 4 has a missing value (NaN) at sample 9, inside "
                         "the series"),
          ("value_1e39", "FordA_TRAIN.tsv line 6, column 8: '1e39' is not a finite number "
                         "float32 holds"),
          ("labels_1e20", "FordA_TRAIN.tsv line 1: the label 2e+20 is not an integer class id"),
          ("labels_half", "FordA_TRAIN.tsv line 1: the label 1.5 is not an integer class id"),
          ("test_label_unseen", "FordA_TEST.tsv line 7: label 3 is not a class of "
                                "FordA_TRAIN.tsv (-1, 1)"),
          ("values_3e38", "FordA_TRAIN.tsv line 6: values up to 3e+38 overflow the model's "
                          "float32 arithmetic"),
          ("test_values_3e38", "FordA_TEST.tsv line 3: values up to 3e+38 overflow the "
                               "model's float32 arithmetic"))),
    # $LINATTN_DATA naming no folder fell through to a download (issue 51 fifth probe)
    Case("forda-linattn-data-no-folder",
         lambda f, d: [a for a in _forda_train()(f, d) if a not in ("--data-dir", str(DATA))],
         "LINATTN_DATA: /nonexistent/linattn-data: no such folder",
         env=(("LINATTN_DATA", "/nonexistent/linattn-data"),), absent=("run",)),
    # the same TEST into a trained model: a traceback before the fifth probe of issue 51
    Case("evaluate-data-test-values-3e38",
         lambda f, d: [*_evaluate()(f, d), "--data-dir", str(f.bad_data["test_values_3e38"])],
         "FordA_TEST.tsv line 3: values up to 3e+38 overflow the model's float32 arithmetic",
         absent=("report",)),
    # issue 51 fifth probe: a FIFO as a data file fell back to a download (and its failure)
    *(Case(f"forda-{cmd}-data-file-a-fifo-{split.lower()}",
           lambda f, d, cmd=cmd: [*(_forda_train() if cmd == "train" else _evaluate())(f, d),
                                  "--data-dir", str(d / "data")],
           f"FordA_{split}.tsv: not a regular file (a FIFO)", setup=_data_with_a_fifo(split),
           absent=("run",)) for cmd in ("train", "evaluate") for split in ("TRAIN", "TEST")),
    # -- forda evaluate
    Case("evaluate-run-garbage", _evaluate("run_garbage"), "run.json: not valid JSON",
         before_torch=True),
    Case("evaluate-run-empty", _evaluate("run_empty"), "run.json: not valid JSON",
         before_torch=True),
    Case("evaluate-run-not-an-object", _evaluate("run_list"), "run.json: expected a JSON object",
         before_torch=True),
    Case("evaluate-run-deep-json", _evaluate("run_deep"), "run.json: not valid JSON (nested too "
         "deeply)", before_torch=True),
    Case("evaluate-threads", _evaluate("forda", "--threads", "-1"), "--threads: expected a "
         "positive integer, got -1", before_torch=True),
    Case("evaluate-report-dir-at-a-file",
         lambda f, d: ["forda", "evaluate", "--model", str(f.forda), "--report-dir",
                       str(f.a_file)], "--report-dir: ", before_torch=True),
    Case("evaluate-data-label-unknown",
         lambda f, d: ["forda", "evaluate", "--model", str(f.forda), "--data-dir",
                       str(f.bad_data["three_classes"]), "--no-baselines", "--threads", "1",
                       "--report-dir", str(d / "report")],
         "FordA_TRAIN.tsv line 3: label 3 is not a class of the model (-1, 1)",
         absent=("report/report.md",)),
    Case("evaluate-report-dir-disk-full", _evaluate(), ".png: File too large", fsize=2000,
         absent=("report/report.md",)),
    # -- lm train
    Case("lm-dropout-2", _lm("--dropout", "2"), "--dropout: expected a number in [0, 1), got 2",
         before_torch=True, absent=("run",)),
    Case("lm-lr-negative", _lm("--lr", "-1"), "--lr: expected a finite number > 0, got -1",
         before_torch=True),
    Case("lm-lr-nan", _lm("--lr", "nan"), "--lr: expected a finite number > 0, got nan",
         before_torch=True),
    # issue 51 probe: a learning rate float32 cannot hold was a traceback from the optimiser
    # (and left files behind): refused with the other options, before anything is written
    *(Case(f"{cmd}-{flag[2:]}-beyond-float32", argv(flag, "1e300"),
           f"{flag}: expected a finite number {op} that float32 holds", before_torch=True,
           absent=("run",))
      for cmd, argv in (("lm", _lm), ("recall", _recall))
      for flag, op in (("--lr", "> 0"), ("--weight-decay", ">= 0"))),
    Case("lm-lr-underflows-float32", _lm("--lr", "1e-300"), "--lr: expected a finite number "
         "> 0 that float32 holds", before_torch=True, absent=("run",)),
    Case("recall-lr-sweep-beyond-float32", _recall("--lr-sweep", "1e-3,1e300"), "--lr-sweep: "
         "expected a finite number > 0 that float32 holds", before_torch=True, absent=("run",)),
    *(Case(f"forda-{name}-beyond-float32", _forda_train(f"--set={name}=1e300"),
           f"{name} must be in", absent=("run",)) for name in ("lr", "weight_decay")),
    Case("lm-lr-inf", _lm("--lr", "inf"), "--lr: expected a finite number > 0, got inf",
         before_torch=True),
    Case("lm-feature-map", _lm("--feature-map", "bogus"), "--feature-map: expected one of elu",
         before_torch=True),
    Case("lm-chunk-size-0", _lm("--chunk-size", "0"), "--chunk-size: expected a positive "
         "integer", before_torch=True),
    Case("lm-context-0", _lm("--context", "0"), "--context: expected a positive integer",
         before_torch=True),
    Case("lm-batch-size-0", _lm("--batch-size", "0"), "--batch-size: expected a positive "
         "integer", before_torch=True),
    Case("lm-eval-every-0", _lm("--eval-every", "0"), "--eval-every: expected a positive "
         "integer", before_torch=True),
    Case("lm-heads-do-not-divide", _lm("--d-model", "15", "--num-heads", "2"),
         "--num-heads: d_model 15 is not divisible by 2", before_torch=True, absent=("run",)),
    Case("lm-threads-negative", _lm("--threads", "-1"), "--threads: expected a positive integer",
         before_torch=True),
    Case("lm-steps-negative", _lm("--steps", "-1"), "--steps: expected a positive integer",
         before_torch=True),
    Case("lm-steps-0", _lm("--steps", "0"), "--steps: expected a positive integer",
         before_torch=True),
    Case("lm-max-time-negative", _lm("--max-time", "-5"), "--max-time: expected a finite "
         "number > 0", before_torch=True),
    Case("lm-max-time-0", _lm("--max-time", "0"), "--max-time: expected a finite number > 0",
         before_torch=True),
    Case("lm-no-budget", lambda f, d: ["lm", "train", "--out", str(d / "run"), *LM_TINY],
         "--steps, --max-time: give a budget", before_torch=True),
    Case("lm-window-without-hybrid", _lm("--window", "4"), "--window: not used with "
         "attention='linear'", before_torch=True),
    Case("lm-out-at-a-file", lambda f, d: ["lm", "train", "--out", str(f.a_file), "--steps",
                                           "1", *LM_TINY], "--out: ", before_torch=True),
    Case("lm-out-disk-full", _lm(), "run/checkpoint.pt: File too large", fsize=2000,
         absent=("run/checkpoint.pt",)),
    # absurd sizes: the estimate refuses them before anything is allocated (issue 51)
    *(Case(f"lm-{flag[2:]}-{value}-absurd", _lm(flag, value, *extra),
           f"{flag}: training this model needs about", before_torch=True, memory=ABSURD_AS,
           absent=("run",))
      for flag, value, extra in (("--d-model", "65536", ("--num-heads", "1")),
                                 ("--d-model", "1000000000", ("--num-heads", "1")),
                                 ("--batch-size", "1000000000", ()),
                                 ("--short-conv", "1000000000", ()),
                                 ("--context", "1000000000", ()))),
    # the library's errors of a valid-looking option, one line before anything is trained
    Case("lm-context-past-the-corpus", _lm("--context", "40000", "--batch-size", "1"),
         "--context: 40000 needs at least 40001 validation tokens, the corpus has",
         absent=("run",)),
    Case("lm-corpus-bytes-too-few", _lm("--corpus-bytes", "20000"), "--corpus-bytes: 20000 "
         "bytes hold", absent=("run",)),
    Case("lm-hybrid-window-absurd", _lm("--attention", "hybrid", "--window", "1000000000000"),
         "--window: expected an integer in [1, 2147483647], got 1000000000000",
         before_torch=True),
    # a window within the range but beyond memory: the hybrid's ring buffers of the last
    # window keys and values were allocated whatever the context ("out of memory (238 GiB
    # asked for)", no option named: issue 51 fifth probe); now estimated, --window named
    Case("lm-hybrid-window-beyond-memory",
         _lm("--attention", "hybrid", "--window", "1000000000"),
         "--window: training this model needs about", before_torch=True, memory=ABSURD_AS,
         absent=("run",)),
    Case("lm-cosformer-context", _lm("--attention", "cosformer", "--context", "2000"),
         "--context: cosformer's weights hold for 1024 positions, 2000 asked for",
         before_torch=True, absent=("run",)),
    Case("lm-out-removed-by-another-probe", _lm(), "", status=0, code=PROBE_RACED,
         check=lambda d: _match(d / "run", ["checkpoint.pt", "metrics.jsonl", "result.json"])),
    # stderr on a full device (`2>/dev/full`): a run still runs (its progress bar ended it with
    # status 1 and nothing but the lock written), an error is still status 2 (was 1: printing
    # the error line failed)
    Case("lm-stderr-full", lambda f, d: [a for a in _lm()(f, d) if a != "--quiet"], "",
         status=0, stderr="full", check=lambda d: _match(d / "run", [
             "checkpoint.pt", "metrics.jsonl", "result.json"])),
    Case("unknown-flag-stderr-full", lambda f, d: ["lm", "train", "--bogus"], "",
         stderr="full", before_torch=True),
    Case("solve-stderr-full-bad-input", lambda f, d: ["solve"], "", stdin=b"garbage\n",
         stderr="full"),
    Case("lm-existing-stderr-full", _lm(), "", stderr="full", setup=lambda f, d: (
        (d / "run").mkdir(), (d / "run" / "checkpoint.pt").write_bytes(b"x"))),
    # stderr closed (`2>&-`): the progress bar has nowhere to go, and the run still runs
    Case("lm-stderr-closed", lambda f, d: [a for a in _lm()(f, d) if a != "--quiet"], "",
         status=0, closed="stderr", check=lambda d: _match(d / "run", [
             "checkpoint.pt", "metrics.jsonl", "result.json"])),
    Case("forda-stderr-closed", lambda f, d: [a for a in _forda_train()(f, d) if a != "--quiet"],
         "", status=0, closed="stderr"),
    Case("lm-out-in-use", _lm(), "--out: ", setup=_held("run"),
         check=lambda d: _match(d / "run", [_io_lock_file()])),
    Case("lm-diverges", _lm("--lr", "1e30", "--steps", "20", "--checkpoint-every", "0"),
         "training diverged at step 2: the loss is nan"),
    # -- lm generate
    Case("generate-temperature-nan", _gen("--temperature", "nan"), "--temperature: expected a "
         "finite number >= 0, got nan", before_torch=True),
    Case("generate-temperature-negative", _gen("--temperature", "-1"), "--temperature: "
         "expected a finite number >= 0, got -1", before_torch=True),
    Case("generate-top-k-0", _gen("--top-k", "0"), "--top-k: expected a positive integer",
         before_torch=True),
    Case("generate-max-new-tokens-negative", _gen("--max-new-tokens", "-1"),
         "--max-new-tokens: expected a non-negative integer, got -1", before_torch=True),
    Case("generate-threads-negative", _gen("--threads", "-2"), "--threads: expected a positive "
         "integer, got -2", before_torch=True),
    Case("generate-no-prompt", lambda f, d: ["lm", "generate"], "the following arguments are "
         "required: --prompt", before_torch=True),
    Case("generate-garbage-checkpoint", _gen(model="lm_garbage"), "cannot load a model (not a "
         "torch checkpoint"),
    Case("generate-stdout-full", _gen(), "cannot write the output", stdout="full"),
    Case("generate-reader-leaves", _gen("--max-new-tokens", "100000"), "", status=1,
         stdout="head"),
    Case("generate-cosformer-past-its-horizon", _gen("--max-new-tokens", "2000",
                                                     model="lm_cos"),
         "--max-new-tokens: cosformer's weights hold for 1024 positions, 2003 asked for"),
    Case("generate-temperature-tiny", _gen("--temperature", "1e-300", "--max-new-tokens", "5"),
         "", status=0),
    Case("generate-stdout-closed", _gen(), "cannot write the output (standard output is "
         "closed)", closed="stdout"),
    # messages that name the right thing (issue 51, 21)
    Case("generate-prompt-not-utf8",
         lambda f, d: ["lm", "generate", "--model", str(f.lm), "--prompt", "ab\udcffc",
                       "--threads", "1"],
         "--prompt: not UTF-8 text (character 2 is a lone surrogate '\\udcff'"),
    Case("generate-checkpoint-missing-a-tensor", _gen(model="lm_missing"),
         "checkpoint.pt: cannot load a model (missing tensor 'blocks.0.attn.q_proj.weight')"),
    Case("generate-threads-capped", _gen("--threads", "100000", "--max-new-tokens", "2"),
         "--threads: 100000 threads asked for", status=0),
    # a checkpoint that is a FIFO (issue 51, second probe: torch.load waited for a writer)
    Case("generate-checkpoint-a-fifo",
         lambda f, d: ["lm", "generate", "--model", str(d / "m"), "--prompt", "x"],
         "checkpoint.pt: cannot load a model (not a regular file)", setup=_fifo_checkpoint),
    # other programs' files: torch.load's KeyError(6) on a broken safetensors header said
    # "cannot load a model (6)"; the FordA model's safetensors (torch reads it: a dict of
    # tensors) "cannot load a model ('model_config')"
    Case("generate-checkpoint-another-format",
         lambda f, d: ["lm", "generate", "--model", str(d / "x.bin"), "--prompt", "x"],
         "x.bin: cannot load a model (not a torch checkpoint)",
         setup=lambda f, d: (d / "x.bin").write_bytes(b"h\x06" + bytes(6) + b"{}")),
    Case("generate-checkpoint-a-safetensors-file",
         lambda f, d: ["lm", "generate", "--model", str(f.forda / "model" / "model.safetensors"),
                       "--prompt", "x"],
         "model.safetensors: cannot load a model (no 'model_config': not a checkpoint of "
         "linattn's language model)"),
    # an empty --out (an unset shell variable) trained into the current folder
    *(Case(f"{cmd}-out-empty", argv, f"{opt}: expected a path, got ''", absent=absent)
      for cmd, opt, argv, absent in (
          ("lm", "--out", _lm("--out", ""), ("checkpoint.pt", "metrics.jsonl", "result.json")),
          ("recall", "--out", _recall("--out", ""), ("result.json", "run.lock")),
          ("forda", "--out", _forda_train("--out", ""), ("run.json", "val")),
          ("evaluate", "--report-dir", _evaluate("forda", "--report-dir", ""), ("report.md",)),
          ("plot", "--output", lambda f, d: ["plot", "feature-maps", "-o", ""], ()))),
    Case("lm-resume-checkpoint-a-fifo", _lm("--resume"),
         "checkpoint.pt: unreadable checkpoint (not a regular file)",
         setup=_fifo_checkpoint_in("run")),
    # -- bench
    Case("bench-feature-map", _bench("--feature-map", "bogus"), "--feature-map: expected one of",
         before_torch=True),
    Case("bench-crossover-negative", _bench("--crossover", "-1"), "--crossover: expected a "
         "positive integer, got -1", before_torch=True),
    Case("bench-T-0", _bench("-T", "0"), "-T: expected a positive integer, got 0",
         before_torch=True),
    Case("bench-threads-0", _bench("--threads", "0"), "--threads: expected a positive integer",
         before_torch=True),
    *(Case(f"bench-{name}-absurd", _bench(*extra), f"{flag}: this benchmark needs about",
           before_torch=True, memory=ABSURD_AS)
      for name, flag, extra in (("T", "-T", ("-T", str(10**12))),
                                ("d", "-d", ("-d", str(10**6), "-T", "16")),
                                ("crossover", "--crossover", ("--crossover", "1000000000")))),
    # issue 51 probe: --repeats had no bound (10**12 ran for ever); --crossover with
    # --no-crossover exited 0 silently
    Case("bench-repeats-absurd", _bench("--repeats", str(10**12)), "--repeats: expected an "
         "integer in [1, 1000], got 1000000000000", before_torch=True),
    Case("bench-crossover-and-no-crossover", _bench("--crossover", "64", "--no-crossover"),
         "--no-crossover: not allowed with argument --crossover", before_torch=True),
    Case("bench-plot-folder-missing", lambda f, d: ["bench", "--plot", str(d / "no" / "b.png")],
         "--plot: folder", before_torch=True),
    Case("bench-plot-disk-full", _bench("--crossover", "8", "--no-portable"),
         "b.png: File too large", absent=("b.png",), code=BENCH_PLOT_ONLY),
    Case("bench-plot-symlink", _bench("--crossover", "8", "--no-portable", "--plot",
                                      "link.png"), "", status=0, code=BENCH_STUBBED,
         setup=_link_to_png, check=_still_a_link),
    Case("bench-plot-dangling-link", _bench("--crossover", "8", "--no-portable", "--plot",
                                            "gone.png"), "--plot: folder", code=BENCH_STUBBED,
         setup=_dangling_links, check=_links_kept(False)),
    Case("bench-plot-dangling-link-made", _bench("--crossover", "8", "--no-portable", "--plot",
                                                 "new.png"), "", status=0, code=BENCH_STUBBED,
         setup=_dangling_links, check=_links_kept(True)),
    Case("bench-plot-dev-full", _bench("--crossover", "8", "--no-portable", "--plot",
                                       "/dev/full"), "/dev/full: No space left on device",
         code=BENCH_STUBBED, check=_devices_stay),
    # -- recall
    Case("recall-pairs-too-many", _recall("--pairs", "5"), "--seq-len: 16 is too short for 5 "
         "key-value pairs", before_torch=True, absent=("run",)),
    Case("recall-lr-sweep-bad", _recall("--lr-sweep", "1e-3,-1"), "--lr-sweep: expected a "
         "finite number > 0, got -1", before_torch=True),
    Case("recall-mixers-bogus", lambda f, d: ["recall", "table", "--mixers", "softmax,bogus",
                                              "--out", str(d / "grid")],
         "--mixers: expected one of", before_torch=True),
    Case("recall-out-at-a-file", lambda f, d: ["recall", "train", "--out", str(f.a_file)],
         "--out: ", before_torch=True),
    # issue 51 probe: a batch past every set's size failed in torch's split (a traceback)
    Case("recall-batch-size-huge", _recall("--batch-size", str(10**30)), "", status=0),
    Case("recall-threads-capped", _recall("--threads", "100000"), "--threads: 100000 threads "
         "asked for", status=0),
    Case("recall-table-threads-capped", _recall_table("--threads", "100000"), "--threads: "
         "100000 threads asked for", status=0),
    *(Case(f"recall-{flag[2:]}-absurd", _recall(flag, value), f"{flag}: this cell needs about",
           before_torch=True, memory=ABSURD_AS, absent=("run",))
      for flag, value in (("--train-mix", "1000000000:2:1"), ("--vocab-size", "1000000000"),
                          ("--d-model", "1000000000"), ("--mlp-dim", "1000000000"),
                          ("--short-conv", "1000000000"), ("--eval-at", "1000000000:2"))),
    Case("recall-table-absurd", _recall_table("--eval-at", "1000000000:2"), "--eval-at: this "
         "cell needs about", before_torch=True, memory=ABSURD_AS, absent=("grid",)),
    Case("recall-hybrid-window-absurd", _recall("--mixer", "hybrid", "--window",
                                                "1000000000000"),
         "--window: expected an integer in [1, 2147483647], got 1000000000000",
         before_torch=True),
    *(Case(f"recall-{mixer}-window-beyond-memory",
           _recall("--mixer", mixer, "--window", "1000000000"),
           "--window: this cell needs about", before_torch=True, memory=ABSURD_AS,
           absent=("run",)) for mixer in ("hybrid", "based")),
    Case("recall-cosformer-seq-len", _recall("--mixer", "cosformer", "--seq-len", "2048"),
         "--seq-len: cosformer's weights hold for 1024 positions, 2048 asked for",
         before_torch=True),
    # a cell that is a FIFO: its read waited for a writer for ever (issue 51 fifth probe)
    Case("recall-table-fifo-cell", _recall_table(), "grid/softmax-d16-T16-P2.json: a FIFO",
         setup=_fifo_cell),
    Case("recall-table-deep-cell", _recall_table(), "", status=0, setup=_deep_cell,
         check=lambda d: _match(d / "grid", ["softmax-d16-T16-P2.json"])),
    Case("recall-out-in-use", _recall(), "in use by another linattn run", setup=_held("run"),
         check=lambda d: _match(d / "run", [_io_lock_file()])),
    Case("recall-table-out-in-use", _recall_table(), "in use by another linattn run",
         setup=_held("grid"), check=lambda d: _match(d / "grid", [_io_lock_file()])),
    Case("recall-out-holds-a-run", _recall(), "already holds a run (result.json); pass "
         "--replace", before_torch=True, setup=_finished_recall_run),
    Case("recall-out-finished-meanwhile", _recall(), "already holds a run (result.json); "
         "pass --replace", code=RECALL_RACED,
         check=_still_the_old_run),
    Case("recall-out-replaced", _recall("--replace"), "", status=0,
         setup=_finished_recall_run,
         check=lambda d: _match(d / "run", ["result.json"], "old_run")),
    Case("recall-out-disk-full", _recall(), "run/result.json: File too large", fsize=200,
         absent=("run/result.json",)),
    # -- plot
    Case("plot-folder-missing", lambda f, d: ["plot", "feature-maps", "-o", str(d / "no" / "x")],
         "--output: folder", before_torch=True),
    Case("plot-output-symlink", lambda f, d: ["plot", "feature-maps", "-o", str(d / "link.png")],
         "", status=0, setup=_link_to_png, check=_still_a_link),
    # issue 51 probe: a dangling link was replaced by a regular file; it is written through
    # (its file made where it points), or refused when its folder does not exist
    Case("plot-output-dangling-link", lambda f, d: ["plot", "feature-maps", "-o",
                                                    str(d / "gone.png")],
         "--output: folder", setup=_dangling_links, check=_links_kept(False)),
    Case("plot-output-dangling-link-made", lambda f, d: ["plot", "feature-maps", "-o",
                                                         str(d / "new.png")],
         "", status=0, setup=_dangling_links, check=_links_kept(True)),
    Case("plot-output-fifo", lambda f, d: ["plot", "feature-maps", "-o", str(d / "fifo")],
         "fifo: a FIFO that no process reads", setup=_fifo, check=_still_a_fifo),
    Case("plot-output-dev-null", lambda f, d: ["plot", "feature-maps", "-o", os.devnull], "",
         status=0, check=_devices_stay),
    Case("plot-output-dev-full", lambda f, d: ["plot", "feature-maps", "-o", "/dev/full"],
         "/dev/full: No space left on device", check=_devices_stay),
    Case("plot-output-a-folder", lambda f, d: ["plot", "feature-maps", "-o", str(d)],
         "--output: ", before_torch=True),
    Case("plot-disk-full", lambda f, d: ["plot", "feature-maps", "-o", str(d / "maps.png")],
         "maps.png: File too large", fsize=2000, absent=("maps.png",)),
]


def _relabel(one: str, other: str) -> Callable[[list], None]:
    """An edit of :data:`BAD_DATA`: label 1 becomes ``one``, -1 ``other``."""
    return lambda rows: [r.__setitem__(0, one if r[0] == "1" else other) for r in rows]


#: A user's own FordA files, each with one thing wrong (issue 51): name -> (edit of the TRAIN
#: rows, edit of the TEST rows); a row is [label, value, ...] as text.
BAD_DATA: dict[str, tuple[Callable[[list], None] | None, Callable[[list], None] | None]] = {
    "one_class": (lambda rows: [r.__setitem__(0, "1") for r in rows], None),
    "nan_inside": (lambda rows: rows[3].__setitem__(10, "nan"), None),
    "value_1e39": (lambda rows: rows[5].__setitem__(7, "1e39"), None),
    "labels_1e20": (_relabel("1e20", "2e20"), _relabel("1e20", "2e20")),
    "labels_half": (_relabel("0.5", "1.5"), _relabel("0.5", "1.5")),
    "test_label_unseen": (None, lambda rows: rows[6].__setitem__(0, "3")),
    # finite float32 values whose arithmetic overflows ("training diverged ... lower the
    # learning rate" before the fifth probe of issue 51)
    "values_3e38": (lambda rows: [rows[5].__setitem__(j, "3e38" if j % 2 else "-3e38")
                                  for j in range(1, len(rows[5]))], None),
    "test_values_3e38": (None, lambda rows: [rows[2].__setitem__(j, "3e38" if j % 2 else "-3e38")
                                             for j in range(1, len(rows[2]))]),
    # a third class in both files: fine data, but not the classes of the fixture's model
    "three_classes": (lambda rows: rows[2].__setitem__(0, "3"),
                      lambda rows: rows[4].__setitem__(0, "3")),
}


def _bad_data(root: Path) -> dict[str, Path]:
    """The folders of :data:`BAD_DATA`, each with a SHA256SUMS (a user's variant of FordA)."""
    import gzip
    import hashlib

    folders = {}
    for name, edits in BAD_DATA.items():
        d = root / name
        d.mkdir(parents=True)
        sums = []
        for split, edit in zip(("TRAIN", "TEST"), edits, strict=True):
            text = gzip.decompress((DATA / f"FordA_{split}.tsv.gz").read_bytes()).decode()
            rows = [line.split("\t") for line in text.splitlines()]
            if edit is not None:
                edit(rows)
            data = ("\n".join("\t".join(r) for r in rows) + "\n").encode()
            (d / f"FordA_{split}.tsv").write_bytes(data)
            sums.append(f"{hashlib.sha256(data).hexdigest()}  FordA_{split}.tsv\n")
        (d / "SHA256SUMS").write_text("".join(sums))
        folders[name] = d
    return folders


def _fixtures(root: Path) -> SimpleNamespace:
    """The files the rows read, made in this process (torch is loaded here already): a FordA
    run folder with a tiny model, an LM checkpoint, and broken copies of each. Training them
    here also builds the compiled kernels and the dispatcher's calibration for one thread,
    which the rows then find in the cache (a row under RLIMIT_FSIZE could not write them)."""
    import torch

    from linattn.datasets import load_ucr
    from linattn.lm import LMConfig, TrainConfig, train
    from linattn.ops import native
    from linattn.tsc import LinearAttentionClassifier

    # every ISA build the rows may load (``linattn bench`` times each one), built here: a row
    # under RLIMIT_FSIZE could not write it, and would say so on a second line of stderr
    for isa in native.runnable_isas():
        native.load(isa)
    f = SimpleNamespace()
    threads = torch.get_num_threads()
    try:
        X, y, _, _ = load_ucr("FordA", data_dir=DATA)
        est = LinearAttentionClassifier(**FORDA_PARAMS, n_threads=1).fit(X[:64], y[:64])
        f.forda = root / "forda"
        est.save(f.forda / "model")
        est.save(f.forda / "full" / "model")
        params = {k: v for k, v in est.get_params().items()
                  if k not in ("n_threads", "device", "verbose")}
        (f.forda / "run.json").write_text(json.dumps({
            "recipe": "reference", "seed": 0, "params": params, "stages": ["full"],
            "subset": 64, "val_split": {"fraction": 0.2, "seed": 0}, "wall_s": 1.0}))
        torch.set_num_threads(1)
        train(LMConfig(vocab_size=256, d_model=16, num_layers=1, num_heads=2),
              TrainConfig(context=16, batch_size=2, steps=1, val_tokens=64, eval_every=1,
                          warmup=1),
              out=root / "lm", corpus=(b"def f(x):\n    return x\n" * 100, b"x = 1\n" * 50,
                                       {}))
        f.lm = root / "lm"
        train(LMConfig(vocab_size=256, d_model=16, num_layers=1, num_heads=2,
                       attention="cosformer"),
              TrainConfig(context=16, batch_size=2, steps=1, val_tokens=64, eval_every=1,
                          warmup=1),
              out=root / "lm_cos", corpus=(b"def f(x):\n    return x\n" * 100,
                                           b"x = 1\n" * 50, {}))
        f.lm_cos = root / "lm_cos"
    finally:
        torch.set_num_threads(threads)

    f.a_file = root / "a_file"
    f.a_file.write_text("not a folder\n")
    runs = {"run_garbage": b"\x00garbage{", "run_empty": b"", "run_list": b"[1, 2]",
            "run_params": b'{"params": 3, "stages": ["full"]}',
            "run_stages": b'{"params": {}, "stages": ["test"]}',
            "run_deep": b"[" * 100_000 + b"]" * 100_000,
            # a run an older linattn started with --seed 2**70 (it crashed, and so did resume)
            "run_seed": json.dumps({"params": {**params, "random_state": 2**70},
                                    "stages": ["full"], "subset": 64}).encode()}
    for name, data in runs.items():
        d = root / name
        shutil.copytree(f.forda / "model", d / "model")
        (d / "run.json").write_bytes(data)
        setattr(f, name, d)
    f.bad_data = _bad_data(root / "bad_data")
    # the LM's checkpoint without one of its tensors
    ck = torch.load(f.lm / "checkpoint.pt", weights_only=True)
    ck["model"].pop("blocks.0.attn.q_proj.weight")
    (root / "lm_missing").mkdir()
    torch.save(ck, root / "lm_missing" / "checkpoint.pt")
    f.lm_missing = root / "lm_missing"
    f.lm_garbage = root / "lm_garbage"
    f.lm_garbage.mkdir()
    (f.lm_garbage / "checkpoint.pt").write_bytes(b"garbage\x80\x03")
    return f


@dataclass
class Result:
    status: int | None
    stderr: str
    seconds: float


def _run(case: Case, f: SimpleNamespace, d: Path) -> Result:
    d.mkdir(parents=True)
    if case.setup is not None:
        case.setup(f, d)
    argv = case.argv(f, d)
    if case.code:
        cmd = [sys.executable, "-c", case.code, *argv]
    elif case.fsize or case.before_torch or case.memory:
        cmd = [sys.executable, "-c", TRAMPOLINE, str(case.fsize), str(case.memory),
               str(int(case.before_torch)), *argv]
    else:
        cmd = [sys.executable, "-m", "linattn", *argv]
    if case.closed:  # the shell closes the stream, then execs the command without it
        cmd = ["sh", "-c", f'exec "$@" {">&-" if case.closed == "stdout" else "2>&-"}', "sh",
               *cmd]
    # one thread a process: the pool runs several on few cores (and the fixtures calibrated
    # the dispatcher for one thread; a row under RLIMIT_FSIZE could not write a calibration)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", **dict(case.env)}
    t0 = time.perf_counter()
    if case.stdout == "head":  # `linattn ... | head -c 4`: read a little, then leave
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=d, env=env)
        p.stdout.read(4)
        p.stdout.close()
        try:
            err = p.stderr.read()
            status = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            return Result(None, "timed out", time.perf_counter() - t0)
        return Result(status, err.decode(errors="replace"), time.perf_counter() - t0)
    out = open("/dev/full", "wb") if case.stdout == "full" else subprocess.DEVNULL
    err = open("/dev/full", "wb") if case.stderr == "full" else subprocess.PIPE
    try:
        done = subprocess.run(cmd, input=case.stdin, stdout=out, stderr=err, cwd=d,
                              env=env, timeout=120)
    except subprocess.TimeoutExpired:
        return Result(None, "timed out", time.perf_counter() - t0)
    finally:
        for stream, mode in ((out, case.stdout), (err, case.stderr)):
            if mode == "full":
                stream.close()
    return Result(done.returncode, (done.stderr or b"").decode(errors="replace"),
                  time.perf_counter() - t0)


def _selected(request) -> set[str]:
    """The ids of the rows this session runs (``-k``, a test id): the table runs only those."""
    return {item.callspec.params["case"].id for item in request.session.items
            if getattr(item, "originalname", "") == "test_one_line_and_status"}


@pytest.fixture(scope="module")
def table(tmp_path_factory, request) -> dict[str, tuple[Result, Path]]:
    """Every selected row, run in a pool of 3 processes at a time; the test of each row reads
    its result."""
    root = tmp_path_factory.mktemp("contract")
    f = _fixtures(root / "fixtures")
    selected = _selected(request)
    cases = [c for c in CASES if c.id in selected
             and (HAS_FULL or ("full" not in (c.stdout, c.stderr) and "dev-full" not in c.id))]
    if not Path("/proc").is_dir():
        cases = [c for c in cases if "proc" not in c.id]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(3) as pool:
        futures = {c.id: pool.submit(_run, c, f, root / c.id) for c in cases}
        results = {k: (fut.result(), root / k) for k, fut in futures.items()}
    print(f"\ncontract table: {len(cases)} rows in {time.perf_counter() - t0:.1f} s")
    for k, (r, _) in sorted(results.items(), key=lambda kv: -kv[1][0].seconds):
        print(f"  {r.seconds:5.1f} s  {k}")
    return results


def _leftovers(d: Path) -> list[str]:
    """Half-written files under ``d``: temporary files of an atomic write still there, JSON
    files that do not parse, JSON-lines files with a line that does not."""
    bad = []
    for p in d.rglob("*"):
        if p.name.startswith("."):
            bad.append(f"{p}: a temporary file left behind")
        elif p.is_file() and p.suffix in (".json", ".jsonl"):
            text = p.read_text(errors="replace")
            lines = text.splitlines() if p.suffix == ".jsonl" else [text]
            try:
                for line in lines:
                    json.loads(line)
            except ValueError:
                bad.append(f"{p}: half written")
    return bad


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_one_line_and_status(case: Case, table) -> None:
    if case.id not in table:
        pytest.skip("needs /dev/full or /proc")
    result, d = table[case.id]
    lines = result.stderr.splitlines()
    assert result.status == case.status, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    if case.status == 1 or not case.match:  # the reader left, or a quiet success
        assert result.stderr == ""
    else:
        assert len(lines) == 1, result.stderr
        assert case.match in lines[0], lines[0]
    if case.status == 2 and case.match:
        assert lines[0].startswith("linattn") and ": error: " in lines[0], lines[0]
    assert _leftovers(d) == []
    for rel in case.absent:
        assert not (d / rel).exists(), rel
    if case.check is not None:
        case.check(d)


def test_the_table_covers_every_subcommand() -> None:
    from linattn.cli import SUBCOMMANDS

    covered = {c.id.split("-")[0] for c in CASES}
    assert {"solve", "forda", "evaluate", "lm", "generate", "bench", "plot", "recall"} <= covered
    assert set(SUBCOMMANDS) <= covered | {"evaluate", "generate"}

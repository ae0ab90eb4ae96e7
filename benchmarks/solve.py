"""Benchmark of ``linattn solve`` at full size (N = 10^5, d = 64, ~144 MB of text).

Prints markdown tables for docs/bench-ops.md:

1. end to end, stdin from a file, stdout to a file: the C baseline (``solve_baseline.c``, built
   with ``cc -O2``: fread + strtod), ``linattn solve`` as shipped (compiled parser, numpy
   engine: torch is never imported), with ``--engine torch`` (the library's op), with the pure
   Python parser, and the cost of starting Python and importing torch or numpy alone. Wall time
   (median of --repeat runs, interleaved so that a busy machine slows every row alike) and peak
   resident memory.
2. in process, stage by stage: reading stdin, each parser (the compiled one, the fallback,
   numpy's ``fromstring``, pyarrow's and polars' CSV readers where installed), the computation
   through the library's op and with plain numpy, and formatting the output.

Usage: python benchmarks/solve.py [--n 100000] [--d 64] [--repeat 5] [--input FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

def generate(n: int, d: int, seed: int = 0) -> bytes:
    """The judge's input: uniform values in (-10, 10) with 4 decimals ('-3.1416'), a row a line.

    Built digit by digit with numpy (np.savetxt would take a minute at this size)."""
    rng = np.random.default_rng(seed)
    m = rng.integers(-99_999, 100_000, size=(3 * n, d))  # value = m / 10^4
    a = np.abs(m)
    cells = np.zeros((3 * n, d, 8), dtype=np.uint8)  # sign, digit, '.', 4 digits, separator
    cells[..., 0] = np.where(m < 0, ord("-"), 0)
    cells[..., 1] = ord("0") + a // 10_000
    cells[..., 2] = ord(".")
    for i, p in enumerate((1000, 100, 10, 1)):
        cells[..., 3 + i] = ord("0") + a // p % 10
    cells[..., 7] = ord(" ")
    cells[:, -1, 7] = ord("\n")
    flat = cells.reshape(-1)
    return f"{n} {d}\n".encode() + flat[flat != 0].tobytes()  # drop the empty sign slots


def run_process(cmd: list[str], stdin: Path, env: dict[str, str]) -> tuple[float, float, bytes]:
    """Run cmd < stdin > file; (wall seconds, peak RSS MiB, stdout). Raises if it fails.

    The peak is at least this process's own resident size (Linux carries ru_maxrss over fork
    and exec), so keep this process small: that is why the input is generated in a child."""
    with (
        open(stdin, "rb") as fin,
        tempfile.TemporaryFile() as fout,
        tempfile.TemporaryFile() as ferr,
    ):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=ferr, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        fout.seek(0)
        ferr.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd} exited {proc.returncode}: {ferr.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, fout.read()


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """(median seconds over ``repeat`` calls, the last result)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def end_to_end(inp: Path, repeat: int, workdir: Path) -> list[tuple[str, float, float, float]]:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        sys.exit("no C compiler: the baseline needs cc")
    baseline = workdir / "solve_baseline"
    subprocess.run([cc, "-O2", "-o", str(baseline), str(HERE / "solve_baseline.c")], check=True)
    env = dict(os.environ)
    py = sys.executable
    rows: dict[str, tuple[list[str], dict[str, str]]] = {
        "C baseline (cc -O2, fread + strtod)": ([str(baseline)], env),
        "`linattn solve` (default: compiled parser, numpy engine)": (
            [py, "-m", "linattn", "solve"], env),
        "`linattn solve --engine torch` (the library's op)": (
            [py, "-m", "linattn", "solve", "--engine", "torch"], env),
        "`linattn solve` (LINATTN_SOLVE_PARSER=python)": (
            [py, "-m", "linattn", "solve"],
            {**env, "LINATTN_SOLVE_PARSER": "python"},
        ),
        "python -c 'import torch' (no input read)": ([py, "-c", "import torch"], env),
        "python -c 'import numpy' (no input read)": ([py, "-c", "import numpy"], env),
    }
    default = rows["`linattn solve` (default: compiled parser, numpy engine)"][0]
    run_process(default, inp, env)  # build the parser cache
    walls: dict[str, list[float]] = {k: [] for k in rows}
    rss: dict[str, float] = dict.fromkeys(rows, 0.0)
    ref_out: bytes | None = None
    for _ in range(repeat):  # round robin: load from other processes hits every row alike
        for name, (cmd, e) in rows.items():
            wall, peak, out = run_process(cmd, inp, e)
            walls[name].append(wall)
            rss[name] = max(rss[name], peak)
            if name.startswith("C "):
                ref_out = out
            elif out:
                got = np.array(out.split(), dtype=np.float64)
                want = np.array(ref_out.split(), dtype=np.float64)
                assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5, name
    c = statistics.median(walls["C baseline (cc -O2, fread + strtod)"])
    return [
        (name, statistics.median(w), statistics.median(w) / c, rss[name])
        for name, w in walls.items()
    ]


def stages(inp: Path, repeat: int) -> list[tuple[str, float, str]]:
    import torch

    from linattn.cli import _solve_parse
    from linattn.cli.solve import _parse_python, format_lines, parse_header, row_sums

    rows: list[tuple[str, float, str]] = []
    t, data = timed(lambda: inp.read_bytes(), repeat)
    rows.append(("read stdin (one read of the file)", t, f"{len(data) / 2**20:.0f} MiB"))
    n, d, pos = parse_header(data)
    count = 3 * n * d

    def ours(fast: bool) -> np.ndarray:
        out = np.empty(count)
        lib = _solve_parse.load() if fast else None
        got, _ = (
            _solve_parse.parse(lib, data, pos, out, 0) if lib else _parse_python(data, pos, out, 0)
        )
        assert got == count
        return out

    t, ref = timed(lambda: ours(True), repeat)
    rows.append(("parse: compiled C parser (chosen)", t, "exact, any spacing"))
    t, _ = timed(lambda: ours(False), 1)
    rows.append(("parse: fallback, chunked bytes.split + float()", t, "exact, any spacing"))

    def fromstring() -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return np.fromstring(data[pos:], sep=" ")  # stops silently at a bad token

    t, arr = timed(fromstring, 1)
    rows.append(("parse: np.fromstring(sep=' ')", t, f"equal: {np.array_equal(arr, ref)}"))
    body = data[pos:].lstrip()
    try:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        def arrow() -> np.ndarray:
            table = pcsv.read_csv(
                pa.py_buffer(body),
                read_options=pcsv.ReadOptions(autogenerate_column_names=True),
                parse_options=pcsv.ParseOptions(delimiter=" "),
                convert_options=pcsv.ConvertOptions(
                    column_types={f"f{i}": pa.float64() for i in range(d)}
                ),
            )
            return np.stack([c.to_numpy() for c in table.columns], axis=1).reshape(-1)

        t, arr = timed(arrow, repeat)
        note = f"regular rows only; equal: {np.array_equal(arr, ref)}"
        rows.append((f"parse: pyarrow {pa.__version__} csv.read_csv", t, note))
    except ImportError:
        rows.append(("parse: pyarrow csv.read_csv", float("nan"), "not installed"))
    try:
        import polars as pl

        def polars() -> np.ndarray:
            schema = {f"c{i}": pl.Float64 for i in range(d)}
            frame = pl.read_csv(body, separator=" ", has_header=False, schema=schema)
            return frame.to_numpy().reshape(-1)

        t, arr = timed(polars, repeat)
        note = f"regular rows only; equal: {np.array_equal(arr, ref)}"
        rows.append((f"parse: polars {pl.__version__} read_csv", t, note))
    except ImportError:
        rows.append(("parse: polars read_csv", float("nan"), "not installed"))

    qkv = ref.reshape(3, n, d)
    t, sums = timed(lambda: row_sums(qkv), repeat)
    rows.append(("compute: linattn.linear_attention, relu, float64, 1 thread (chosen)", t, ""))

    def op_default_threads() -> None:
        from linattn.ops.linear.op import linear_attention

        q, k, v = torch.from_numpy(qkv)
        linear_attention(q, k, v.sum(-1, keepdim=True), feature_map="relu")

    t, _ = timed(op_default_threads, repeat)
    rows.append((f"compute: the same op, {torch.get_num_threads()} threads (torch default)", t, ""))

    def numpy_sums() -> np.ndarray:
        q, k, v = qkv
        fq, fk = np.maximum(q, 0) + 1, np.maximum(k, 0) + 1
        return fq @ (fk.T @ v.sum(1)) / (fq @ fk.sum(0))

    t, alt = timed(numpy_sums, repeat)
    rows.append(
        ("compute: same sums in plain numpy", t, f"max diff {np.abs(alt - sums).max():.1e}")
    )
    t, _ = timed(lambda: format_lines(sums), repeat)
    rows.append(("format N lines of %.6f", t, ""))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--input", type=Path, help="input file to use (generated if missing)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="linattn-bench-solve-") as tmp:
        inp = args.input or Path(tmp) / "input.txt"
        if not inp.exists():  # in a child: the peak memory of this process would be inherited
            # by every process it starts next (Linux keeps ru_maxrss across fork and exec)
            code = f"import sys; sys.path.insert(0, {str(HERE)!r}); from solve import generate; "
            code += f"open({str(inp)!r}, 'wb').write(generate({args.n}, {args.d}))"
            subprocess.run([sys.executable, "-c", code], check=True)
        size = inp.stat().st_size / 1e6
        versions = f"torch {metadata.version('torch')}, numpy {np.__version__}"
        print(
            f"input: N={args.n}, d={args.d}, {size:.0f} MB; {versions}; {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f} at start; median of {args.repeat}\n"
        )
        print("| end to end | wall s | × C | peak RSS MiB |\n| --- | ---: | ---: | ---: |")
        for name, wall, ratio, rss in end_to_end(inp, args.repeat, Path(tmp)):
            print(f"| {name} | {wall:.2f} | {ratio:.2f} | {rss:.0f} |")
        print("\n| in process | s | note |\n| --- | ---: | --- |")
        for name, t, note in stages(inp, args.repeat):
            print(f"| {name} | {t:.3f} | {note} |")
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

r"""``linattn solve``: the judge exercise of linear attention, stdin to stdout.

Input: ``N d``, then N rows of Q, N rows of K, N rows of V, each row d numbers; tokens are
separated by any whitespace (what :meth:`str.split` splits on) and each is any text Python's
:func:`float` takes for a finite value (``1``, ``-2.5``, ``+3.``, ``.5``, ``1e-3``, ``1_000``).
Output: N lines, line i the row sum :math:`\sum_c O_{i,c}` with ``%.6f``, where

.. math:: O_i = \frac{\sum_j w_{ij} v_j}{\sum_j w_{ij}}, \qquad
          w_{ij} = \varphi(q_i)\cdot\varphi(k_j), \qquad \varphi(x) = \max(x, 0) + 1 .

Row sums need only ``V·1``: :math:`\sum_c O_{i,c} = \sum_j w_{ij} (v_j\cdot 1) / \sum_j w_{ij}`,
so the op runs with ``v = V.sum(-1, keepdim=True)`` (N, 1) in float64: O(N·d) time and memory,
never N×N.

Two engines compute it. ``--engine torch`` calls the library's own
:func:`linattn.linear_attention` with the "relu" map. The default ``--engine numpy`` computes
the same factorised sums with NumPy, because importing torch alone takes longer than the
whole exercise in C (measured 1.4–1.6× the C program's run; see docs/bench-ops.md), and the
exercise is judged on wall time. The tests hold the two engines to each other (1e-12
relative) on random and extreme inputs, so they cannot silently disagree.

Parsing is most of the work. The compiled parser (:mod:`linattn.cli._solve_parse`) takes plain
decimals; every token it leaves (and every token when no C compiler exists) is judged here by
``float()`` itself, so both paths accept exactly the same input. Bad input raises
:class:`~linattn.cli.UserError` naming the problem and its line: one line on stderr, exit 2,
nothing on stdout.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import threading

import numpy as np

from linattn.cli import UserError

#: One token: a run of bytes that are not ASCII whitespace as :meth:`str.split` sees it
#: (0x09-0x0d, 0x1c-0x1f, space). Non-ASCII whitespace is split later, on the decoded token.
_TOKEN = re.compile(rb"[^\t-\r\x1c-\x1f ]+")
#: Where a chunk of the fallback parser may end: whitespace that bytes.split() also splits on.
_CUT = re.compile(rb"[\t-\r ]")
_CHUNK = 1 << 22  # bytes per chunk of the fallback parser: bounded temporaries
_BOM = b"\xef\xbb\xbf"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "solve",
        help="read N, d, Q, K, V from stdin; print output row sums",
        description=(
            "Read 'N d' and N rows each of Q, K, V (d numbers a row) from stdin; print the N "
            "row sums of relu-map linear attention, one '%.6f' line each. The numbers are "
            "parsed by a small C parser compiled at first use (cached in ~/.cache/linattn); "
            "LINATTN_SOLVE_PARSER=python selects the pure Python parser."
        ),
    )
    p.add_argument(
        "--engine", choices=("numpy", "torch"), default="numpy",
        help="numpy (default, no torch import) or torch (the library's linear_attention)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # A closed stream (`<&-`, `>&-`) is None in Python: say so instead of an AttributeError.
    if sys.stdin is None:
        raise UserError("standard input is closed; pipe the input in (linattn solve < FILE)")
    if sys.stdout is None or getattr(sys.stdout, "closed", False):  # linattn.cli's stand-in
        raise UserError("standard output is closed; nothing to write the result to")
    importer = _start_import() if args.engine == "torch" else None
    try:
        data = read_input(sys.stdin.buffer)
    except OSError as err:
        raise UserError(f"cannot read standard input ({err.strerror or err})") from None
    text = solve(data, importer=importer, engine=args.engine)
    # `> /dev/full` (one line) and `| head` (quiet): the guarded stdout of linattn.cli.main
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


#: Two tokens and the whitespace after them: all the header there is to check.
_HEADER_READ = re.compile(rb"(?:\xef\xbb\xbf)?[\t-\r\x1c-\x1f ]*[^\t-\r\x1c-\x1f ]+"
                          rb"[\t-\r\x1c-\x1f ]+[^\t-\r\x1c-\x1f ]+[\t-\r\x1c-\x1f ]")
_HEADER_BYTES = 1 << 20  # more than any header of a size that fits in memory


def read_input(stream) -> bytes:
    """All of ``stream``, its header checked (:func:`parse_header`) as soon as it has been read:
    a stream that never ends and has no header (``< /dev/zero``, ``< /dev/urandom``) is an
    error at once, not a read for ever."""
    chunks: list[bytes] = []
    head: bytes | None = b""
    while chunk := stream.read1(1 << 20):
        chunks.append(chunk)
        if head is not None:
            head += chunk
            if _HEADER_READ.match(head) or len(head.lstrip()) > _HEADER_BYTES:
                parse_header(head)
                head = None
    return b"".join(chunks)


def solve(
    data: bytes,
    *,
    parser: str = "auto",
    importer: threading.Thread | None = None,
    engine: str = "numpy",
) -> str:
    """The whole exercise: input bytes -> output text (N lines of ``%.6f``).

    ``parser``: "auto" (compiled if a C compiler works, else Python), "c" or "python".
    ``importer``: a thread importing torch, from :func:`_start_import`, to wait for.
    ``engine``: "numpy" (:func:`row_sums_numpy`) or "torch" (:func:`row_sums`).
    Raises :class:`UserError` on bad input."""
    n, d, pos = parse_header(data)
    values = parse_values(data, pos, n, d, parser=parser)
    qkv = values.reshape(3, n, d)
    sums = row_sums_numpy(qkv) if engine == "numpy" else row_sums(qkv, importer)
    if not np.isfinite(sums).all():
        i = int(np.flatnonzero(~np.isfinite(sums))[0])
        raise UserError(
            f"row {i + 1}: the result is not finite in float64 (values too large to sum)"
        )
    return format_lines(sums)


def _start_import() -> threading.Thread | None:
    """Import torch and the op in a thread while stdin is read and parsed (reads and the C
    parser release the GIL), when nothing imported them yet. ``import torch`` takes about a
    second, as long as the rest of the exercise. ``import linattn`` itself does not import
    torch (its names load on first use), so nothing else has paid for it by then."""
    if "torch" in sys.modules:
        return None

    def work() -> None:
        try:
            import linattn.ops.linear  # noqa: F401
        except Exception:  # the main thread imports again and reports the real error
            pass

    thread = threading.Thread(target=work, name="linattn-import", daemon=True)
    thread.start()
    return thread


def row_sums(qkv: np.ndarray, importer: threading.Thread | None = None) -> np.ndarray:
    """Σ_c O_ic for qkv (3, N, d) float64 -> (N,) float64, through the library's op.

    ``V·1`` (N, 1) stands for V: the row sums of O are linear in V, so this is exact and the
    op's state shrinks from d×d to d×1."""
    if importer is not None:
        importer.join()
    import torch

    from linattn.ops.linear.op import linear_attention

    q, k, v = torch.from_numpy(qkv)  # three (N, d) views, no copy
    # One thread: at N = 10^5 the op takes ~0.06 s on one core, while with two threads on a
    # machine whose cores are busy each of its ~200 chunk steps can stall a scheduler tick
    # waiting for the other thread (measured 3-11 s; see docs/bench-ops.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        o = linear_attention(q, k, v.sum(-1, keepdim=True), feature_map="relu")
    finally:
        torch.set_num_threads(threads)
    return o[:, 0].numpy()


def row_sums_numpy(qkv: np.ndarray) -> np.ndarray:
    """The same sums as :func:`row_sums` with NumPy: qkv (3, N, d) float64 -> (N,).

    φ(K)ᵀ(V·1) (d,) and φ(K)ᵀ1 (d,) first, then one product per query: O(N·d)."""
    q, k, v = qkv
    # Overflow anywhere shows up as inf/nan in the result, which solve() reports in one line;
    # NumPy's own RuntimeWarnings would only add noise before it.
    with np.errstate(all="ignore"):
        fk = np.maximum(k, 0.0) + 1.0
        fq = np.maximum(q, 0.0) + 1.0
        state = np.stack([fk.T @ v.sum(-1), fk.sum(0)], axis=1)  # (d, 2): numerator, normaliser
        num, den = (fq @ state).T
        return num / den


def format_lines(sums: np.ndarray) -> str:
    """(N,) -> N lines of ``%.6f`` (the same correctly rounded digits as C's printf)."""
    return "\n".join(map("{:.6f}".format, sums.tolist())) + "\n"


# ---------------------------------------------------------------------------------------------
# Input


def _show(token: bytes, limit: int = 40) -> str:
    """A token as error messages quote it: the repr of its text (of its bytes if not UTF-8)."""
    token = token[: 4 * limit]
    try:
        shown = repr(token.decode("utf-8"))
    except UnicodeDecodeError:
        shown = repr(token)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _pieces(token: bytes) -> list[str] | None:
    """The number texts in one byte token: its decoded text split at non-ASCII whitespace.
    None if the bytes are not UTF-8."""
    try:
        return token.decode("utf-8").split()
    except UnicodeDecodeError:
        return None


def _values(count: int) -> str:
    """'12 values', or for a header's absurd N·d its size: a 4,000-digit N made a 4 KB line
    (and past 4,300 digits Python refuses to print the number at all)."""
    if count < 10**18:
        return f"{count} values"
    digits = int(count.bit_length() * math.log10(2)) + 1
    return f"3·N·d values (a number of about {digits} digits)"


def parse_header(data: bytes) -> tuple[int, int, int]:
    """``N d`` at the start of ``data`` -> (N, d, offset after the header)."""
    pos = len(_BOM) if data.startswith(_BOM) else 0  # editors on Windows write one
    found: list[tuple[int, str]] = []  # (byte offset, text) of the header's two tokens
    for m in _TOKEN.finditer(data, pos):
        pieces = _pieces(m.group())
        if pieces is None:  # not UTF-8: int() below rejects it by name
            pieces = [m.group().decode("utf-8", "backslashreplace")]
        if len(found) + len(pieces) > 2:
            raise UserError(
                f"line {_line(data, m.start())}: header: expected 'N d' followed by ASCII "
                f"whitespace, got {_show(m.group())}"
            )
        found += [(m.start(), p) for p in pieces]
        pos = m.end()
        if len(found) == 2:
            break
    if not found:
        raise UserError("empty input: expected a header 'N d'")
    if len(found) == 1:
        raise UserError(
            f"line {_line(data, found[0][0])}: incomplete header: expected 'N d', "
            f"got only {_show(found[0][1].encode())}"
        )
    dims = []
    for (offset, text), name in zip(found, "Nd", strict=True):
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise UserError(
                f"line {_line(data, offset)}: {name}: expected a positive integer, "
                f"got {_show(text.encode())}"
            )
        dims.append(value)
    return dims[0], dims[1], pos


class _BadToken(Exception):
    def __init__(self, offset: int, index: int, token: bytes, what: str) -> None:
        self.offset, self.index, self.token, self.what = offset, index, token, what


def _exact(m: re.Match, index: int, room: int) -> tuple[list[float], int]:
    """The values of one byte token by ``float()`` itself: (values of its first ``room`` number
    texts, how many more it holds). _BadToken at the first text that is not a finite number.

    ``index`` is the position of its first value among all values (for the message)."""
    pieces = _pieces(m.group())
    if pieces is None:
        raise _BadToken(m.start(), index, m.group(), "a number")
    values = []
    for piece in pieces[:room]:
        try:
            x = float(piece)
        except ValueError:
            raise _BadToken(m.start(), index + len(values), piece.encode(), "a number") from None
        if not math.isfinite(x):
            raise _BadToken(m.start(), index + len(values), piece.encode(), "a finite number")
        values.append(x)
    return values, max(0, len(pieces) - room)


def _count_tokens(data: bytes, pos: int) -> int:
    """How many number texts ``data[pos:]`` holds (str.split semantics), in bounded chunks."""
    total = 0
    while pos < len(data):
        end = _chunk_end(data, pos)
        total += len(data[pos:end].decode("utf-8", "replace").split())
        pos = end
    return total


def _chunk_end(data: bytes, pos: int) -> int:
    """About _CHUNK bytes on from ``pos``, moved to a whitespace byte so no token is cut."""
    if len(data) - pos <= _CHUNK:
        return len(data)
    m = _CUT.search(data, pos + _CHUNK)
    return len(data) if m is None else m.start()


def _parse_python(data: bytes, pos: int, out: np.ndarray, start: int) -> tuple[int, int]:
    """The fallback for the compiled parser, with its contract (see ``_solve_parse.parse``).

    Chunk by chunk, ``bytes.split()`` and ``float(bytes)`` (ASCII only): a chunk where any
    token fails or is not finite is walked token by token, stopping at that token."""
    n = start
    while pos < len(data):
        end = _chunk_end(data, pos)
        tokens = data[pos:end].split()
        if n + len(tokens) <= out.size:
            try:
                vals = np.fromiter(map(float, tokens), np.float64, count=len(tokens))
            except ValueError:
                vals = None
            if vals is not None and np.isfinite(vals).all():
                out[n : n + len(tokens)] = vals
                n += len(tokens)
                pos = end
                continue
        for m in _TOKEN.finditer(data, pos, end):  # slow walk: find where to stop
            if n == out.size:
                return n - start, pos
            try:
                x = float(m.group())
            except ValueError:
                return n - start, m.start()
            if not math.isfinite(x):
                return n - start, m.start()
            out[n] = x
            n += 1
            pos = m.end()
        pos = max(pos, end)
    return n - start, len(data)


def _place(index: int, n: int, d: int) -> str:
    """Where value ``index`` belongs: ' (K row 2, column 1)'."""
    matrix, rest = divmod(index, n * d)
    row, col = divmod(rest, d)
    return f" ({'QKV'[matrix]} row {row + 1}, column {col + 1})"


def parse_values(data: bytes, pos: int, n: int, d: int, *, parser: str = "auto") -> np.ndarray:
    """Exactly 3·n·d finite numbers from ``data[pos:]`` -> (3·n·d,) float64.

    Raises :class:`UserError` at the first token that is not one (with its line and its place
    in Q, K or V), or when there are fewer or more values."""
    if parser not in ("auto", "c", "python"):
        raise ValueError(f"parser: expected 'auto', 'c' or 'python', got {parser!r}")
    lib = None
    if parser != "python":
        from linattn.cli import _solve_parse

        lib = _solve_parse.load()
        if lib is None and parser == "c":
            raise RuntimeError("the compiled parser is not available (no working C compiler)")

    count = 3 * n * d
    # Every value takes at least one byte and one separator: no more room than that is needed,
    # so a header claiming a huge N·d costs no huge allocation.
    out = np.empty(min(count, (len(data) - pos + 1) // 2), dtype=np.float64)
    got = 0
    try:
        while True:
            if lib is not None:
                k, pos = _solve_parse.parse(lib, data, pos, out, got)
            else:
                k, pos = _parse_python(data, pos, out, got)
            got += k
            if got == out.size or pos >= len(data):
                break
            # The fast parser stopped at a token it does not take: float() judges it.
            m = _TOKEN.match(data, pos)
            assert m is not None, "a parser stopped on whitespace"
            vals, extra = _exact(m, got, out.size - got)
            out[got : got + len(vals)] = vals
            got += len(vals)
            pos = m.end()
            if extra:
                got += extra + _count_tokens(data, pos)
                raise UserError(f"expected {_values(count)} after the header, got {got}")
    except _BadToken as bad:
        raise UserError(
            f"line {_line(data, bad.offset)}: expected {bad.what}, got {_show(bad.token)}"
            + _place(bad.index, n, d)
        ) from None
    total = got + (_count_tokens(data, pos) if got == out.size else 0)
    if total != count:
        raise UserError(f"expected {_values(count)} after the header, got {total}")
    return out

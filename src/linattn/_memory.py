"""Absurd sizes, refused before anything is allocated: the bytes a configuration needs,
estimated, against the memory this process can have (torch-free, so the commands check before
torch is imported).

A configuration that cannot fit (``--d-model 65536``, ``--train-mix 1000000000:2:1``,
``ConvAttentionClassifier(features=10**12)``) used to allocate until the kernel's OOM killer
ended the process (exit 137), or failed deep in torch with an allocation traceback.
:func:`check_fits` raises one ValueError instead, naming the option to change: the one whose
default shrinks the estimate most. Each caller's estimate is a *lower* bound of what it will
allocate (the largest tensors it cannot do without), so a configuration that fits is never
refused; what is left, an allocation that still fails, the commands report in one line
(:func:`is_out_of_memory`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

try:
    import resource
except ImportError:  # Windows: no address-space limit to read
    resource = None  # type: ignore[assignment]

__all__ = ["available_bytes", "check_fits", "format_bytes", "is_out_of_memory",
           "transformer_parameters", "lm_parameters", "num_features",
           "TRAINING_BYTES_PER_PARAMETER"]


def _meminfo_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo, in bytes (Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """What the memory cgroup of this process still allows (v2, then v1), in bytes: a
    container's limit, which /proc/meminfo does not show."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f:
                text = f.read().strip()
            if text == "max":
                return None
            with open(usage) as f:
                return max(0, int(text) - int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return None


def _address_space_available() -> int | None:
    """What ``RLIMIT_AS`` (``ulimit -v``) leaves this process, in bytes: the limit less its
    present virtual size."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("VmSize:"))
    except (OSError, ValueError, StopIteration):
        size = 0
    return max(0, soft - size)


def _sysconf_available() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_bytes() -> int | None:
    """The memory this process can still have, in bytes: the least of the system's available
    memory (MemAvailable, else the free pages), its cgroup's limit and its address-space
    limit; None where nothing is known."""
    system = _meminfo_available()
    if system is None:
        system = _sysconf_available()
    known = [b for b in (system, _cgroup_available(), _address_space_available())
             if b is not None]
    return min(known) if known else None


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, 3 significant figures: '17.2 GiB', '3.06 TiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def check_fits(estimate: Callable[[Mapping[str, Any]], float], values: Mapping[str, Any],
               defaults: Mapping[str, Any], what: str, available: int | None = None) -> None:
    """ValueError ``"{option}: {what} needs about N of memory, M available"`` when
    ``estimate(values)`` (bytes) exceeds the memory available (``available``, default
    :func:`available_bytes`). ``option`` is the key of ``defaults`` whose default value
    shrinks the estimate most (the one the user made too large); where every option is at its
    default, the first of ``defaults``."""
    need = estimate(values)
    have = available_bytes() if available is None else available
    if have is None or need <= have:
        return
    changed = [name for name in defaults if values.get(name) != defaults[name]]
    option = min(changed, key=lambda name: estimate({**values, name: defaults[name]}),
                 default=next(iter(defaults)))
    raise ValueError(f"{option}: {what} needs about {format_bytes(need)} of memory, more than "
                     f"the {format_bytes(have)} available")


def transformer_parameters(width: int, layers: int, mlp: int, vocab: int = 0,
                           heads_width: int | None = None) -> int:
    """A lower bound of a pre-norm transformer's parameters: ``vocab × width`` embeddings, and
    per layer the q, k, v and output projections (``4 × width × heads_width``, heads_width
    ``width`` unless the heads are narrower or wider) and the MLP's two matrices."""
    inner = width if heads_width is None else heads_width
    return vocab * width + layers * (4 * width * inner + 2 * width * mlp)


def lm_parameters(values: Mapping[str, Any]) -> int:
    """A lower bound of a language model's parameters (linattn.nn.LinearTransformerLM's sizes:
    ``vocab_size``, ``d_model``, ``num_layers``, ``mlp_dim`` (None: 4·d_model), ``short_conv``):
    the transformer's and the token shift's ``short_conv × d_model``."""
    E = values["d_model"]
    mlp = 4 * E if values.get("mlp_dim") is None else values["mlp_dim"]
    k = values.get("short_conv") or 0
    return transformer_parameters(E, values["num_layers"], mlp, values["vocab_size"]) + k * E


#: Bytes a float32 parameter costs in training with Adam: itself, its gradient, two moments.
TRAINING_BYTES_PER_PARAMETER = 16


def num_features(feature_map: str, d: int) -> int:
    """ℓ of a named feature map for heads of dimension d (torch-free; the maps' own
    ``num_features`` are the truth, this is for estimates): d for elu and relu,
    1 + d + d(d+1)/2 for taylor, C(d + 2, 2) for polynomial (its default degree 2)."""
    if feature_map == "taylor":
        return 1 + d + d * (d + 1) // 2
    if feature_map == "polynomial":
        return math.comb(d + 2, 2)
    return d


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed: a MemoryError, or torch's RuntimeError
    of its CPU allocator ("can't allocate memory") or of a device ("out of memory")."""
    if isinstance(err, MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text
                                              or "out of memory" in text.lower()
                                              or "not enough memory" in text)

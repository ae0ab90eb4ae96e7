"""``linattn.onnx.export``: a linattn model to an ONNX file through PyTorch's exporter.

``torch.onnx.export(..., dynamo=True)`` traces the model with ``torch.export`` and translates
every op; the ``linattn::onnx_*`` ops become the standard opset-27 ``LinearAttention`` and
``CausalConvWithState`` nodes (:mod:`linattn.onnx.translate`). PyTorch's own translations
write an older default opset (20 with torch 2.13) and its version converter cannot lift every
op to 27, so the model's default-domain import is raised to 27 here, after checking that each
op the graph holds means the same at 27 (:data:`SAME_SINCE`); ``onnx.checker`` then checks the
whole model.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from linattn.nn.lm import LinearTransformerLM
from linattn.nn.mixers import MIXERS
from linattn.onnx.dft import exact_rfft
from linattn.onnx.lm import POSITIONAL, LMGraph, pack_state, state_parts

__all__ = ["export", "input_names", "output_names", "MAX_LENGTH", "SAME_SINCE"]

#: the longest sequence one LM export is declared for (its dynamic T's upper bound)
MAX_LENGTH = 4096
#: ops whose versions after opset 18 up to 27 only add types (bfloat16, float8, int4 ...) or
#: attributes with defaults that keep the old meaning (Pad's new modes, Cast's saturate for
#: float8): a graph the exporter wrote for opset 18 means the same at 27. DFT is not here:
#: its axis moved from an attribute to an input at 20 (checked per node).
SAME_SINCE = frozenset({
    "Cast", "CastLike", "Constant", "ConstantOfShape", "Conv", "Cos", "Elu", "Equal",
    "Flatten", "HardSigmoid", "HardSwish", "Identity", "Mish", "Pad", "ReduceMax",
    "ReduceMin", "Reshape", "Round", "Selu", "Shape", "Sin", "Size", "Softplus", "Squeeze",
    "Transpose", "Unsqueeze",
    # Range-27 adds float16/bfloat16 and stash_type, the precision those accumulate in
    "Range",
})


def input_names(model: LinearTransformerLM) -> list[str]:
    """The exported LM's inputs: ``ids``, ``past_state.{i}`` per layer, ``past_conv`` (with a
    token shift), ``position`` (cosFormer: the tokens before ``ids``, an int64 scalar)."""
    names = ["ids"] + [f"past_{p}.{i}" for i in range(len(model.blocks))
                       for p in state_parts(model)]
    names += ["past_conv"] if model.shift is not None else []
    return names + (["position"] if model.config.attention in POSITIONAL else [])


def output_names(model: LinearTransformerLM) -> list[str]:
    """``logits``, ``present_state.{i}`` per layer, ``present_conv``."""
    names = ["logits"] + [f"present_{p}.{i}" for i in range(len(model.blocks))
                          for p in state_parts(model)]
    return names + (["present_conv"] if model.shift is not None else [])


def _dft_axis_as_input(proto, node) -> None:
    """DFT-17's ``axis`` attribute (default 1) as DFT-20's third input, the same transform."""
    from onnx import helper, numpy_helper

    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    keep = [a for a in node.attribute if a.name != "axis"]
    del node.attribute[:]
    node.attribute.extend(keep)
    name = f"{node.name or node.output[0]}_axis"
    proto.graph.initializer.append(numpy_helper.from_array(np.array(axis, np.int64), name))
    inputs = list(node.input) + [""] * (2 - len(node.input))
    del node.input[:]
    node.input.extend([*inputs[:2], name])


def _raise_opset(proto, opset: int) -> None:
    """The default-domain import of ``proto`` set to ``opset``, after checking every op."""
    import onnx

    old = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    nodes = list(proto.graph.node)
    for fn in proto.functions:
        nodes += list(fn.node)
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        new = onnx.defs.get_schema(node.op_type, opset).since_version
        try:
            was = onnx.defs.get_schema(node.op_type, old).since_version
        except onnx.defs.SchemaError:
            was = None
        if node.op_type == "DFT":  # DFT-17 kept its axis as an attribute, DFT-20 an input
            if old < 20 and node in proto.graph.node:
                _dft_axis_as_input(proto, node)
            ok = not any(a.name == "axis" for a in node.attribute)
        else:  # an op new since `old` was written at its first version (Gelu-20, ...)
            ok = was is None or new == was or node.op_type in SAME_SINCE
        if not ok:
            raise NotImplementedError(
                f"the exported graph holds {node.op_type}, whose opset {new} differs from "
                f"opset {old}'s: not raised to opset {opset}")
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = opset


def _lm_inputs(model: LinearTransformerLM, example: Tensor) -> tuple[Tensor, ...]:
    if not isinstance(example, Tensor) or example.dim() != 2 or example.is_floating_point():
        got = (f"{example.dtype} {tuple(example.shape)}" if isinstance(example, Tensor)
               else type(example).__name__)
        raise ValueError(f"example: expected integer ids of shape (B, T), got {got}")
    if example.shape[1] < 2:  # T = 1 would be specialised by the trace: a longer example
        example = example.repeat(1, 2)
    extra = (torch.tensor(0),) if model.config.attention in POSITIONAL else ()
    return (example.long(), *pack_state(model, None, example.shape[0]), *extra)


def export(model: nn.Module, example: Tensor | tuple, path: str | os.PathLike, *,
           dynamic: bool = True, max_length: int = MAX_LENGTH, dynamic_shapes=None,
           check: bool = True) -> Path:
    """Write ``model`` as an ONNX file at ``path`` (opset 27) and return the path.

    ``model``: a :class:`~linattn.nn.LinearTransformerLM` of a kind whose mixers are
    ``LinearAttention`` nodes (``linear``, ``gated_delta``, ``deltanet``, ``gla``; its token
    shift a ``CausalConvWithState`` node), exported with its states as inputs and outputs
    (:func:`input_names`, :func:`output_names`; layouts in :mod:`linattn.onnx.lm`), or any
    other module torch exports (the FordA classifier, the encoders), exported as it is with
    linattn's torch forms. ``example``: the LM's ids (B, T), or the module's positional
    inputs (a tensor or a tuple). ``dynamic``: the batch dimension (and the LM's T, 1 to
    ``max_length``) left free; else every shape is the example's. ``dynamic_shapes``: for
    another module, ``torch.export``'s specification instead (e.g. a free T as well).
    ``check``: run ``onnx.checker`` on the result.

    ValueError/TypeError naming the argument for a model, example or size it cannot take."""
    import onnx

    from linattn.onnx.translate import OPSET, TRANSLATIONS
    from linattn.ops import dispatch

    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic: expected a bool, got {type(dynamic).__name__}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length: expected an integer >= 2, got {max_length!r}")
    path = Path(path)
    B = torch.export.Dim("B", min=1, max=1 << 20)
    if isinstance(model, LinearTransformerLM):
        graph: nn.Module = LMGraph(model)
        args = _lm_inputs(model, example)
        names, outs = input_names(model), output_names(model)
        most = MIXERS[model.config.attention].max_positions  # cosFormer's horizon
        T = torch.export.Dim("T", min=1, max=max_length if most is None else
                             min(max_length, most))
        # forward(ids, *past): the states (and a position) are one var-positional argument
        shapes = ({0: B, 1: T}, tuple({0: B} if a.dim() else None for a in args[1:])) \
            if dynamic else None
    else:
        graph = model
        args = example if isinstance(example, tuple) else (example,)
        if not all(isinstance(a, Tensor) for a in args):
            raise TypeError("example: expected a tensor or a tuple of tensors")
        names, outs = [f"input.{i}" for i in range(len(args))] if len(args) > 1 else \
            ["input"], None
        shapes = dynamic_shapes if dynamic_shapes is not None else \
            tuple({0: B} for _ in args) if dynamic else None
    was, quiet = graph.training, logging.root.manager.disable
    graph.eval()
    # the exporter's own attempt at opset 27 fails on ops it wrote at 18 and logs a traceback
    # for it (harmless: _raise_opset does the job); its other messages are progress notes
    logging.disable(logging.ERROR)
    try:
        with dispatch.use(impl="torch"), exact_rfft(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's progress and deprecation notes
            program = torch.onnx.export(
                graph, args, dynamo=True, custom_translation_table=TRANSLATIONS,
                dynamic_shapes=shapes, input_names=names, output_names=outs, verbose=False,
                opset_version=OPSET,
                optimize=True)
    finally:
        logging.disable(quiet)
        graph.train(was)
    proto = program.model_proto
    _raise_opset(proto, OPSET)
    if check:
        onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))
    return path

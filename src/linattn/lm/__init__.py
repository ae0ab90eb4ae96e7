"""The byte-level language model: data, training, generation (the library behind
``linattn lm``).

* :mod:`linattn.lm.data`: the standard-library corpus, byte ids, training and validation
  windows;
* :mod:`linattn.lm.training`: :class:`TrainConfig`, :class:`Trainer` / :func:`train` (on
  :class:`~linattn.train_loop.TrainLoop`: checkpoints, resume, Ctrl-C), :func:`evaluate`;
* :mod:`linattn.lm.generation`: :func:`load_model` from a run folder, :func:`generate_text`.

The model itself is :class:`linattn.nn.LinearTransformerLM`, configured by
:class:`linattn.nn.LMConfig` (re-exported here)::

    from linattn.lm import LMConfig, TrainConfig, generate_text, load_model, train

    train(LMConfig(256, 128, 4, 4, attention="gated_delta"), TrainConfig(steps=300),
          out="runs/lm")
    model, _ = load_model("runs/lm")
    print("def " + "".join(generate_text(model, "def ", 100)))
"""

from __future__ import annotations

from linattn._lazy import lazy_exports

#: public name -> its module, imported on first use: :mod:`linattn.lm.options` (what
#: ``linattn lm`` checks its flags against) imports without torch.
_EXPORTS = {
    "LMConfig": "linattn.nn.lm",
    "TrainConfig": "linattn.lm.training",
    "Trainer": "linattn.lm.training",
    "LMTraining": "linattn.lm.training",
    "train": "linattn.lm.training",
    "evaluate": "linattn.lm.training",
    "load_model": "linattn.lm.generation",
    "generate_text": "linattn.lm.generation",
    "stdlib_corpus": "linattn.lm.data",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)

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

#: module -> the public names it defines, imported on first use: :mod:`linattn.lm.options` (what
#: ``linattn lm`` checks its flags against) imports without torch.
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "linattn.nn.lm": ("LMConfig",),
    "linattn.lm.training": ("TrainConfig", "Trainer", "LMTraining", "train", "evaluate"),
    "linattn.lm.generation": ("load_model", "generate_text"),
    "linattn.lm.data": ("stdlib_corpus",),
})

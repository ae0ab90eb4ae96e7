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

from linattn.lm.data import stdlib_corpus
from linattn.lm.generation import generate_text, load_model
from linattn.lm.training import LMTraining, TrainConfig, Trainer, evaluate, train
from linattn.nn.lm import LMConfig

__all__ = ["LMConfig", "TrainConfig", "Trainer", "LMTraining", "train", "evaluate",
           "load_model", "generate_text", "stdlib_corpus"]

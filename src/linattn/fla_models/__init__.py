"""flash-linear-attention's checkpoints on CPU: fla's model classes on linattn's kernels.

fla publishes its models in the transformers format (``model_type`` "gla", "gated_deltanet",
...), but its kernels are Triton: on a CPU its models do not run, and without ``import fla``
transformers does not know their ``model_type``. One import registers linattn's versions::

    import linattn.fla_models                      # registers the model types below
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)   # an fla checkpoint (hub or folder)
    model.generate(ids, max_new_tokens=32)

The classes have fla's names (``GLAForCausalLM``, ...), config fields, defaults and parameter
names, so an fla checkpoint loads with no conversion and no missing or unexpected keys; they
compute with linattn's kernels (:mod:`linattn.fla`). Families (``model_type``): gla,
gated_deltanet, delta_net, kda, retnet, linear_attn, hgrn2, each also as fla's hybrid (softmax
attention at the layers of the config's ``attn``). Not covered: mamba2 and fla's other
families (see docs/fla_models.md).

Registration rule: a ``model_type`` already known to transformers (fla's own classes,
registered by ``import fla`` or ``import fla.models``) is left alone, and fla, imported after
linattn, takes its model types over (fla registers with ``exist_ok=True``): where fla is in use
(GPU machines) its classes stay in charge. ``register(override=True)`` puts linattn's in charge
even then (a CPU machine with fla installed and imported). ``registered()`` says which model
types are linattn's now.

transformers (the optional extra ``hf``) is imported by this module only: ``import linattn``
stays free of it.
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("linattn.fla_models needs transformers (pip install 'linattn[hf]' or "
                      "'transformers>=5.23')") from e

from linattn.fla_models._kernels import reference_ops
from linattn.fla_models.cache import FLACache
from linattn.fla_models.configs import CONFIGS
from linattn.fla_models.modeling import MODELS, FLAForCausalLM, FLAModel

__all__ = ["MODELS", "CONFIGS", "FLACache", "FLAModel", "FLAForCausalLM", "register",
           "registered", "reference_ops"]


def registered() -> list[str]:
    """The model types whose transformers Auto classes are linattn's now."""
    from transformers import AutoConfig

    mine = []
    for model_type, (config_cls, _, _) in MODELS.items():
        try:
            if type(AutoConfig.for_model(model_type)) is config_cls:
                mine.append(model_type)
        except ValueError:
            continue
    return mine


def register(override: bool = False) -> list[str]:
    """Register linattn's fla classes with transformers' ``AutoConfig``, ``AutoModel`` and
    ``AutoModelForCausalLM``. A model type transformers already knows (fla's) is skipped unless
    ``override``. Returns the model types registered by this call. Importing the module calls
    it once."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(override, bool):
        raise TypeError(f"override: expected a bool, got {override!r}")
    done = []
    for model_type, (config_cls, model_cls, causal_cls) in MODELS.items():
        if model_type in CONFIG_MAPPING and not override:
            continue
        AutoConfig.register(model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, model_cls, exist_ok=True)
        AutoModelForCausalLM.register(config_cls, causal_cls, exist_ok=True)
        done.append(model_type)
    return done


register()

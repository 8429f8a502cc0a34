"""The T²MLR model, in dependency order: the fusion Φ and cache norm (`fusion`), the recurrent cache
(`cache`), the token layout and masks (`layout`), the input checks (`checks`), the config and the
forward-path decision (`configuration`), generation plumbing (`generation`), what every model over a
Hugging Face decoder's parts shares (`wrapping`; the looped and pause-token baselines use it too), the
names of saved tensors across versions (`checkpoint_keys`) and the model itself (`modeling`). `shapes`
names the published base-model shapes the paper uses.

The names below load on first use, so importing the config alone stays light. Importing the model
(`t2mlr.model.modeling`, or any model class from here) registers the `t2mlr` model type with
`AutoConfig`, `AutoModel` and `AutoModelForCausalLM`; a bare `import t2mlr` arranges the same as soon as
transformers loads its Auto classes (`t2mlr.auto_registration`)."""

from __future__ import annotations

from t2mlr.utils import lazy_names

_HOMES = {
    "CacheNorm": "fusion",
    "GatedFusion": "fusion",
    "T2MLRCache": "cache",
    "T2MLRStaticCache": "cache",
    "ForwardPath": "configuration",
    "T2MLRConfig": "configuration",
    "T2MLRCausalLMOutput": "modeling",
    "T2MLRForCausalLM": "modeling",
    "T2MLRModel": "modeling",
    "T2MLRModelOutput": "modeling",
    "T2MLRPreTrainedModel": "modeling",
    "is_t2mlr": "modeling",
}

__all__ = sorted(_HOMES)


__getattr__ = lazy_names(__name__, _HOMES)

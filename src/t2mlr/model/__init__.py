"""The T²MLR model, in dependency order: the fusion Φ and cache norm (`fusion`), the recurrent cache
(`cache`), the token layout and masks (`layout`), the input checks (`checks`), the config and the
forward-path decision (`configuration`; its settings are pure data in `t2mlr.settings`), generation plumbing
(`generation`), what every model over a Hugging Face decoder's parts shares (`wrapping`; the looped and
pause-token baselines use it too), the names of saved tensors across versions (`checkpoint_keys`) and the model
itself (`modeling`). `shapes` names the published base-model shapes the paper uses.

Importing this package (or any module in it) registers the `t2mlr` model type with `AutoConfig`, `AutoModel` and
`AutoModelForCausalLM`, as importing any transformers model's package does."""

from __future__ import annotations

from t2mlr.model.cache import T2MLRCache, T2MLRStaticCache
from t2mlr.model.configuration import ForwardPath, T2MLRConfig
from t2mlr.model.fusion import CacheNorm, GatedFusion
from t2mlr.model.modeling import (
    T2MLRCausalLMOutput,
    T2MLRForCausalLM,
    T2MLRModel,
    T2MLRModelOutput,
    T2MLRPreTrainedModel,
    is_t2mlr,
)

__all__ = [
    "CacheNorm", "ForwardPath", "GatedFusion", "T2MLRCache", "T2MLRCausalLMOutput", "T2MLRConfig", "T2MLRForCausalLM",
    "T2MLRModel", "T2MLRModelOutput", "T2MLRPreTrainedModel", "T2MLRStaticCache", "is_t2mlr",
]

"""t2mlr: Transformer with Temporal Middle-Layer Recurrence on Hugging Face decoders.

`import t2mlr` is light: the classes load on first use (`from t2mlr import T2MLRForCausalLM`), so the `t2mlr`
command's help and light commands do not pay for importing torch and transformers. Loading the model package
(any class from here, or `import t2mlr.model`) registers the `t2mlr` model type with transformers' `AutoConfig`,
`AutoModel` and `AutoModelForCausalLM`. A saved directory also loads with no import at all
(`trust_remote_code=True`, see `t2mlr.model.remote_code`).
"""

from __future__ import annotations

from t2mlr.utils import lazy_names

__version__ = "0.1.0"
__all__ = [
    "T2MLRCache", "T2MLRCausalLMOutput", "T2MLRConfig", "T2MLRForCausalLM", "T2MLRModel", "T2MLRStaticCache", "__version__",
]


__getattr__ = lazy_names(__name__, {name: "model" for name in __all__ if name != "__version__"})

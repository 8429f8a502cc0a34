"""t2mlr: Transformer with Temporal Middle-Layer Recurrence on Hugging Face decoders.

The classes load on first use (`from t2mlr import T2MLRForCausalLM`), so `import t2mlr` and the `t2mlr`
command's help and light commands do not pay for importing torch and transformers. Still, after a bare
`import t2mlr`, `AutoConfig` and `AutoModelForCausalLM.from_pretrained(saved_dir)` know the `t2mlr` model
type: the registration waits for transformers to load its Auto classes (`t2mlr.auto_registration`).
Saved directories also load without the import (`trust_remote_code=True`, see `t2mlr.model.remote_code`).
"""

from __future__ import annotations

from t2mlr import auto_registration
from t2mlr.utils import lazy_names

auto_registration.install()

__version__ = "0.1.0"
__all__ = [
    "T2MLRCache", "T2MLRCausalLMOutput", "T2MLRConfig", "T2MLRForCausalLM", "T2MLRModel", "T2MLRStaticCache", "__version__",
]


__getattr__ = lazy_names(__name__, {name: "model" for name in __all__ if name != "__version__"})

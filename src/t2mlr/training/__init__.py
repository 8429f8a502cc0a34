"""Training: typed YAML configs, packed data, the loop (one process or torchrun DDP/FSDP2), checkpoints, plots.

Quick start::

    t2mlr train debug --out runs/debug            # tiny CPU preset
    t2mlr train configs/smollm2_135m_13_18.yaml --out runs/x optim.lr=3e-4
    torchrun --nproc_per_node 8 -m t2mlr train configs/smollm2_135m_13_18.yaml --out runs/x --parallel fsdp
    t2mlr plot runs/x
"""

from t2mlr.utils import lazy_names

# Public name -> the submodule that defines it. Loaded on first access (PEP 562), so a command that
# only needs the argument parser (`t2mlr train --help`) does not pay for torch and transformers.
_HOMES = {
    "ConfigError": "config", "TrainConfig": "config", "load_config": "config",
    "Collator": "data", "PackedTokenDataset": "data", "ResumableBatchSampler": "data",
    "SyntheticChainDataset": "synthetic", "build_dataset": "data", "pack_documents": "data",
    "shift_aligned_labels": "data",
    "NonFiniteLossError": "trainer", "Trainer": "trainer", "TrainResult": "trainer", "train": "trainer",
}

__all__ = sorted(_HOMES)


__getattr__ = lazy_names(__name__, _HOMES)

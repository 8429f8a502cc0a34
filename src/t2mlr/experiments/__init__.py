"""The paper's experiments end to end (`t2mlr experiment …`), each one module read top-down as "these
configs, this data, this score": `s5` (S5-Retrieval) and its evidence study `s5_evidence`, `finetune` (the
reasoning finetunes), `retrofit`, `pretrain`; `parameter_counts` is `t2mlr params`. Their configs are
configs/experiments/*.yaml; every arm trains through `t2mlr.training.arms`. Importing this package loads
nothing heavy (torch and the trainer load when an experiment runs)."""

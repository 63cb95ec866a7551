"""Experiment plans: knob experiments with priorities, decision gates and noise-aware verdicts."""

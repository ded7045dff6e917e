"""Analyses of a trained posterior: calibration metrics, pruning, noise robustness, training cost.

They read a model and guide (or their predictions) and never change how inference runs.
"""

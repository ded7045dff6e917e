"""Inference loops: the ELBO, the step engine and its executors (``compile``), SVI (``fit``, ``svi_step``),
optimisers and schedules, prediction, NUTS, and data-parallel SVI."""

from pyrobnn.infer.elbo import ELBOTerms, MeanFieldELBO
from pyrobnn.infer.mcmc import MCMCResult, sample_posterior
from pyrobnn.infer.optim import OPTIMIZERS, FlatThenLinear, Optim, StepDecay, TwoGroupSGD
from pyrobnn.infer.predict import predict, predict_moments, predictive_outputs
from pyrobnn.infer.recording import COMPILE_MODES
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.schedules import SCHEDULES, Constant, Geometric, LinearWarmup
from pyrobnn.infer.step import Step
from pyrobnn.infer.svi import Checkpoint, History, TrainingDiverged, fit, svi_step

__all__ = [
    "COMPILE_MODES", "OPTIMIZERS", "SCHEDULES", "Checkpoint", "Constant", "ELBOTerms", "FlatThenLinear",
    "Geometric", "History", "LinearWarmup", "MCMCResult", "MeanFieldELBO", "Optim", "Step", "StepDecay",
    "TrainingDiverged", "TwoGroupSGD", "fit", "fit_replicas", "predict", "predict_moments", "predictive_outputs",
    "sample_posterior", "svi_step",
]

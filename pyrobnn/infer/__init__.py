"""Inference loops: the ELBO, SVI (``fit``, ``svi_step``), optimisers and schedules, prediction, NUTS, and
data-parallel SVI."""

from pyrobnn.infer.elbo import ELBOTerms, MeanFieldELBO
from pyrobnn.infer.mcmc import MCMCResult, sample_posterior
from pyrobnn.infer.optim import OPTIMIZERS, FlatThenLinear, Optim, StepDecay, TwoGroupSGD
from pyrobnn.infer.predict import predict, predict_moments, predictive_outputs
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.schedules import SCHEDULES, Constant, Geometric, LinearWarmup
from pyrobnn.infer.svi import History, TrainingDiverged, fit, svi_step

__all__ = [
    "OPTIMIZERS", "SCHEDULES", "Constant", "ELBOTerms", "FlatThenLinear", "Geometric", "History", "LinearWarmup",
    "MCMCResult", "MeanFieldELBO", "Optim", "StepDecay", "TrainingDiverged", "TwoGroupSGD", "fit", "fit_replicas",
    "predict", "predict_moments", "predictive_outputs", "sample_posterior", "svi_step",
]

"""NUTS as a method: the exact posterior of a small network on full-batch data (Hoffman & Gelman 2014), sampled by
:func:`~pyrobnn.infer.mcmc.sample_posterior` (all chains in one batched pass where the network batches)."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from pyrobnn.checks import choice, in_range, nonnegative, nonnegative_int, positive_int
from pyrobnn.infer.mcmc import MAX_FULL_BATCH, SAMPLERS, check_prior, sample_posterior
from pyrobnn.methods.base import Method
from pyrobnn.methods.posterior import EmpiricalPosterior, Posterior
from pyrobnn.model.priors import NodePrior

__all__ = ["NUTS", "MAX_WEIGHTS"]

MAX_WEIGHTS = 5_000
"""The most Bayesian weights NUTS samples: the dimension of the space it explores."""


def _sampler(name: str):
    """The sampler's own setting ``name``, as :func:`~pyrobnn.infer.mcmc.sample_posterior` states it (once)."""
    return inspect.signature(sample_posterior).parameters[name].default


@dataclass(frozen=True)
class NUTS(Method):
    """The No-U-Turn sampler on the model's log joint: ``num_chains`` chains of ``warmup`` adaptation steps (step
    size and a diagonal mass matrix) and ``num_samples`` draws each, from the seeded initial weights plus
    ``init_jitter`` noise (after ``map_steps`` full-batch Adam steps towards the MAP). Full batch: no guide, estimator,
    optimiser or β; ``epochs`` is unused."""

    num_samples: int = 500
    warmup: int = 500
    num_chains: int = 2
    target_accept: float = _sampler("target_accept")
    max_tree_depth: int = _sampler("max_tree_depth")
    init_jitter: float = _sampler("init_jitter")
    map_steps: int = _sampler("map_steps")
    sampler: str = _sampler("sampler")

    command: ClassVar[str] = "mcmc"

    def settings_rules(self) -> None:
        """The sampler's counts and rates, and a prior with a proper density on every weight that is not a node
        prior (the implicit BNN keeps its weights as point estimates to be trained)."""
        super().settings_rules()
        for name in ("num_chains", "max_tree_depth"):
            positive_int(f"{{{name}}}", getattr(self, name))
        nonnegative_int("{warmup}", self.warmup)
        nonnegative_int("{map_steps}", self.map_steps)
        in_range("{target_accept}", self.target_accept, 0, 1, "()")
        nonnegative("{init_jitter}", self.init_jitter)
        choice("{sampler}", self.sampler, SAMPLERS)
        if isinstance(self.prior, NodePrior):
            raise ValueError("{prior} node does not apply to NUTS: the implicit BNN keeps its weights as point "
                             "estimates to be trained, so NUTS would sample the node latents of an untrained network; "
                             "use a Gaussian or scale-mixture prior (or train the implicit BNN by SVI)")
        reference = torch.full((2,), 0.5)
        try:
            check_prior(self.prior(reference), reference, "its distribution")
        except ValueError as error:
            raise ValueError(f"{{prior}} has no proper density for NUTS: {error}") from None

    def run_rules(self, model, epochs, rows, run) -> None:
        """Full batch (at most :data:`~pyrobnn.infer.mcmc.MAX_FULL_BATCH` rows), at most :data:`MAX_WEIGHTS`
        Bayesian weights and at least one, a network without dropout (the potential must be a deterministic
        function of the weights) and a likelihood held fixed."""
        super().run_rules(model, epochs, rows, run)
        if rows is not None and rows > MAX_FULL_BATCH:
            raise ValueError(f"{{rows}} {rows}: NUTS runs full batch and takes at most {MAX_FULL_BATCH} training "
                             "points")
        if model is None:
            return
        if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
            raise ValueError("{network.dropout} does not apply to NUTS: it needs a potential energy that is a "
                             "deterministic function of the weights")
        sizes = [math.prod(site.shape) for site in model.sites()] if hasattr(model, "sites") else [1]
        if not sizes:
            raise ValueError("{sites}: the model has no Bayesian weights for NUTS to sample")
        if sum(sizes) > MAX_WEIGHTS:
            raise ValueError(f"{{network}}: the network has {sum(sizes)} Bayesian weights; NUTS samples at most "
                             f"{MAX_WEIGHTS} (it explores one dimension per weight): use a narrower network, fewer "
                             "Bayesian {sites} (the last layer), or SVI")
        if isinstance(getattr(getattr(model, "likelihood", None), "log_scale", None), nn.Parameter):
            raise ValueError("{likelihood.learn_scale} does not apply to NUTS: it samples the weights and holds the "
                             "likelihood fixed")

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None, compile="auto",
              progress=False, **run) -> Posterior:
        self.check(model, epochs=max(epochs, 1), rows=x.shape[0])
        if run:
            raise ValueError(f"{', '.join(sorted(run))} do(es) not apply to NUTS: it samples on the full batch, "
                             "without minibatches, callbacks or checkpoints")
        result = sample_posterior(model, x, y, num_samples=self.num_samples, warmup=self.warmup,
                                  num_chains=self.num_chains, seed=seed, init_jitter=self.init_jitter,
                                  target_accept=self.target_accept, max_tree_depth=self.max_tree_depth,
                                  sampler=self.sampler, compile=compile, progress=progress, map_steps=self.map_steps)
        return EmpiricalPosterior(result)

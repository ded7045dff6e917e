"""NUTS as a method: the exact posterior of a small network on full-batch data (Hoffman & Gelman 2014), sampled by
:func:`~pyrobnn.infer.mcmc.sample_posterior` (all chains in one batched pass where the network batches)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyrobnn.infer.mcmc import sample_posterior
from pyrobnn.methods.base import Method
from pyrobnn.methods.posterior import EmpiricalPosterior, Posterior

__all__ = ["NUTS"]


@dataclass(frozen=True)
class NUTS(Method):
    """The No-U-Turn sampler on the model's log joint: ``num_chains`` chains of ``warmup`` adaptation steps (step
    size and a diagonal mass matrix) and ``num_samples`` draws each, from the seeded initial weights plus
    ``init_jitter`` noise (after ``map_steps`` full-batch Adam steps towards the MAP). Full batch: no guide, estimator,
    optimiser or β; ``epochs`` is unused."""

    num_samples: int = 500
    warmup: int = 500
    num_chains: int = 2
    target_accept: float = 0.8
    max_tree_depth: int = 10
    init_jitter: float = 0.01
    map_steps: int = 0
    sampler: str = "auto"

    command: ClassVar[str] = "mcmc"

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None, compile="auto",
              progress=False, **run) -> Posterior:
        if run:
            raise ValueError(f"{', '.join(sorted(run))} do(es) not apply to NUTS: it samples on the full batch, "
                             "without minibatches, callbacks or checkpoints")
        result = sample_posterior(model, x, y, num_samples=self.num_samples, warmup=self.warmup,
                                  num_chains=self.num_chains, seed=seed, init_jitter=self.init_jitter,
                                  target_accept=self.target_accept, max_tree_depth=self.max_tree_depth,
                                  sampler=self.sampler, compile=compile, progress=progress, map_steps=self.map_steps)
        return EmpiricalPosterior(result)

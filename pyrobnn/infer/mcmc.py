r"""NUTS on a :class:`~pyrobnn.BayesianNetwork`: the exact posterior of the same model, as draws.

The model SVI trains is a Pyro model, so Hamiltonian Monte Carlo can sample its
posterior :math:`p(w \mid x, y) \propto p(w) \prod_n p(y_n \mid x_n, w)` directly
(full batch; Neal 2011, Hoffman & Gelman 2014). Stock ``NUTS(model)`` re-traces
the model through Pyro's effect stack at every leapfrog step; here the
potential :math:`U(\theta) = -\log p(w(\theta)) - \sum_n \log p(y_n \mid x_n, w(\theta))`
is a function of one flat vector :math:`\theta` of all Bayesian weights
(:class:`FlatPotential`), given to ``pyro.infer.NUTS(potential_fn=...)``.

:func:`sample_posterior` runs the chains and returns the draws with Pyro's
diagnostics (split R-hat, bulk ESS, divergences, step size, leapfrog steps,
wall time); :class:`PosteriorDraws` is an empirical guide that replays draw i on
call i, so :func:`~pyrobnn.infer.predict.predict`, :func:`~pyrobnn.infer.predict.evaluate`
and the metrics take NUTS exactly as they take a variational guide.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import pyro
import torch
from pyro.distributions import constraints
from pyro.infer import MCMC, NUTS
from pyro.ops.stats import effective_sample_size, split_gelman_rubin

from pyrobnn._compat import pyro_context
from pyrobnn.checks import in_range, nonnegative, positive_int
from pyrobnn.distributions import IsotropicNormal, LogUniform
from pyrobnn.guides.empirical import PosteriorDraws

__all__ = ["FlatPotential", "check_prior", "MCMCResult", "sample_posterior", "run_chain", "summarise",
           "chain_diagnostics", "MAX_FULL_BATCH"]

MAX_FULL_BATCH = 10_000
"""The largest training set :func:`sample_posterior` accepts: NUTS evaluates the full-batch
likelihood hundreds of times per draw, so beyond this use SVI (``pyrobnn.infer.svi.fit``)."""


def check_prior(prior, value: torch.Tensor, where: str) -> None:
    """Raise a ``ValueError`` (its message opens with ``where``) unless ``prior`` is a proper density on every
    real number, one log density per parameter, finite at ``value``: what NUTS needs of :math:`p(w)`."""
    if isinstance(prior, LogUniform):
        raise ValueError(f"{where} is the improper log-uniform prior p(w) ~ 1/|w|, whose posterior is improper too "
                         "(infinite mass at w = 0): NUTS needs a proper prior; use a Gaussian or scale-mixture prior")
    support = prior.support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if support is not constraints.real:
        raise ValueError(f"{where} ({type(prior).__name__}) has support {prior.support}, not every real number: NUTS "
                         "moves the weights freely over the reals; use a prior on all reals (a Gaussian or "
                         "scale-mixture prior)")
    try:
        density = prior.log_prob(value)
    except NotImplementedError:
        raise ValueError(f"{where} ({type(prior).__name__}) has no density: NUTS needs log p(w); use a Gaussian or "
                         "scale-mixture prior") from None
    if density.shape != ():
        raise ValueError(f"{where} ({type(prior).__name__}) gives log densities of shape {tuple(density.shape)}, not "
                         f"one number: its event shape must be the parameter's shape {tuple(value.shape)} "
                         f"(e.g. .to_event({value.dim()}))")
    if not torch.isfinite(density):
        raise ValueError(f"{where} ({type(prior).__name__}) has log density {density} at the network's weights: "
                         "NUTS needs a proper prior with a finite density")


class FlatPotential:
    r"""The potential energy :math:`U(\theta)` of a network's posterior on full-batch data ``(x, y)``.

    :math:`\theta` is the concatenation of every Bayesian weight (in :meth:`BayesianNetwork.sites` order);
    the network runs with those weights through the PyroModule cache, without sample statements, and the
    likelihood is the model's own (:meth:`Likelihood.distribution`), unscaled (the batch is the data set).
    Called with ``{"weights": theta}`` as ``NUTS(potential_fn=...)`` does. Deterministic parameters of the
    model (e.g. a learned noise scale) are held at their current values.
    """

    def __init__(self, model, x: torch.Tensor, y: torch.Tensor):
        self.model, self.x, self.y = model, x, y
        sites = model.sites()
        if not sites:
            raise ValueError("the model has no Bayesian parameters to sample (was it built with deterministic=True?)")
        self.names = [site.name for site in sites]
        self.shapes = [site.shape for site in sites]
        self.priors = [site.prior_distribution() for site in sites]
        self.evaluations = 0
        self._traced = None
        shared = {(p.loc, p.scale) for p in self.priors if isinstance(p, IsotropicNormal)}
        self._shared_gaussian = next(iter(shared)) if len(shared) == 1 and all(
            isinstance(p, IsotropicNormal) for p in self.priors) else None
        theta = self.initial()
        for name, prior, value in zip(self.names, self.priors, self.unflatten(theta).values()):
            check_prior(prior, value, f"the prior of site {name!r}")

    @property
    def size(self) -> int:
        """The number of sampled weights, the dimension of :math:`\\theta`."""
        return sum(math.prod(shape) for shape in self.shapes)

    def initial(self) -> torch.Tensor:
        """The network's current weights as one flat vector."""
        return torch.cat([site.init.reshape(-1) for site in self.model.sites()]).detach()

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{site name: weight}`` from a flat vector (or ``(..., D)`` batch: the last dimension is split)."""
        parts = theta.split([math.prod(shape) for shape in self.shapes], dim=-1)
        return {name: part.reshape(theta.shape[:-1] + shape)
                for name, part, shape in zip(self.names, parts, self.shapes)}

    def network(self, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The network's output with these weights (no Pyro sample statements are run)."""
        context = pyro_context(self.model)
        with context:
            for name, value in weights.items():
                context.set(name, value)
            return self.model.net(x)

    def log_prior(self, theta: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        r""":math:`\log p(w)`: one Gaussian term over the flat vector when every site has the same isotropic
        Gaussian prior (the common case, one kernel instead of one per site), else the sum over sites."""
        if self._shared_gaussian is not None:
            loc, scale = self._shared_gaussian
            z = (theta - loc) / scale
            return -0.5 * z.square().sum() - theta.shape[-1] * (math.log(scale) + 0.5 * math.log(2 * math.pi))
        return sum(prior.log_prob(value) for prior, value in zip(self.priors, weights.values()))

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(w(\theta)) + \sum_n \log p(y_n \mid x_n, w(\theta))`."""
        weights = self.unflatten(theta)
        output = self.network(weights, self.x)
        return self.log_prior(theta, weights) + self.model.likelihood.distribution(output).log_prob(self.y).sum()

    def compile(self) -> "FlatPotential":
        """Trace :meth:`log_joint` once with ``torch.jit.trace`` (the network, prior and likelihood become one
        graph without Python in the loop); later calls run the traced graph."""
        theta = self.initial().requires_grad_()
        with torch.no_grad():
            expected = self.log_joint(theta)
        with warnings.catch_warnings():  # torch.jit.trace is deprecated in favour of torch.compile, which
            warnings.simplefilter("ignore", FutureWarning)  # compiles for tens of seconds on a small CPU
            self._traced = torch.jit.trace(self.log_joint, (theta,), check_trace=False)
        with torch.no_grad():
            got = self._traced(theta)
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"jit: the traced potential gives {got.item()} instead of {expected.item()}; "
                               "the network has data-dependent control flow: run with jit=False")
        return self

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        self.evaluations += 1
        log_joint = self._traced if self._traced is not None else self.log_joint
        return -log_joint(params["weights"])


def chain_diagnostics(draws: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Split R-hat (Gelman et al. 2013) and bulk effective sample size per site, from draws shaped
    ``(chains, samples, ...)``: the worst element of each site (largest R-hat, smallest ESS). R-hat and ESS
    need at least 4 draws per chain; with fewer they read ``inf`` and ``0`` (not checkable)."""
    out = {}
    for name, value in draws.items():
        if value.dim() < 2:
            raise ValueError(f"draws of site {name!r} must be shaped (chains, samples, ...), got {tuple(value.shape)}")
        flat = value.reshape(value.shape[:2] + (-1,)).double()
        r_hat = split_gelman_rubin(flat, chain_dim=0, sample_dim=1) if flat.shape[1] >= 4 else torch.full(
            flat.shape[2:], math.nan)
        ess = effective_sample_size(flat, chain_dim=0, sample_dim=1) if flat.shape[1] >= 4 else torch.full(
            flat.shape[2:], math.nan)
        total = flat.shape[0] * flat.shape[1]  # anti-correlated draws make the estimate negative (ESS > draws):
        ess = torch.where(ess < 0, total * math.log10(max(total, 2)), ess)  # ArviZ's cap S log10 S
        out[name] = {"r_hat_max": float(torch.nan_to_num(r_hat, nan=math.inf).max()),
                     "ess_min": float(torch.nan_to_num(ess, nan=0.0).min())}
    return out


@dataclass
class MCMCResult:
    """Draws ``{site: (chains, samples, ...)}`` and their diagnostics."""

    draws: dict[str, torch.Tensor]
    diagnostics: dict = field(default_factory=dict)

    @property
    def num_draws(self) -> int:
        first = next(iter(self.draws.values()))
        return first.shape[0] * first.shape[1]

    def posterior(self) -> PosteriorDraws:
        """The empirical guide of all chains' draws (chain-major)."""
        return PosteriorDraws({name: value.flatten(0, 1) for name, value in self.draws.items()})


def sample_posterior(model, x: torch.Tensor, y: torch.Tensor, *, num_samples: int = 500, warmup: int = 500,
                     num_chains: int = 2, seed: int = 0, init_jitter: float = 0.01, target_accept: float = 0.8,
                     max_tree_depth: int = 10, jit: bool = False, progress: bool = False,
                     max_data: int = MAX_FULL_BATCH, initial: torch.Tensor | None = None) -> MCMCResult:
    """Sample the posterior of ``model``'s Bayesian weights on full-batch ``(x, y)`` with NUTS.

    Chains run one after the other, each from the network's current weights (or its row of ``initial``) plus
    :math:`\\mathcal N(0, \\text{init\\_jitter}^2)` noise (chains started at unrelated random weights land in
    modes that differ by a permutation of hidden units, which R-hat on weights reports as non-mixing).
    Step size and a diagonal mass matrix are adapted during ``warmup``.

    :param jit: trace the potential once with ``torch.jit.trace`` (:meth:`FlatPotential.compile`) instead of
        running the network from Python at every leapfrog step.
    :param max_data: the largest training set accepted (default :data:`MAX_FULL_BATCH`): NUTS is full batch.
    :param initial: optional starting weights, flat as :class:`FlatPotential` lays them out: ``(D,)`` for every
        chain, or ``(num_chains, D)``, one row per chain.

    :returns: :class:`MCMCResult` with ``draws`` ``{site: (chains, samples, ...)}`` and ``diagnostics``:
        ``r_hat_max`` and ``ess_min`` over all sites (and per site), ``divergences`` (count), ``divergence_rate``,
        ``step_size`` and ``accept_prob`` per chain, ``leapfrog_steps`` (mean per draw), ``seconds``,
        ``converged`` (R-hat <= 1.05 everywhere) and ``warnings`` (plain sentences).
    """
    num_samples = positive_int("num_samples", num_samples)
    num_chains = positive_int("num_chains", num_chains)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    init_jitter = nonnegative("init_jitter (std of the noise added to the initial weights)", init_jitter)
    target_accept = in_range("target_accept (NUTS target acceptance probability)", target_accept, 0, 1, "()")
    max_tree_depth = positive_int("max_tree_depth", max_tree_depth)
    max_data = positive_int("max_data (the largest full-batch training set)", max_data)
    if not torch.is_tensor(x) or not torch.is_tensor(y):
        raise TypeError(f"x and y must be tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    if x.shape[0] > max_data:
        raise ValueError(f"NUTS runs full batch: {x.shape[0]} training examples exceed max_data={max_data}; use SVI "
                         "(pyrobnn.infer.svi.fit) or a subset (--train-size)")
    model.check_input(x[:1])
    potential = FlatPotential(model, x, y)
    if jit:
        potential.compile()
    start = potential.initial()
    if initial is None:
        starts = start.expand(num_chains, -1)
    else:
        if not torch.is_tensor(initial) or initial.shape not in ((potential.size,), (num_chains, potential.size)):
            raise ValueError(f"initial must be a tensor of shape ({potential.size},) or ({num_chains}, "
                             f"{potential.size}) (num_chains x the number of weights), got "
                             f"{tuple(initial.shape) if torch.is_tensor(initial) else type(initial).__name__}")
        if not torch.isfinite(initial).all():
            raise ValueError("initial weights must be finite")
        starts = initial.detach().to(start).expand(num_chains, -1)
    generator = torch.Generator().manual_seed(seed)
    chains, per_chain, tick = [], [], time.perf_counter()
    for chain in range(num_chains):
        pyro.set_rng_seed(seed * 1009 + chain)
        noise = torch.randn(start.shape, generator=generator, dtype=start.dtype).to(start.device)
        draws, stats = run_chain(potential, starts[chain] + init_jitter * noise, num_samples=num_samples,
                                 warmup=warmup, target_accept=target_accept, max_tree_depth=max_tree_depth,
                                 progress=progress)
        chains.append(draws)
        per_chain.append(stats)
    draws = potential.unflatten(torch.stack(chains))  # (chains, samples, ...)
    diagnostics = summarise(draws, per_chain, seconds=time.perf_counter() - tick)
    diagnostics.update(num_weights=potential.size, target_accept=target_accept)
    return MCMCResult(draws, diagnostics)


def run_chain(potential: FlatPotential, init: torch.Tensor, *, num_samples: int, warmup: int, target_accept: float,
              max_tree_depth: int, progress: bool = False) -> tuple[torch.Tensor, dict]:
    """One NUTS chain (Pyro's kernel on ``potential``) from the flat weights ``init``: its draws ``(samples, D)``
    and its statistics ``divergences``, ``mean_accept_prob`` (the mean acceptance statistic of the sampling
    phase, the quantity ``target_accept`` aims for, Pyro's "acc. prob"), ``accept_rate`` (the fraction of
    draws that moved), ``step_size`` and ``leapfrog_steps`` (mean per draw)."""
    kernel = NUTS(potential_fn=potential, target_accept_prob=target_accept, max_tree_depth=max_tree_depth)
    counts, stats = [], {}

    def hook(kernel, params, stage, i):
        counts.append((stage, potential.evaluations))
        if stage == "Sample":  # the kernel's own statistics, read before MCMC resets it
            stats.update(kernel.diagnostics(), mean_accept_prob=float(kernel.logging()["acc. prob"]))

    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, initial_params={"weights": init},
                disable_progbar=not progress, hook_fn=hook)
    mcmc.run()
    sampling = [n for stage, n in counts if stage == "Sample"]
    return mcmc.get_samples()["weights"].detach(), {
        "divergences": len(stats["divergences"]),
        "mean_accept_prob": stats["mean_accept_prob"],
        "accept_rate": float(stats["acceptance rate"]),
        "step_size": float(kernel.step_size),
        "leapfrog_steps": ((sampling[-1] - sampling[0]) / (len(sampling) - 1) if len(sampling) > 1 else math.nan),
    }


def summarise(draws: dict[str, torch.Tensor], per_chain: list[dict], seconds: float) -> dict:
    """The diagnostics of chains' ``draws`` ``{site: (chains, samples, ...)}`` and their ``per_chain``
    statistics (:func:`run_chain`): worst split R-hat and bulk ESS over all sites and per site, divergences,
    mean leapfrog steps, ``converged`` (R-hat <= 1.05 everywhere, 2 or more chains) and ``warnings``."""
    num_chains, num_samples = next(iter(draws.values())).shape[:2]
    per_site = chain_diagnostics(draws)
    divergences = sum(c["divergences"] for c in per_chain)
    diagnostics = {
        "r_hat_max": max(d["r_hat_max"] for d in per_site.values()),
        "ess_min": min(d["ess_min"] for d in per_site.values()),
        "sites": per_site,
        "divergences": divergences,
        "divergence_rate": divergences / (num_chains * num_samples),
        "chains": per_chain,
        "leapfrog_steps": sum(c["leapfrog_steps"] for c in per_chain) / num_chains,
        "seconds": seconds,
    }
    notes = []
    if num_samples < 4:
        notes.append(f"{num_samples} draws per chain are too few for split R-hat (it needs 4): convergence "
                     "cannot be checked, draw more samples")
    elif num_chains > 1 and not diagnostics["r_hat_max"] <= 1.05:
        worst = max(per_site, key=lambda n: per_site[n]["r_hat_max"])
        notes.append(f"chains disagree: split R-hat {diagnostics['r_hat_max']:.3f} > 1.05 (worst site {worst!r}); "
                     "the draws are not from one posterior mode, run longer or check the chains")
    if diagnostics["divergence_rate"] > 0.01:
        notes.append(f"{divergences} divergent transitions ({100 * diagnostics['divergence_rate']:.1f} %): raise "
                     "target_accept or reparameterize the prior")
    diagnostics["converged"] = num_chains > 1 and diagnostics["r_hat_max"] <= 1.05
    diagnostics["warnings"] = notes
    return diagnostics

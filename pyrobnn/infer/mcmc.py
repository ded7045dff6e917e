r"""NUTS on a :class:`~pyrobnn.BayesianNetwork`: the exact posterior of the same model, as draws.

The model SVI trains is a Pyro model, so Hamiltonian Monte Carlo can sample its
posterior :math:`p(w \mid x, y) \propto p(w) \prod_n p(y_n \mid x_n, w)` directly
(full batch; Neal 2011, Hoffman & Gelman 2014). The potential
:math:`U(\theta) = -\log p(w(\theta)) - \sum_n \log p(y_n \mid x_n, w(\theta))` is a function of one flat
vector :math:`\theta` of all Bayesian weights (:mod:`pyrobnn.infer.potential`). :func:`sample_posterior` runs
the chains with one of two samplers:

- ``"batched"``: :mod:`pyrobnn.infer.batched_nuts`, all C chains in lockstep, each leapfrog step one batched
  pass of the network for every chain (:class:`~pyrobnn.infer.potential.BatchedPotential`);
- ``"pyro"``: Pyro's ``NUTS(potential_fn=FlatPotential)``, chains one after another: the reference, and the
  sampler of networks that cannot run several weight vectors in one pass.

``"auto"`` (the default) takes the batched sampler when the network batches. Both return the same
:class:`MCMCResult`: the draws, split R-hat and bulk ESS per weight and on the predictions at a set of inputs
(function space, where the symmetries of a network do not inflate R-hat; Sommer et al. 2024), divergences,
step sizes, tree depths, leapfrog steps and wall time, exportable to ArviZ
(:meth:`MCMCResult.to_inference_data`). :class:`~pyrobnn.guides.PosteriorDraws`
(:meth:`~pyrobnn.infer.draws.Draws.guide`) is an empirical guide that replays draw i on call i, so
:func:`~pyrobnn.infer.predict.predict`, :func:`~pyrobnn.analysis.evaluate.evaluate` and the metrics take NUTS exactly as
they take a variational guide.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

import pyro
import torch
from pyro.infer import MCMC, NUTS
from pyro.ops.stats import effective_sample_size, split_gelman_rubin

from pyrobnn.checks import choice, deprecated, in_range, nonnegative, nonnegative_int, positive_int, renamed_keywords
from pyrobnn.guides.empirical import PosteriorDraws
from pyrobnn.infer.batched_nuts import sample_chains
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.potential import BatchedPotential, CannotBatch, FlatPotential, check_prior
from pyrobnn.infer.recording import build, check_mode, fall_back
from pyrobnn.model.protocol import network_model

__all__ = ["FlatPotential", "check_prior", "MCMCResult", "sample_posterior", "run_chain", "summarise",
           "chain_diagnostics", "chain_starts", "MAX_FULL_BATCH", "SAMPLERS", "PREDICTION_POINTS"]

MAX_FULL_BATCH = 10_000
"""The largest training set :func:`sample_posterior` accepts: NUTS evaluates the full-batch
likelihood hundreds of times per draw, so beyond this use SVI (``pyrobnn.infer.svi.fit``)."""

SAMPLERS = ("auto", "batched", "pyro")
"""``sample_posterior(sampler=...)``: ``"batched"`` (all chains in one pass, :mod:`pyrobnn.infer.batched_nuts`),
``"pyro"`` (Pyro's NUTS, one chain after another), ``"auto"`` (batched when the network can run it)."""

PREDICTION_POINTS = 256
"""By default the function-space diagnostics are computed at this many training inputs (evenly spaced)."""


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
class MCMCResult(Draws):
    """Draws ``{site: (chains, samples, ...)}`` (a :class:`~pyrobnn.infer.draws.Draws`, replayed in ``model``), their
    diagnostics (plain numbers, as JSON takes them), and per draw the sampler's statistics ``stats``
    ``{name: (chains, samples)}`` and the ``predictions`` ``(chains, samples, points, outputs)`` at the inputs
    ``prediction_x`` (class probabilities or means)."""

    diagnostics: dict = field(default_factory=dict)
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    predictions: torch.Tensor | None = None
    prediction_x: torch.Tensor | None = None

    kind: ClassVar[str] = "mcmc"
    description: ClassVar[str] = "NUTS draws written by `pyrobnn mcmc`"

    def summary(self) -> str:
        return f"{len(self)} draws ({self.runs} chain(s) x {len(self) // self.runs})"

    def posterior(self) -> PosteriorDraws:
        """Deprecated (removed in 0.2): :meth:`~pyrobnn.infer.draws.Draws.guide`, the empirical guide of every
        chain's draws."""
        deprecated("MCMCResult.posterior()", "MCMCResult.guide()")
        return self.guide()

    @property
    def num_draws(self) -> int:
        """Deprecated (removed in 0.2): ``len(result)``, the draws of all chains."""
        deprecated("MCMCResult.num_draws", "len(result)")
        return len(self)

    def to_inference_data(self):
        """The draws as an ArviZ ``InferenceData`` (``pip install arviz``): group ``posterior`` (one variable per
        site), ``sample_stats`` (``diverging``, ``tree_depth``, ``n_steps``, ``acceptance_rate``, ``energy``,
        ``step_size``, as far as the sampler recorded them) and, when computed, ``predictions`` with the inputs
        in ``predictions_constant_data``."""
        try:
            import arviz
        except ImportError:
            raise ImportError("MCMCResult.to_inference_data needs ArviZ: pip install arviz") from None
        names = {"diverging": "diverging", "tree_depth": "tree_depth", "num_steps": "n_steps",
                 "accept_prob": "acceptance_rate", "energy": "energy", "step_size": "step_size"}
        stats = {names[k]: v.detach().cpu().numpy() for k, v in self.stats.items() if k in names}
        extra = {}
        if self.predictions is not None:
            extra = {"predictions": {"predictions": self.predictions.detach().cpu().numpy()},
                     "predictions_constant_data": {"x": self.prediction_x.detach().cpu().numpy()}}
        return arviz.from_dict(posterior={name: value.detach().cpu().numpy() for name, value in self.draws.items()},
                               sample_stats=stats or None, **extra)


def sample_posterior(model, x: torch.Tensor, y: torch.Tensor, *, num_samples: int, warmup: int, num_chains: int,
                     seed: int = 0, init_jitter: float = 0.01, target_accept: float = 0.8, max_tree_depth: int = 10,
                     sampler: str = "auto", compile: str = "auto", progress: bool = False,
                     max_data: int = MAX_FULL_BATCH, initial: torch.Tensor | None = None, map_steps: int = 0,
                     prediction_x: torch.Tensor | None = None, **renamed) -> MCMCResult:
    """Sample the posterior of ``model``'s Bayesian weights on full-batch ``(x, y)`` with NUTS. The run's size has no
    default here (:class:`pyrobnn.methods.NUTS` holds pyrobnn's draws, warm-up and chains, ``METHODS["nuts"]``); the
    sampler's own settings do (Hoffman & Gelman's target acceptance and tree depth, as Pyro's and Stan's NUTS), and
    the method reads them from here.

    Every chain starts from the network's current weights (or its row of ``initial``), moved towards the MAP
    estimate by ``map_steps`` Adam steps, plus :math:`\\mathcal N(0, \\text{init\\_jitter}^2)` noise (chains
    started at unrelated random weights land in modes that differ by a permutation of hidden units, which R-hat on
    weights reports as non-mixing).
    Step size and a diagonal mass matrix are adapted during ``warmup``, per chain (NUTS: Hoffman & Gelman 2014).

    :param model: a model of a network (:class:`~pyrobnn.BayesianNetwork`) whose Bayesian weights are sampled.
    :param x, y: the whole training set (NUTS is full batch: at most ``max_data`` rows).
    :param num_samples: draws kept per chain, after the warm-up.
    :param warmup: adaptation steps per chain, discarded.
    :param num_chains: independent chains (R-hat and ESS compare them).
    :param seed: seeds the initial noise and the sampler (the same seed gives the same draws).
    :param init_jitter: the standard deviation of the noise added to each chain's initial weights.
    :param target_accept: the acceptance probability the step-size adaptation aims at, in (0, 1).
    :param max_tree_depth: the most doublings of a NUTS trajectory (at most :math:`2^{d}` leapfrog steps a draw).
    :param sampler: ``"batched"``: all chains in lockstep, one batched pass of the network per leapfrog step
        (:mod:`pyrobnn.infer.batched_nuts`); ``"pyro"``: Pyro's NUTS, one chain after the other; ``"auto"``:
        batched when the network can run several weight vectors in one pass, else Pyro's.
    :param compile: how a leapfrog step runs (:data:`~pyrobnn.infer.recording.COMPILE_MODES`). The batched
        sampler runs each (the network's forward and backward pass and the sampler's bookkeeping) as one graph
        (:func:`~pyrobnn.infer.batched_nuts.compiled`): ``"trace"`` (recorded and replayed, built in milliseconds),
        ``"inductor"`` (fused kernels: seconds to build, then several times faster), ``"auto"`` (``"trace"``,
        switching to inductor once the run is projected to be long enough to repay its compilation; the same seed
        still gives the same draws) or ``"none"`` (no graph: for networks that branch on tensor values). Pyro's
        sampler records its potential under ``"trace"`` (:meth:`FlatPotential.compile`; it cannot run ``"inductor"``:
        :class:`~pyrobnn.infer.recording.ExecutorFailed`) and runs it from Python under ``"auto"`` and ``"none"``.
        An explicit mode that cannot run raises :class:`~pyrobnn.infer.recording.ExecutorFailed`; ``"auto"`` falls
        back with one warning (:func:`~pyrobnn.infer.recording.build`).
    :param max_data: the largest training set accepted (default :data:`MAX_FULL_BATCH`): NUTS is full batch.
    :param initial: optional starting weights, flat as :class:`FlatPotential` lays them out: ``(D,)`` for every
        chain, or ``(num_chains, D)``, one row per chain.
    :param map_steps: full-batch Adam steps on the potential before sampling (:meth:`FlatPotential.mode`): the
        chains start from the MAP estimate, inside one basin, where a short warm-up suffices; their R-hat then
        measures mixing within that basin (the posterior's other modes, hidden-unit permutations at least, stay
        unvisited either way). 0 starts from the weights themselves.
    :param prediction_x: inputs at which the function-space diagnostics are computed (default: up to
        :data:`PREDICTION_POINTS` training inputs, evenly spaced).
    :param progress: show a progress bar over the draws.
    :param renamed: the keywords of the last release, each with a ``DeprecationWarning`` (removed in 0.2):
        ``jit=True`` (now ``compile="trace"``) and ``compiler`` (now ``compile``: ``"script"`` is ``"trace"``,
        ``"eager"`` is ``"none"``).

    :returns: :class:`MCMCResult` with ``draws`` ``{site: (chains, samples, ...)}`` and ``diagnostics``:
        ``sampler``, ``r_hat_max`` and ``ess_min`` over all sites (and per site), ``prediction_r_hat_max`` and
        ``prediction_ess_min`` over the predictions at ``prediction_x``, ``divergences`` (count, after warm-up),
        ``divergence_rate``, per chain (``chains``) ``step_size``, ``mean_accept_prob``, ``leapfrog_steps`` and
        tree depths, ``leapfrog_steps`` (mean per draw), ``seconds``, ``converged`` (R-hat <= 1.05 on every
        weight) and ``warnings`` (plain sentences).

    Example: a linear regression :math:`y = x_1 + x_2 + x_3 + x_4` whose weights the draws find near 1.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, Gaussian, sample_posterior
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> x = torch.randn(32, 4)
    >>> y = x.sum(-1, keepdim=True)
    >>> model = BayesianNetwork(nn.Linear(4, 1), Gaussian(scale=0.5), num_data=32)
    >>> result = sample_posterior(model, x, y, num_samples=20, warmup=20, num_chains=2, compile="none")
    >>> {site: tuple(draws.shape) for site, draws in result.draws.items()}  # (chains, draws, ...)
    {'net.weight': (2, 20, 1, 4), 'net.bias': (2, 20, 1)}
    >>> torch.allclose(result.draws["net.weight"].mean((0, 1)), torch.ones(1, 4), atol=0.25)
    True
    >>> result.diagnostics["sampler"]  # both chains in lockstep, one batched pass a leapfrog step
    'batched'
    """
    num_samples = positive_int("num_samples", num_samples)
    num_chains = positive_int("num_chains", num_chains)
    warmup = nonnegative_int("warmup", warmup)
    map_steps = nonnegative_int("map_steps", map_steps)
    init_jitter = nonnegative("init_jitter (std of the noise added to the initial weights)", init_jitter)
    target_accept = in_range("target_accept (NUTS target acceptance probability)", target_accept, 0, 1, "()")
    max_tree_depth = positive_int("max_tree_depth", max_tree_depth)
    max_data = positive_int("max_data (the largest full-batch training set)", max_data)
    sampler = choice("sampler", sampler, SAMPLERS)
    compile = check_mode(_renamed_compile(compile, renamed))
    if not torch.is_tensor(x) or not torch.is_tensor(y):
        raise TypeError(f"x and y must be tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    if x.shape[0] > max_data:
        raise ValueError(f"NUTS runs full batch: {x.shape[0]} training examples exceed max_data={max_data}; use SVI "
                         "(pyrobnn.infer.svi.fit) or a subset (--train-size)")
    model = network_model(model, x, y)
    model.check_input(x[:1])
    if prediction_x is None:
        prediction_x = x[torch.linspace(0, len(x) - 1, min(len(x), PREDICTION_POINTS)).round().long()]
    elif not torch.is_tensor(prediction_x) or prediction_x.shape[1:] != x.shape[1:] or len(prediction_x) == 0:
        raise ValueError(f"prediction_x must be a non-empty tensor of inputs shaped like x, (points, "
                         f"{', '.join(map(str, x.shape[1:]))}), got {_described(prediction_x)}")
    potential = FlatPotential(model, x, y)
    batched = None
    if sampler != "pyro":
        try:
            batched = BatchedPotential(potential)
        except CannotBatch as error:
            if sampler == "batched":
                raise ValueError(f"sampler='batched': {error}; use sampler='pyro' (Pyro's NUTS, one pass per "
                                 "chain)") from None
    if compile == "inductor" and batched is None:  # Pyro's sampler replays a recorded potential, never a compiled one
        fall_back("inductor", compile, "Pyro's NUTS (sampler='pyro')", NotImplementedError(
            "it replays a recorded potential (compile='trace'), never a compiled one"))
    if compile == "trace" and batched is None:
        build(lambda mode: potential.compile() if mode == "trace" else potential, "trace", compile,
              "Pyro's NUTS potential")
    tick = time.perf_counter()
    if map_steps:  # one search per distinct start
        starts = chain_starts(potential, initial, num_chains, 0.0, seed)
        shared = initial is None or initial.dim() == 1
        modes = torch.stack([potential.mode(row, map_steps) for row in starts[:1 if shared else num_chains]])
        initial = modes[0] if shared else modes
    starts = chain_starts(potential, initial, num_chains, init_jitter, seed)
    if batched is not None:
        generator = torch.Generator(device=starts.device).manual_seed(seed * 1009 + 1)
        with pyro.validation_enabled(False):
            flat_draws, stats = sample_chains(batched, starts, num_samples=num_samples, warmup=warmup,
                                              target_accept=target_accept, max_tree_depth=max_tree_depth,
                                              generator=generator, progress=progress, compile=compile)
        per_chain = _batched_chain_stats(flat_draws, stats, max_tree_depth)
        engine = {"compile": stats["compile"], "leaves": stats["leaves"]}
        stats = {k: v.detach().cpu() for k, v in stats.items() if k in ("accept_prob", "num_steps", "tree_depth",
                                                                         "diverging", "energy")}
        stats["step_size"] = torch.tensor([c["step_size"] for c in per_chain])[:, None].expand(-1, num_samples)
    else:
        chains, per_chain = [], []
        for chain in range(num_chains):
            pyro.set_rng_seed(seed * 1009 + chain)
            draws, chain_stats = run_chain(potential, starts[chain], num_samples=num_samples, warmup=warmup,
                                           target_accept=target_accept, max_tree_depth=max_tree_depth,
                                           progress=progress)
            chains.append(draws)
            per_chain.append(chain_stats)
        flat_draws = torch.stack(chains)
        stats = {"diverging": torch.stack([c.pop("diverging") for c in per_chain])}
        engine = {"compile": "trace" if compile == "trace" else "none"}
    seconds = time.perf_counter() - tick
    draws = potential.unflatten(flat_draws)  # (chains, samples, ...)
    predictions = _predictions(batched, potential, flat_draws, prediction_x)
    diagnostics = summarise(draws, per_chain, seconds=seconds, predictions=predictions)
    diagnostics.update(sampler="batched" if batched is not None else "pyro", **engine, num_weights=potential.size,
                       target_accept=target_accept, max_tree_depth=max_tree_depth, prediction_points=len(prediction_x))
    return MCMCResult(model, draws, diagnostics=diagnostics, stats=stats, predictions=predictions,
                      prediction_x=prediction_x)


RENAMED_SAMPLER_KEYWORDS = {"jit": 'compile="trace"', "compiler": "compile"}
""":func:`sample_posterior`'s keywords of the last release -> what replaced them."""


def _renamed_compile(compile: str, renamed: dict) -> str:
    """``compile`` from :func:`sample_posterior`'s keywords of the last release (:data:`RENAMED_SAMPLER_KEYWORDS`),
    each with a ``DeprecationWarning``: ``compiler`` by its new name (``"script"``: ``"trace"``, ``"eager"``:
    ``"none"``), else ``jit=True`` as ``"trace"``."""
    renamed_keywords("sample_posterior", renamed, RENAMED_SAMPLER_KEYWORDS)
    old = ({"script": "trace", "eager": "none"}.get(renamed["compiler"], renamed["compiler"]) if "compiler" in renamed
           else "trace" if renamed.get("jit") else None)
    if old is None:
        return compile
    if compile != "auto" and compile != old:
        raise ValueError(f"sample_posterior: compile={compile!r} and the deprecated {', '.join(sorted(renamed))} "
                         "disagree; pass compile alone")
    return old


def chain_starts(potential: FlatPotential, initial, num_chains: int, init_jitter: float, seed: int) -> torch.Tensor:
    """The chains' initial weights ``(C, D)``: the network's weights (or ``initial``) plus jitter, drawn chain
    after chain from ``torch.Generator().manual_seed(seed)``, the same for both samplers."""
    start = potential.initial()
    if initial is None:
        starts = start.expand(num_chains, -1)
    else:
        if not torch.is_tensor(initial) or initial.shape not in ((potential.size,), (num_chains, potential.size)):
            raise ValueError(f"initial must be a tensor of shape ({potential.size},) or ({num_chains}, "
                             f"{potential.size}) (num_chains x the number of weights), got {_described(initial)}")
        if not torch.isfinite(initial).all():
            raise ValueError("initial weights must be finite")
        starts = initial.detach().to(start).expand(num_chains, -1)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.stack([torch.randn(start.shape, generator=generator, dtype=start.dtype)
                         for _ in range(num_chains)]).to(start.device)
    return starts + init_jitter * noise


def _described(value) -> str:
    """A tensor's shape, or another value's type name, for an error message."""
    return str(tuple(value.shape)) if torch.is_tensor(value) else type(value).__name__


def _batched_chain_stats(draws: torch.Tensor, stats: dict, max_tree_depth: int) -> list[dict]:
    """Per chain, the statistics :func:`run_chain` reports, from :func:`sample_chains`' records."""
    moved = (draws[:, 1:] != draws[:, :-1]).any(-1).double().mean(1) if draws.shape[1] > 1 else None
    out = []
    for c in range(draws.shape[0]):
        depth = stats["tree_depth"][c].double()
        out.append({
            "divergences": int(stats["diverging"][c].sum()),
            "warmup_divergences": int(stats["warmup_divergences"][c]),
            "mean_accept_prob": float(stats["accept_prob"][c].double().mean()),
            "accept_rate": float(moved[c]) if moved is not None else math.nan,
            "step_size": float(stats["step_size"][c]),
            "leapfrog_steps": float(stats["num_steps"][c].double().mean()),
            "tree_depth_mean": float(depth.mean()),
            "tree_depth_max": int(depth.max()),
            "max_tree_depth_rate": float((depth >= max_tree_depth).double().mean()),
        })
    return out


def _predictions(batched: BatchedPotential | None, potential: FlatPotential, draws: torch.Tensor,
                 x: torch.Tensor) -> torch.Tensor:
    """The predictions (class probabilities or means) of every draw ``(C, S, D)`` at ``x``: ``(C, S, P, K)``,
    by batched passes, or one pass per draw for a network that cannot batch."""
    if batched is None:
        try:
            batched = BatchedPotential(potential)
        except CannotBatch:
            likelihood = potential.model.likelihood
            with torch.no_grad():
                out = []
                for theta in draws.reshape(-1, draws.shape[-1]):
                    fn = likelihood.distribution(potential.network(potential.unflatten(theta), x))
                    out.append(fn.probs if likelihood.task == "classification" else fn.mean)
            out = torch.stack(out)
            return out.reshape(draws.shape[:2] + out.shape[1:]).cpu()
    return batched.predictions(draws, x).cpu()


def run_chain(potential: FlatPotential, init: torch.Tensor, *, num_samples: int, warmup: int, target_accept: float,
              max_tree_depth: int, progress: bool = False) -> tuple[torch.Tensor, dict]:
    """One NUTS chain (Pyro's kernel on ``potential``) from the flat weights ``init``: its draws ``(samples, D)``
    and its statistics ``divergences`` (after warm-up; ``warmup_divergences`` during it, ``diverging`` per draw),
    ``mean_accept_prob`` (the mean acceptance statistic of the sampling
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
    diverging = torch.zeros(num_samples, dtype=torch.bool)
    diverging[[t for t in stats["divergences"] if t >= 0]] = True  # Pyro counts from the end of warm-up
    return mcmc.get_samples()["weights"].detach(), {
        "divergences": int(diverging.sum()),
        "warmup_divergences": len(stats["divergences"]) - int(diverging.sum()),
        "diverging": diverging,
        "mean_accept_prob": stats["mean_accept_prob"],
        "accept_rate": float(stats["acceptance rate"]),
        "step_size": float(kernel.step_size),
        "leapfrog_steps": ((sampling[-1] - sampling[0]) / (len(sampling) - 1) if len(sampling) > 1 else math.nan),
    }


def summarise(draws: dict[str, torch.Tensor], per_chain: list[dict], seconds: float,
              predictions: torch.Tensor | None = None) -> dict:
    """The diagnostics of chains' ``draws`` ``{site: (chains, samples, ...)}``, their ``predictions``
    ``(chains, samples, ...)`` at some inputs, and their ``per_chain`` statistics (:func:`run_chain`): worst split
    R-hat and bulk ESS over all sites and per site, and over the predictions; divergences, mean leapfrog steps,
    ``converged`` (R-hat <= 1.05 on every weight, 2 or more chains) and ``warnings``."""
    num_chains, num_samples = next(iter(draws.values())).shape[:2]
    per_site = chain_diagnostics(draws)
    divergences = sum(c["divergences"] for c in per_chain)
    diagnostics = {
        "r_hat_max": max(d["r_hat_max"] for d in per_site.values()),
        "ess_min": min(d["ess_min"] for d in per_site.values()),
        "sites": per_site,
        "divergences": divergences,
        "divergence_rate": divergences / (num_chains * num_samples),
        "warmup_divergences": sum(c.get("warmup_divergences", 0) for c in per_chain),
        "chains": per_chain,
        "leapfrog_steps": sum(c["leapfrog_steps"] for c in per_chain) / num_chains,
        "seconds": seconds,
    }
    if predictions is not None:
        function_space = chain_diagnostics({"predictions": predictions})["predictions"]
        diagnostics.update(prediction_r_hat_max=function_space["r_hat_max"],
                           prediction_ess_min=function_space["ess_min"])
    notes = []
    if num_samples < 4:
        notes.append(f"{num_samples} draws per chain are too few for split R-hat (it needs 4): convergence "
                     "cannot be checked, draw more samples")
    elif num_chains > 1:
        if not diagnostics["r_hat_max"] <= 1.05:
            worst = max(per_site, key=lambda n: per_site[n]["r_hat_max"])
            notes.append(f"chains disagree: split R-hat {diagnostics['r_hat_max']:.3f} > 1.05 (worst site "
                         f"{worst!r}); the draws are not from one posterior mode, run longer or check the chains")
        if predictions is not None and not diagnostics["prediction_r_hat_max"] <= 1.05:
            notes.append(f"chains predict differently: split R-hat {diagnostics['prediction_r_hat_max']:.3f} > 1.05 "
                         "on the predictions; run longer or check the chains")
    if diagnostics["divergence_rate"] > 0.01:
        notes.append(f"{divergences} divergent transitions ({100 * diagnostics['divergence_rate']:.1f} %): raise "
                     "target_accept or reparameterize the prior")
    diagnostics["converged"] = num_chains > 1 and diagnostics["r_hat_max"] <= 1.05
    diagnostics["warnings"] = notes
    return diagnostics

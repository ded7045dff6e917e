"""Bulk ESS per second of NUTS on a Bayesian MLP: stock Pyro, pyrobnn's flat potential, and NumPyro.

The problem: two moons (:func:`pyrobnn.data.load_two_moons`, ``--train-size`` training points), an
MLP ``2 -> [--width] * --depth -> 2`` with ReLU, an N(0, 1) prior on every weight and bias, a
Categorical likelihood, full batch (unscaled). Every sampler gets the same data, the same network
layout, the same initial weights per chain, the same warmup / sample counts, target acceptance
probability and maximum tree depth (step size and a diagonal mass matrix adapted during warmup).
Samplers (``--samplers``; the default runs all but ``stock_jit`` and ``floor_compiled``):

- ``stock``: ``pyro.infer.NUTS(model)`` on the :class:`~pyrobnn.BayesianNetwork` (``model(x, y)``),
  which re-traces the model through Pyro's effect stack at every leapfrog step; ``stock_jit``: the
  same with ``jit_compile=True`` (Pyro traces that potential once with ``torch.jit.trace``);
- ``pyrobnn``: :func:`pyrobnn.infer.mcmc.sample_posterior` (``FlatPotential`` given to
  ``NUTS(potential_fn=...)``), and ``pyrobnn_jit``: the same with ``jit=True``;
- ``floor``: Pyro's NUTS on a potential written by hand in plain PyTorch, no Pyro model (one sum of
  squares for the prior, ``F.linear`` / ReLU, ``F.cross_entropy``): the floor of the
  ``potential_fn`` approach in eager PyTorch, for reference (as ``torch_bbb`` in ``speed.py``);
  ``floor_compiled``: the same value and gradient fused by ``torch.compile`` (~30 s to compile);
- ``numpyro``: NumPyro's NUTS on the same network written in JAX (float32), the speed anchor.
  Its wall time includes tracing and XLA compilation, which NumPyro repeats for every chain run one
  after another (``compile_seconds``: that fixed cost per chain, timed on a 1 + 1 iteration run in
  the warm process; ``ess_per_s_excl_compile``: ESS/s with it taken out).

Chains run one at a time, interleaved round-robin (chain c of every sampler, order rotated, then
chain c + 1), so machine load affects all samplers alike. Chain c starts at the network's initial
weights plus N(0, ``--init-jitter``^2) noise from ``torch.Generator().manual_seed(seed + c)``,
exactly as ``sample_posterior(seed=seed + c, num_chains=1)`` starts; the Pyro samplers run under
``pyro.set_rng_seed((seed + c) * 1009)`` (sample_posterior's seeding), NumPyro under
``PRNGKey((seed + c) * 1009)``. ``pyrobnn`` and ``pyrobnn_jit`` thus see the same random numbers:
identical draws (``same_draws_as_pyrobnn``) mean ``jit=True`` changed nothing, and the gap between
their wall times (``timing_noise``) is then this machine's timing noise.

Per sampler: ``seconds`` (wall time of warmup + sampling, all chains), ``ess`` (min over the weights
of the effective sample size of the pooled chains, :func:`pyro.ops.stats.effective_sample_size`, the
estimator of :func:`pyrobnn.infer.mcmc.chain_diagnostics`, the same for every sampler; ``ess_rank``: the
same on rank-normalised draws, Vehtari et al. 2021's bulk ESS; ``ess_median``: median over weights),
``ess_per_s``, ``leapfrog`` (mean leapfrog steps per draw while sampling), ``gradients`` (potential +
gradient evaluations, warmup included; NumPyro: its leapfrog steps), ``us_per_gradient`` (seconds /
gradients: one leapfrog step with the sampler's bookkeeping; it varies far less between runs than
ESS) and, for Pyro's samplers, ``nuts_overhead_us`` (``us_per_gradient`` minus the potential's own
cost below: what Pyro's NUTS itself spends per leapfrog step).

Per-evaluation cost (``per_eval_us``): median microseconds of one potential + gradient evaluation
over ``--rounds`` interleaved rounds (``--evals`` evaluations of each path in all), with Pyro's
validation off as inside ``pyro.infer.MCMC`` (``disable_validation=True``): stock's potential (the
function ``NUTS(model)`` builds, ``pyro.infer.mcmc.util.initialize_model``), ``stock_jit``, pyrobnn's
``FlatPotential`` (``pyrobnn_validated``: with validation on), the floor (and ``floor_compiled``)
and NumPyro's potential (``jax.jit(jax.value_and_grad(potential_fn))``, one call from Python).
``profile``: cProfile of ``--evals`` evaluations of pyrobnn's and stock's potential + gradient: the
top functions by own time, and the shares of pyrobnn's time in its parts.

``--threads`` (default 1) sets PyTorch's threads, and XLA's CPU threads to one when 1: at 50 x 16
the matrix products gain nothing from a second thread, and on shared cores OpenMP's spin-waiting
threads made single runs up to 10x slower.

    python benchmarks/nuts_speed.py                           # 2-16-16-2, 2 chains x (100 + 100), ~5 min
    python benchmarks/nuts_speed.py --samplers stock,pyrobnn,stock_jit,floor_compiled,numpyro

The last line is one JSON object: one entry per sampler (figures above), the ratios
``pyrobnn_vs_stock`` (ESS/s of pyrobnn / stock; goal >= 5) and ``numpyro_vs_pyrobnn`` (ESS/s of
NumPyro / pyrobnn; goal <= 3), the same on rank-normalised ESS (``*_rank``) and on
``us_per_gradient`` (``*_per_gradient``), ``<sampler>_vs_stock`` and ``numpyro_vs_<sampler>`` for the
references, ``goal_*`` flags, ``per_eval_us``, ``profile`` and ``config``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import math
import os
import pstats
import statistics
import time
import warnings

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model
from pyro.ops.integrator import potential_grad
from pyro.ops.stats import effective_sample_size

import pyrobnn.infer.mcmc as mcmc
from pyrobnn import BayesianNetwork, GaussianPrior
from pyrobnn.data import load_two_moons
from pyrobnn.networks import MLP

PYRO_SAMPLERS = ("stock", "stock_jit", "pyrobnn", "pyrobnn_jit", "floor", "floor_compiled")


# --------------------------------------------------------------------------- problem


def build_problem(args):
    """Training data, the Bayesian network and its flat initial weights (in FlatPotential's layout)."""
    data = load_two_moons(train_size=args.train_size, seed=args.data_seed)
    x, y = data.x_train, data.y_train
    torch.manual_seed(args.seed)
    model = BayesianNetwork(MLP(x.shape[1], (args.width,) * args.depth, data.num_outputs), prior=GaussianPrior())
    potential = mcmc.FlatPotential(model, x, y)
    return x, y, model, potential


def chain_init(start: torch.Tensor, seed: int, jitter: float) -> torch.Tensor:
    """The initial weights of ``sample_posterior(seed=seed, num_chains=1)``: start + N(0, jitter^2)."""
    generator = torch.Generator().manual_seed(seed)
    return start + jitter * torch.randn(start.shape, generator=generator, dtype=start.dtype)


def floor_potential(potential: mcmc.FlatPotential, x: torch.Tensor, y: torch.Tensor):
    """U(theta) written by hand for the MLP in plain PyTorch: N(0, 1) prior as one sum of squares (constant
    included, so it equals FlatPotential's value), Linear / ReLU layers read off the flat vector,
    cross-entropy summed over the data."""
    sizes = [math.prod(shape) for shape in potential.shapes]
    shapes = potential.shapes
    if len(shapes) % 2 or any(len(shapes[i]) != 2 or len(shapes[i + 1]) != 1 for i in range(0, len(shapes), 2)):
        raise ValueError(f"the floor potential expects (weight, bias) pairs of Linear layers, got {shapes}")
    constant = 0.5 * potential.size * math.log(2 * math.pi)
    layers = len(shapes) // 2

    def energy(theta: torch.Tensor) -> torch.Tensor:
        parts = theta.split(sizes)
        h = x
        for i in range(layers):
            h = F.linear(h, parts[2 * i].view(shapes[2 * i]), parts[2 * i + 1])
            if i < layers - 1:
                h = h.relu()
        return 0.5 * theta.dot(theta) + constant + F.cross_entropy(h, y, reduction="sum")

    return energy


class _ValueAndGrad(torch.autograd.Function):
    """A scalar whose forward is one fused call returning (value, gradient), so autograd only scales the
    precomputed gradient: how a compiled value-and-gradient can serve ``NUTS(potential_fn=...)``."""

    @staticmethod
    def forward(ctx, theta, value_and_grad):
        value, gradient = value_and_grad(theta.detach())
        ctx.save_for_backward(gradient)
        return value

    @staticmethod
    def backward(ctx, grad_output):
        (gradient,) = ctx.saved_tensors
        return grad_output * gradient, None


def compiled_potential(energy):
    """``energy`` with value and gradient computed by one ``torch.compile``d ``grad_and_value``."""
    fused = torch.compile(torch.func.grad_and_value(energy), dynamic=False)

    def value_and_grad(theta):
        gradient, value = fused(theta)
        return value, gradient

    return lambda theta: _ValueAndGrad.apply(theta, value_and_grad)


class _Counted:
    """``potential_fn`` wrapper counting its calls (one per leapfrog step, plus one per tree start)."""

    def __init__(self, fn, key="weights"):
        self.fn, self.key, self.evaluations = fn, key, 0

    def __call__(self, params):
        self.evaluations += 1
        return self.fn(params[self.key]) if self.key else self.fn(params)


class _CountingNUTS(NUTS):
    """Stock ``NUTS(model)`` whose potential (built in ``setup``) counts its evaluations."""

    def _initialize_model_properties(self, model_args, model_kwargs):
        super()._initialize_model_properties(model_args, model_kwargs)
        self.counter = _Counted(self.potential_fn, key=None)
        self.potential_fn = self.counter


@contextlib.contextmanager
def _recording_potentials():
    """Collect the FlatPotential that ``sample_posterior`` builds (it counts its own evaluations)."""
    made = []
    original = mcmc.FlatPotential

    class Recording(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    mcmc.FlatPotential = Recording
    try:
        yield made
    finally:
        mcmc.FlatPotential = original


# --------------------------------------------------------------------------- one chain of each sampler


def _pyro_chain(kernel, counter, init, args, chain_seed, model_args=()):
    """Run one Pyro MCMC chain; returns draws (S, D) flattened by ``flatten``, leapfrog steps/draw, gradients."""
    pyro.set_rng_seed(chain_seed * 1009)
    marks = []
    mcmc_run = MCMC(kernel, num_samples=args.samples, warmup_steps=args.warmup, initial_params=init,
                    disable_progbar=True,
                    hook_fn=lambda kernel, params, stage, i: marks.append((stage, counter().evaluations)))
    mcmc_run.run(*model_args)
    sampling = [n for stage, n in marks if stage == "Sample"]
    leapfrog = (sampling[-1] - sampling[0]) / max(len(sampling) - 1, 1)
    return mcmc_run.get_samples(), leapfrog, counter().evaluations


def run_stock(model, potential, x, y, init, args, chain_seed, jit=False):
    kernel = _CountingNUTS(model, target_accept_prob=args.target_accept, max_tree_depth=args.max_tree_depth,
                           jit_compile=jit, ignore_jit_warnings=True)
    samples, leapfrog, grads = _pyro_chain(kernel, lambda: kernel.counter, potential.unflatten(init), args,
                                           chain_seed, model_args=(x, y))
    draws = torch.cat([samples[name].reshape(args.samples, -1) for name in potential.names], dim=-1)
    return draws, leapfrog, grads


def run_pyrobnn(model, x, y, args, chain_seed, jit):
    with _recording_potentials() as made:
        result = mcmc.sample_posterior(model, x, y, num_samples=args.samples, warmup=args.warmup, num_chains=1,
                                       seed=chain_seed, init_jitter=args.init_jitter,
                                       target_accept=args.target_accept, max_tree_depth=args.max_tree_depth, jit=jit)
    draws = torch.cat([value[0].reshape(args.samples, -1) for value in result.draws.values()], dim=-1)
    if not made:
        raise RuntimeError("sample_posterior no longer builds pyrobnn.infer.mcmc.FlatPotential: update how this "
                           "benchmark counts its gradient evaluations (_recording_potentials)")
    return draws, result.diagnostics["leapfrog_steps"], made[-1].evaluations


def run_floor(energy, init, args, chain_seed):
    counter = _Counted(energy)
    kernel = NUTS(potential_fn=counter, target_accept_prob=args.target_accept, max_tree_depth=args.max_tree_depth)
    samples, leapfrog, grads = _pyro_chain(kernel, lambda: counter, {"weights": init}, args, chain_seed)
    return samples["weights"], leapfrog, grads


class NumPyroSampler:
    """NumPyro NUTS on the same MLP in JAX: flat weight vector in FlatPotential's layout, N(0, 1) prior."""

    def __init__(self, potential, x, y, args):
        import jax
        import jax.numpy as jnp
        import numpy as np
        import numpyro
        import numpyro.distributions as nd
        from numpyro.infer import MCMC as NumPyroMCMC
        from numpyro.infer import NUTS as NumPyroNUTS

        self.jax, self.jnp = jax, jnp
        sizes = [math.prod(shape) for shape in potential.shapes]
        splits = list(np.cumsum(sizes)[:-1])
        shapes = [tuple(shape) for shape in potential.shapes]
        layers, size = len(shapes) // 2, potential.size

        def model(x, y):
            w = numpyro.sample("weights", nd.Normal(0.0, 1.0).expand([size]).to_event(1))
            parts = jnp.split(w, splits)
            h = x
            for i in range(layers):
                h = h @ parts[2 * i].reshape(shapes[2 * i]).T + parts[2 * i + 1]
                if i < layers - 1:
                    h = jax.nn.relu(h)
            with numpyro.plate("data", x.shape[0]):
                numpyro.sample("obs", nd.Categorical(logits=h), obs=y)

        self.model, self.args = model, args
        self.x, self.y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        self.make = lambda warmup, samples: NumPyroMCMC(
            NumPyroNUTS(model, target_accept_prob=args.target_accept, max_tree_depth=args.max_tree_depth),
            num_warmup=warmup, num_samples=samples, num_chains=1, progress_bar=False)
        self.mcmc = self.make(args.warmup, args.samples)
        info = numpyro.infer.util.initialize_model(jax.random.PRNGKey(0), model, model_args=(self.x, self.y))
        self.value_and_grad = jax.jit(jax.value_and_grad(lambda w: info.potential_fn({"weights": w})))

    def potential(self, theta: torch.Tensor) -> float:
        return float(self.value_and_grad(self.jnp.asarray(theta.numpy()))[0])

    def evaluate(self, theta):
        """Returns a closure timing one potential + gradient evaluation."""
        w = self.jnp.asarray(theta.numpy())
        return lambda: self.jax.block_until_ready(self.value_and_grad(w))

    def chain(self, init, chain_seed, mcmc_run=None):
        mcmc_run = self.mcmc if mcmc_run is None else mcmc_run
        key = self.jax.random.PRNGKey(chain_seed * 1009)
        init_params = {"weights": self.jnp.asarray(init.numpy())}
        mcmc_run.warmup(key, self.x, self.y, init_params=init_params, extra_fields=("num_steps",),
                        collect_warmup=True)
        warm_steps = int(mcmc_run.get_extra_fields()["num_steps"].sum())
        mcmc_run.run(mcmc_run.post_warmup_state.rng_key, self.x, self.y, extra_fields=("num_steps",))
        steps = mcmc_run.get_extra_fields()["num_steps"]
        draws = self.jax.block_until_ready(mcmc_run.get_samples()["weights"])
        return torch.from_numpy(self.jax.device_get(draws).copy()), float(steps.mean()), warm_steps + int(steps.sum())

    def fixed_cost(self, init) -> float:
        """Seconds of a chain of 1 warmup + 1 draw: tracing and compilation, paid again by every chain."""
        tick = time.perf_counter()
        self.chain(init, 0, self.make(1, 1))
        return time.perf_counter() - tick


# --------------------------------------------------------------------------- figures


def rank_normalize(draws: torch.Tensor) -> torch.Tensor:
    """Rank-normalised draws (Vehtari et al. 2021): normal scores of the pooled ranks, per weight."""
    chains, samples, dim = draws.shape
    flat = draws.reshape(chains * samples, dim)
    ranks = flat.argsort(0).argsort(0).double() + 1
    scores = torch.special.ndtri((ranks - 0.375) / (chains * samples + 0.25))
    return scores.reshape(chains, samples, dim)


def ess_figures(draws: torch.Tensor) -> dict[str, float]:
    """Min and median ESS over weights of draws (chains, samples, D), raw and rank-normalised."""
    draws = draws.double()
    # NaN (constant draws) and the negative values the estimator gives on very short chains count as 0
    ess = torch.nan_to_num(effective_sample_size(draws, chain_dim=0, sample_dim=1), nan=0.0).clamp(min=0)
    rank = torch.nan_to_num(effective_sample_size(rank_normalize(draws), chain_dim=0, sample_dim=1),
                            nan=0.0).clamp(min=0)
    return {"ess": float(ess.min()), "ess_median": float(ess.median()), "ess_rank": float(rank.min())}


def per_eval_costs(paths: dict[str, callable], evals: int, rounds: int) -> dict[str, float]:
    """Median microseconds per call of every path over ``rounds`` interleaved rounds (``evals`` calls in all)."""
    repeats = max(evals // rounds, 1)
    for fn in paths.values():
        for _ in range(5):
            fn()
    times = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            tick = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[name].append((time.perf_counter() - tick) / repeats * 1e6)
    return {name: round(statistics.median(values), 1) for name, values in times.items()}


def _grad_call(fn, params):
    return lambda: potential_grad(fn, params)


def cprofile(fn, evals: int, top: int = 8):
    """cProfile ``evals`` calls of fn: total seconds, and the stats for the breakdown."""
    for _ in range(5):
        fn()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(evals):
        fn()
    profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    top_rows = [[f"{os.path.basename(f)}:{name}" if f != "~" else name, round(tt / total, 3)]
                for (f, line, name), (cc, nc, tt, ct, callers) in rows]
    return stats, total, top_rows


def _cumulative(stats, path_end: str, name: str) -> float:
    return sum(ct for (f, line, fn), (cc, nc, tt, ct, callers) in stats.stats.items()
               if fn == name and f.replace(os.sep, "/").endswith(path_end))


def profile_paths(stock_fn, stock_params, pyrobnn_fn, theta, evals: int) -> dict:
    """Where the time of one potential + gradient goes (cProfile; shares of the profiled time)."""
    stock_stats, stock_total, stock_top = cprofile(_grad_call(stock_fn, stock_params), evals)
    stats, total, top = cprofile(_grad_call(pyrobnn_fn, {"weights": theta.clone()}), evals)
    backward = sum(tt for (f, line, fn), (cc, nc, tt, ct, callers) in stats.stats.items() if "run_backward" in fn)
    shares = {
        "autograd_backward": backward,
        "prior_log_prob": _cumulative(stats, "pyrobnn/distributions.py", "log_prob"),
        "network_forward": _cumulative(stats, "pyrobnn/infer/mcmc.py", "network"),
        "likelihood": _cumulative(stats, "pyrobnn/model/likelihoods.py", "distribution")
        + _cumulative(stats, "torch/distributions/categorical.py", "log_prob"),
        "unflatten": _cumulative(stats, "pyrobnn/infer/mcmc.py", "unflatten"),
    }
    return {
        "pyrobnn_us_profiled": round(total / evals * 1e6, 1),
        "stock_us_profiled": round(stock_total / evals * 1e6, 1),
        "pyrobnn_shares": {k: round(v / total, 3) for k, v in shares.items()},
        "pyrobnn_top": top,
        "stock_top": stock_top,
        "note": "shares of cProfile time, Pyro validation off (as in MCMC); autograd_backward is the C++ backward, "
                "the others are cumulative forward parts; cProfile inflates Python-heavy parts",
    }


# --------------------------------------------------------------------------- main


SAMPLERS = ("stock", "stock_jit", "pyrobnn", "pyrobnn_jit", "floor", "floor_compiled", "numpyro")
DEFAULT_SAMPLERS = ("stock", "pyrobnn", "pyrobnn_jit", "floor", "numpyro")
POTENTIAL_OF = {"stock": "stock", "stock_jit": "stock_jit", "pyrobnn": "pyrobnn", "pyrobnn_jit": "pyrobnn",
                "floor": "floor", "floor_compiled": "floor_compiled", "numpyro": "numpyro"}


def measure(args) -> dict:
    samplers = list(args.samplers)
    x, y, model, potential = build_problem(args)
    start = potential.initial()
    energy = floor_potential(potential, x, y)
    reference = float(potential({"weights": start.clone()}))
    if not math.isclose(float(energy(start.clone())), reference, rel_tol=1e-4):
        raise RuntimeError(f"floor potential {float(energy(start.clone()))} != FlatPotential {reference}")
    fns = {"floor": energy}
    compile_seconds = None
    if "floor_compiled" in samplers:
        fns["floor_compiled"] = compiled_potential(energy)
        tick = time.perf_counter()
        fns["floor_compiled"](start.clone().requires_grad_())
        compile_seconds = time.perf_counter() - tick
    numpyro_sampler = None
    if "numpyro" in samplers:
        numpyro_sampler = NumPyroSampler(potential, x, y, args)
        value = numpyro_sampler.potential(start)
        if not math.isclose(value, reference, rel_tol=1e-4):
            raise RuntimeError(f"NumPyro potential {value} != FlatPotential {reference}: not the same model")

    # ---- per-evaluation cost, interleaved; Pyro's MCMC runs with validation off (disable_validation=True),
    # so these do too; "pyrobnn_validated" is FlatPotential with Pyro's validation on (outside MCMC).
    init = potential.unflatten(start)
    _, stock_fn, _, _ = initialize_model(model, (x, y), initial_params=init)
    _, stock_jit_fn, _, _ = initialize_model(model, (x, y), initial_params=init, jit_compile=True,
                                             skip_jit_warnings=True)
    fresh = mcmc.FlatPotential(model, x, y)
    paths = {
        "stock": _grad_call(stock_fn, {k: v.clone() for k, v in init.items()}),
        "stock_jit": _grad_call(stock_jit_fn, {k: v.clone() for k, v in init.items()}),
        "pyrobnn": _grad_call(fresh, {"weights": start.clone()}),
        "pyrobnn_validated": _grad_call(_validated(fresh), {"weights": start.clone()}),
    }
    for name, fn in fns.items():
        paths[name] = _grad_call(_Counted(fn), {"weights": start.clone()})
    if numpyro_sampler is not None:
        paths["numpyro"] = numpyro_sampler.evaluate(start)
    with pyro.validation_enabled(False):
        per_eval = per_eval_costs(paths, args.evals, args.rounds)
        profile = profile_paths(stock_fn, {k: v.clone() for k, v in init.items()}, fresh, start, args.evals)
    numpyro_compile = None
    if numpyro_sampler is not None:  # the second of two runs: the process is warm, as for chains after the first
        numpyro_compile = min(numpyro_sampler.fixed_cost(start) for _ in range(2))

    # ---- the samplers, chains interleaved
    chains = {name: {"draws": [], "leapfrog": [], "gradients": [], "seconds": []} for name in samplers}
    for c in range(args.chains):
        chain_seed = args.seed + c
        init_c = chain_init(start, chain_seed, args.init_jitter)
        order = samplers[c % len(samplers):] + samplers[:c % len(samplers)]
        for name in order:
            tick = time.perf_counter()
            if name in ("stock", "stock_jit"):
                out = run_stock(model, potential, x, y, init_c, args, chain_seed, jit=name == "stock_jit")
            elif name in ("pyrobnn", "pyrobnn_jit"):
                out = run_pyrobnn(model, x, y, args, chain_seed, jit=name == "pyrobnn_jit")
            elif name == "numpyro":
                out = numpyro_sampler.chain(init_c, chain_seed)
            else:
                out = run_floor(fns[name], init_c, args, chain_seed)
            seconds = time.perf_counter() - tick
            for key, value in zip(("draws", "leapfrog", "gradients"), out):
                chains[name][key].append(value)
            chains[name]["seconds"].append(seconds)
            print(f"chain {c} {name}: {seconds:.1f} s, {out[2]} gradients, {out[1]:.0f} leapfrog/draw", flush=True)

    result, draws = {}, {}
    for name, runs in chains.items():
        draws[name] = torch.stack([d.reshape(args.samples, -1).float() for d in runs["draws"]])
        seconds, gradients = sum(runs["seconds"]), sum(runs["gradients"])
        figures = ess_figures(draws[name])
        entry = {
            "seconds": round(seconds, 2),
            "chain_seconds": [round(s, 2) for s in runs["seconds"]],
            **{k: round(v, 1) for k, v in figures.items()},
            "ess_per_s": round(figures["ess"] / seconds, 3),
            "ess_rank_per_s": round(figures["ess_rank"] / seconds, 3),
            "leapfrog": round(statistics.mean(runs["leapfrog"]), 1),
            "gradients": gradients,
            "us_per_gradient": round(seconds / gradients * 1e6, 1),
        }
        if name == "numpyro":
            entry["compile_seconds"] = round(numpyro_compile, 2)
            compute = seconds - args.chains * numpyro_compile
            if compute > 0:
                entry["ess_per_s_excl_compile"] = round(figures["ess"] / compute, 3)
                entry["us_per_gradient_excl_compile"] = round(compute / gradients * 1e6, 1)
        if name in PYRO_SAMPLERS:
            entry["nuts_overhead_us"] = round(entry["us_per_gradient"] - per_eval[POTENTIAL_OF[name]], 1)
        result[name] = entry
    if "pyrobnn" in result and "pyrobnn_jit" in result:
        # jit=True and jit=False share seeds and inits: identical draws mean the flag changed nothing, and then
        # the gap between their wall times is this machine's timing noise
        same = bool(torch.equal(draws["pyrobnn_jit"], draws["pyrobnn"]))
        result["pyrobnn_jit"]["same_draws_as_pyrobnn"] = same
        if same:
            result["timing_noise"] = round(abs(result["pyrobnn_jit"]["seconds"] / result["pyrobnn"]["seconds"] - 1), 3)

    def ratio(a, b, key, inverse=False):
        if a not in result or b not in result or key not in result[a] or key not in result[b]:
            return None
        num, den = (result[b][key], result[a][key]) if inverse else (result[a][key], result[b][key])
        return round(num / den, 2) if den > 0 else None

    result["pyrobnn_vs_stock"] = ratio("pyrobnn", "stock", "ess_per_s")
    result["numpyro_vs_pyrobnn"] = ratio("numpyro", "pyrobnn", "ess_per_s")
    result["pyrobnn_vs_stock_rank"] = ratio("pyrobnn", "stock", "ess_rank_per_s")
    result["numpyro_vs_pyrobnn_rank"] = ratio("numpyro", "pyrobnn", "ess_rank_per_s")
    result["pyrobnn_vs_stock_per_gradient"] = ratio("pyrobnn", "stock", "us_per_gradient", inverse=True)
    result["numpyro_vs_pyrobnn_per_gradient"] = ratio("numpyro", "pyrobnn", "us_per_gradient", inverse=True)
    for name in ("stock_jit", "floor", "floor_compiled"):
        if name in result:
            result[f"{name}_vs_stock"] = ratio(name, "stock", "ess_per_s")
            result[f"numpyro_vs_{name}"] = ratio("numpyro", name, "ess_per_s")
    if result["pyrobnn_vs_stock"] is not None:
        result["goal_pyrobnn_5x_stock"] = result["pyrobnn_vs_stock"] >= 5
    if result["numpyro_vs_pyrobnn"] is not None:
        result["goal_numpyro_within_3x"] = result["numpyro_vs_pyrobnn"] <= 3
    result["per_eval_us"] = per_eval
    result["profile"] = profile
    result["config"] = {"network": "-".join(map(str, (x.shape[1],) + (args.width,) * args.depth + (2,))),
                        "weights": potential.size, "train_size": len(x), "warmup": args.warmup,
                        "samples": args.samples, "chains": args.chains, "max_tree_depth": args.max_tree_depth,
                        "target_accept": args.target_accept, "init_jitter": args.init_jitter,
                        "threads": args.threads, "seed": args.seed, "samplers": samplers,
                        "torch_compile_seconds": None if compile_seconds is None else round(compile_seconds, 1),
                        "versions": _versions()}
    return result


def _validated(potential):
    def fn(params):
        with pyro.validation_enabled(True):
            return potential(params)

    return fn


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "pyro": pyro.__version__}
    with contextlib.suppress(ImportError):
        import jax
        import numpyro

        out.update(jax=jax.__version__, numpyro=numpyro.__version__)
    return out


def print_tables(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    config = result["config"]
    table = Table(title=f"NUTS, two moons ({config['train_size']} points), MLP {config['network']} "
                        f"({config['weights']} weights), {config['chains']} chains x "
                        f"({config['warmup']} warmup + {config['samples']} draws)")
    for column in ("sampler", "seconds", "min ESS", "ESS/s", "min rank ESS", "leapfrog/draw", "gradients",
                   "us/gradient", "NUTS overhead us"):
        table.add_column(column, justify="right")
    for name in SAMPLERS:
        if name in result:
            r = result[name]
            table.add_row(name, f"{r['seconds']:.1f}", f"{r['ess']:.0f}", f"{r['ess_per_s']:.2f}",
                          f"{r['ess_rank']:.0f}", f"{r['leapfrog']:.0f}", str(r["gradients"]),
                          f"{r['us_per_gradient']:.0f}", str(r.get("nuts_overhead_us", "")))
    console = Console()
    console.print(table)
    costs = Table(title="one potential + gradient evaluation, us (median of interleaved rounds)")
    for name in result["per_eval_us"]:
        costs.add_column(name, justify="right")
    costs.add_row(*(f"{v:.0f}" for v in result["per_eval_us"].values()))
    console.print(costs)
    console.print(f"pyrobnn / stock ESS/s: {result['pyrobnn_vs_stock']}x (goal >= 5, per gradient "
                  f"{result['pyrobnn_vs_stock_per_gradient']}x); numpyro / pyrobnn ESS/s: "
                  f"{result['numpyro_vs_pyrobnn']}x (goal <= 3, per gradient "
                  f"{result['numpyro_vs_pyrobnn_per_gradient']}x)")


def _sampler_list(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in SAMPLERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown sampler(s) {unknown}; choose from {', '.join(SAMPLERS)}")
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=16, help="hidden units per layer")
    parser.add_argument("--depth", type=int, default=2, help="hidden layers")
    parser.add_argument("--train-size", type=int, default=50, help="two-moons training points")
    parser.add_argument("--warmup", type=int, default=100, help="warmup (adaptation) iterations per chain")
    parser.add_argument("--samples", type=int, default=100, help="draws per chain")
    parser.add_argument("--chains", type=int, default=2, help="chains per sampler (run one after the other)")
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--init-jitter", type=float, default=0.01, help="sd of the noise added to the initial weights")
    parser.add_argument("--seed", type=int, default=0, help="network init and chain seeds (chain c: seed + c)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--evals", type=int, default=1000, help="potential + gradient evaluations timed per path")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of the per-evaluation timing")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads; XLA when 1)")
    parser.add_argument("--samplers", type=_sampler_list, default=DEFAULT_SAMPLERS,
                        help=f"comma-separated, from {','.join(SAMPLERS)} (default: {','.join(DEFAULT_SAMPLERS)}; "
                             "floor_compiled compiles for ~30 s on first use, numpyro needs the bench extra)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace.* is deprecated", category=FutureWarning)
    if args.threads == 1:
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    result = measure(args)
    print_tables(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

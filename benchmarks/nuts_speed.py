"""Bulk ESS per second of NUTS on a Bayesian MLP: stock Pyro, Pyro on pyrobnn's flat potential, the batched sampler
at several chain counts, and NumPyro.

Problems (``--problem``), each with an N(0, 1) prior on every weight and bias, full batch (unscaled):

- ``two-moons``: :func:`pyrobnn.data.load_two_moons`, ``--train-size`` (50) points, an MLP 2-16-16-2 (``--width``,
  ``--depth``) with ReLU, a Categorical likelihood;
- ``cubic``: y = x³ + N(0, 3²) (:func:`pyrobnn.data.cubic`, 20 training points, x and y standardised on them, the
  noise 3 / s_y), an MLP 1-50-1, a Gaussian likelihood;
- ``boston``: UCI Boston housing, split 0 (:func:`pyrobnn.data.load_uci`: 455 training points, standardised on
  them, predictions at the 51 test inputs), an MLP 13-50-1, a Gaussian likelihood with the noise ``--noise``
  (0.3: about the residual of the best models, RMSE 2.8 of a target whose standard deviation is 9.2).

``--width`` and ``--depth`` default to the problem's network.

Samplers (``--samplers``), each from the same initial weights (the network's plus N(0, ``--init-jitter``²), chain
c's noise as :func:`pyrobnn.infer.mcmc.sample_posterior` draws it), the same warm-up and draw counts, target
acceptance and maximum tree depth, with step size and a diagonal mass matrix adapted during warm-up:

- ``stock``: ``pyro.infer.NUTS(model)`` on the :class:`~pyrobnn.BayesianNetwork`, which re-traces the model through
  Pyro's effect stack at every leapfrog step, ``--stock-chains`` chains (default 1: it is slow, and chains run
  one after another, so ESS and seconds both grow with their number and ESS/s does not change);
- ``flat``: ``sample_posterior(sampler="pyro")``: Pyro's NUTS on pyrobnn's flat potential, ``--chains`` chains;
- ``batched``: ``sample_posterior(sampler="batched")`` at every chain count of ``--batched-chains`` (1, 4, 16, 64):
  all chains in lockstep, one batched pass of the network per leapfrog step, the step compiled as
  ``--compile`` says (``auto``, the default: the recorded leaf, then inductor when the run is long enough);
- ``numpyro``: NumPyro's NUTS on the same network written in JAX (float32), ``--chains`` chains with every chain
  method that can run them here (``sequential``, ``vectorized``, and ``parallel`` on the ``--threads`` XLA host
  devices when the chains fit), the best reported as ``numpyro``, each also as ``numpyro_<method>``; and, at every
  other chain count of ``--numpyro-chains`` (default: the batched sampler's), ``vectorized`` as
  ``numpyro_vectorized_<C>``, so that each batched run has a NumPyro run with as many chains
  (``batched_<C>_vs_numpyro_same_chains``).

Per sampler: ``seconds`` (wall time of warm-up and sampling, compilation included; for NumPyro ``compile_seconds``
is a second run of 1 + 1 iterations of the same configuration, and ``*_excl_compile`` the figures without it),
``ess`` = min(``ess_weights``, ``ess_predictions``): the bulk ESS (Vehtari et al. 2021: rank-normalised draws,
:func:`pyro.ops.stats.effective_sample_size`) of every weight and of every prediction (class probabilities or
means) at ``--points`` test inputs, the smallest; ``ess_per_s``; ``leapfrog`` (mean leapfrog steps per draw and
chain) and for the batched sampler ``leaves`` (batched leapfrog steps: the lockstep runs as long as the chain
with the longest trajectory) and ``compiler``. Ratios: ``<sampler>_vs_stock`` and ``<sampler>_vs_numpyro`` (ESS/s
over ESS/s, NumPyro with its compilation counted), ``batched_best`` (the chain count with the most ESS/s) and
``goal_*`` flags (batched: at least NumPyro's ESS/s with its compilation counted, at least 10x stock).

Timing: ``--threads`` (default 2) PyTorch threads and XLA host devices; compilation caches start empty
(``TORCHINDUCTOR_CACHE_DIR`` is a fresh temporary folder unless set), so every compile is paid as a first user
pays it.

    python benchmarks/nuts_speed.py --problem two-moons                 # ~5 min on 2 cores
    python benchmarks/nuts_speed.py --problem cubic --width 50 --depth 1

The last line is one JSON object with all the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import tempfile
import time
import warnings

THREADS_DEFAULT = 2


def _early_environment() -> None:
    """Settings read when torch and jax are imported: a cold inductor cache, XLA host devices for NumPyro."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="nuts_speed_inductor_"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    threads = THREADS_DEFAULT
    for i, arg in enumerate(os.sys.argv):
        if arg == "--threads" and i + 1 < len(os.sys.argv):
            threads = int(os.sys.argv[i + 1])
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={threads}")


_early_environment()

import pyro  # noqa: E402
import torch  # noqa: E402
from pyro.infer import MCMC, NUTS  # noqa: E402
from pyro.ops.stats import effective_sample_size  # noqa: E402

from pyrobnn import BayesianNetwork, Gaussian, GaussianPrior  # noqa: E402
from pyrobnn.data import cubic, load_two_moons, load_uci  # noqa: E402
from pyrobnn.infer.mcmc import chain_starts, sample_posterior  # noqa: E402
from pyrobnn.infer.potential import BatchedPotential, FlatPotential  # noqa: E402
from pyrobnn.networks import MLP  # noqa: E402

SAMPLERS = ("stock", "flat", "batched", "numpyro")
PROBLEMS = {"two-moons": (16, 2, 50), "cubic": (50, 1, 20), "boston": (50, 1, None)}
"""Each problem's hidden width, depth and training points (boston: its split's 455)."""


# --------------------------------------------------------------------------- problem


def build_problem(args):
    """``(x, y, x_points, model)``: training data, the inputs where predictions are compared, the network."""
    if args.problem == "two-moons":
        data = load_two_moons(train_size=args.train_size, seed=args.data_seed)
        x, y, likelihood = data.x_train, data.y_train, None
        x_test, outputs = data.x_test, 2
    elif args.problem == "boston":
        data = load_uci("boston", split=0)
        x, y, x_test, outputs, likelihood = data.x_train, data.y_train, data.x_test, 1, Gaussian(args.noise)
    else:
        data = cubic(n_train=args.train_size, n_test=200, seed=args.data_seed)
        mx, sx = data.x_train.mean(0), data.x_train.std(0)
        my, sy = float(data.y_train.mean()), float(data.y_train.std())
        x, y = (data.x_train - mx) / sx, (data.y_train - my) / sy
        x_test, outputs, likelihood = (data.x_test - mx) / sx, 1, Gaussian(3.0 / sy)
    points = x_test[torch.linspace(0, len(x_test) - 1, min(args.points, len(x_test))).round().long()]
    torch.manual_seed(args.seed)
    net = MLP(x.shape[1], (args.width,) * args.depth, outputs)
    model = BayesianNetwork(net, likelihood, prior=GaussianPrior())
    return x, y, points, model


# --------------------------------------------------------------------------- the samplers


def run_stock(model, x, y, starts, args) -> torch.Tensor:
    """Stock ``NUTS(model)``, chains one after another from ``starts``: flat draws (C, S, D)."""
    names = [site.name for site in model.sites()]
    potential = FlatPotential(model, x, y)
    draws = []
    for c, start in enumerate(starts):
        pyro.set_rng_seed(args.seed * 1009 + c)
        kernel = NUTS(model, target_accept_prob=args.target_accept, max_tree_depth=args.max_tree_depth)
        mcmc = MCMC(kernel, num_samples=args.samples, warmup_steps=args.warmup, disable_progbar=True,
                    initial_params=potential.unflatten(start))
        mcmc.run(x, y)
        samples = mcmc.get_samples()
        draws.append(torch.cat([samples[name].reshape(args.samples, -1) for name in names], -1))
    return torch.stack(draws)


def run_sample_posterior(model, x, y, args, sampler, chains, points):
    device = torch.device(args.device)  # a copy of the model on --device; the draws come back to the host
    model, x, y, points = copy.deepcopy(model).to(device), x.to(device), y.to(device), points.to(device)
    result = sample_posterior(model, x, y, num_samples=args.samples, warmup=args.warmup, num_chains=chains,
                              seed=args.seed, init_jitter=args.init_jitter, target_accept=args.target_accept,
                              max_tree_depth=args.max_tree_depth, sampler=sampler, compile=args.compile,
                              prediction_x=points)
    flat = torch.cat([value.reshape(chains, args.samples, -1) for value in result.draws.values()], -1)
    return flat.cpu(), result.diagnostics


class NumPyroSampler:
    """NumPyro's NUTS on the same MLP in JAX: the flat weight vector in FlatPotential's layout, an N(0, 1) prior,
    the same likelihood."""

    def __init__(self, potential: FlatPotential, x, y, args):
        import jax
        import jax.numpy as jnp
        import numpy as np
        import numpyro
        import numpyro.distributions as nd

        self.jax, self.jnp, self.args = jax, jnp, args
        sizes = [math.prod(shape) for shape in potential.shapes]
        splits = list(np.cumsum(sizes)[:-1])
        shapes = [tuple(shape) for shape in potential.shapes]
        layers, size = len(shapes) // 2, potential.size
        classification = potential.model.likelihood.task == "classification"
        noise = None if classification else float(potential.model.likelihood.scale)

        def model(x, y):
            w = numpyro.sample("weights", nd.Normal(0.0, 1.0).expand([size]).to_event(1))
            parts = jnp.split(w, splits)
            h = x
            for i in range(layers):
                h = h @ parts[2 * i].reshape(shapes[2 * i]).T + parts[2 * i + 1]
                if i < layers - 1:
                    h = jax.nn.relu(h)
            with numpyro.plate("data", x.shape[0]):
                if classification:
                    numpyro.sample("obs", nd.Categorical(logits=h), obs=y)
                else:
                    numpyro.sample("obs", nd.Normal(h, noise).to_event(1), obs=y)

        self.model = model
        self.x, self.y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        info = numpyro.infer.util.initialize_model(jax.random.PRNGKey(0), model, model_args=(self.x, self.y))
        self.potential_fn = jax.jit(lambda w: info.potential_fn({"weights": w}))

    def potential(self, theta: torch.Tensor) -> float:
        return float(self.potential_fn(self.jnp.asarray(theta.numpy())))

    def methods(self, chains: int) -> list[str]:
        out = ["sequential", "vectorized"]
        if chains <= self.jax.local_device_count():
            out.append("parallel")
        return out

    def run(self, starts: torch.Tensor, method: str, warmup: int, samples: int):
        """Draws (C, S, D) and mean leapfrog steps per draw, from ``starts`` (C, D)."""
        from numpyro.infer import MCMC as NumPyroMCMC
        from numpyro.infer import NUTS as NumPyroNUTS

        args = self.args
        mcmc = NumPyroMCMC(NumPyroNUTS(self.model, target_accept_prob=args.target_accept,
                                       max_tree_depth=args.max_tree_depth),
                           num_warmup=warmup, num_samples=samples, num_chains=len(starts), chain_method=method,
                           progress_bar=False)
        init = {"weights": self.jnp.asarray((starts if len(starts) > 1 else starts[0]).numpy())}  # 1 chain: unbatched
        mcmc.run(self.jax.random.PRNGKey(args.seed * 1009), self.x, self.y, init_params=init,
                 extra_fields=("num_steps",))
        draws = self.jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["weights"])
        steps = float(mcmc.get_extra_fields()["num_steps"].mean())
        return torch.from_numpy(self.jax.device_get(draws).copy()), steps


# --------------------------------------------------------------------------- figures


def rank_normalize(draws: torch.Tensor) -> torch.Tensor:
    """Rank-normalised draws (Vehtari et al. 2021): normal scores of the pooled ranks, per coordinate."""
    chains, samples = draws.shape[:2]
    flat = draws.reshape(chains * samples, -1)
    ranks = flat.argsort(0).argsort(0).double() + 1
    scores = torch.special.ndtri((ranks - 0.375) / (chains * samples + 0.25))
    return scores.reshape(chains, samples, -1)


def bulk_ess(draws: torch.Tensor) -> float:
    """The smallest bulk ESS over the coordinates of draws (chains, samples, ...)."""
    ess = effective_sample_size(rank_normalize(draws.double()), chain_dim=0, sample_dim=1)
    return float(torch.nan_to_num(ess, nan=0.0).clamp(min=0).min())


def figures(name, draws, seconds, batched: BatchedPotential, points, leapfrog, extra=None) -> dict:
    predictions = batched.predictions(draws, points)
    weights, function = bulk_ess(draws), bulk_ess(predictions)
    ess = min(weights, function)
    entry = {"chains": draws.shape[0], "seconds": round(seconds, 2), "ess_weights": round(weights, 1),
             "ess_predictions": round(function, 1), "ess": round(ess, 1), "ess_per_s": round(ess / seconds, 3),
             "leapfrog": round(leapfrog, 1), **(extra or {})}
    print(f"{name}: {seconds:.1f} s, bulk ESS {ess:.0f} (weights {weights:.0f}, predictions {function:.0f}), "
          f"{entry['ess_per_s']:.2f} ESS/s", flush=True)
    return entry


# --------------------------------------------------------------------------- main


def measure(args) -> dict:
    x, y, points, model = build_problem(args)
    flat = FlatPotential(model, x, y)
    batched = BatchedPotential(flat)
    starts = chain_starts(flat, None, max(args.chains, args.stock_chains), args.init_jitter, args.seed)
    result = {}
    with pyro.validation_enabled(False):
        if "stock" in args.samplers:
            tick = time.perf_counter()
            draws = run_stock(model, x, y, starts[:args.stock_chains], args)
            result["stock"] = figures("stock", draws, time.perf_counter() - tick, batched, points, math.nan)
        if "flat" in args.samplers:
            tick = time.perf_counter()
            draws, diagnostics = run_sample_posterior(model, x, y, args, "pyro", args.chains, points)
            result["flat"] = figures("flat", draws, time.perf_counter() - tick, batched, points,
                                     diagnostics["leapfrog_steps"])
        if "batched" in args.samplers:
            for chains in args.batched_chains:
                tick = time.perf_counter()
                draws, diagnostics = run_sample_posterior(model, x, y, args, "batched", chains, points)
                seconds = time.perf_counter() - tick
                result[f"batched_{chains}"] = figures(
                    f"batched C={chains}", draws, seconds, batched, points, diagnostics["leapfrog_steps"],
                    {"leaves": diagnostics["leaves"], "compile": diagnostics["compile"],
                     "us_per_leaf": round(seconds / diagnostics["leaves"] * 1e6, 1),
                     "prediction_r_hat_max": round(diagnostics["prediction_r_hat_max"], 4),
                     "divergences": diagnostics["divergences"]})
    if "numpyro" in args.samplers:
        sampler = NumPyroSampler(flat, x, y, args)
        reference = float(flat({"weights": starts[0].clone()}))
        if not math.isclose(sampler.potential(starts[0]), reference, rel_tol=1e-4):
            raise RuntimeError(f"NumPyro potential {sampler.potential(starts[0])} != {reference}: not the same model")
        for method in sampler.methods(args.chains):
            tick = time.perf_counter()
            draws, steps = sampler.run(starts[:args.chains], method, args.warmup, args.samples)
            seconds = time.perf_counter() - tick
            tick = time.perf_counter()
            sampler.run(starts[:args.chains], method, 1, 1)
            compile_seconds = time.perf_counter() - tick
            entry = figures(f"numpyro {method}", draws, seconds, batched, points, steps,
                            {"compile_seconds": round(compile_seconds, 2)})
            if seconds > compile_seconds:
                entry["ess_per_s_excl_compile"] = round(entry["ess"] / (seconds - compile_seconds), 3)
            result[f"numpyro_{method}"] = entry
        best = max((k for k in result if k.startswith("numpyro_")), key=lambda k: result[k]["ess_per_s"])
        result["numpyro"] = dict(result[best], method=best.removeprefix("numpyro_"))
        for chains in args.numpyro_chains:  # the same chain counts as the batched sampler, all in one XLA pass
            if chains != args.chains:
                tick = time.perf_counter()
                draws, steps = sampler.run(chain_starts(flat, None, chains, args.init_jitter, args.seed), "vectorized",
                                           args.warmup, args.samples)
                result[f"numpyro_vectorized_{chains}"] = figures(f"numpyro vectorized C={chains}", draws,
                                                                 time.perf_counter() - tick, batched, points, steps)

    def ratio(a, b, key="ess_per_s"):
        if a in result and b in result and result[b].get(key):
            return round(result[a]["ess_per_s"] / result[b][key], 2)
        return None

    runs = [k for k in result if k.startswith("batched_")]
    for name in ["flat", *runs]:
        result[f"{name}_vs_stock"] = ratio(name, "stock")
        result[f"{name}_vs_numpyro"] = ratio(name, "numpyro")
        result[f"{name}_vs_numpyro_excl_compile"] = ratio(name, "numpyro", "ess_per_s_excl_compile")
    for name in runs:  # against NumPyro with as many chains (vectorized; at --chains its best method)
        chains = result[name]["chains"]
        result[f"{name}_vs_numpyro_same_chains"] = ratio(name, "numpyro" if chains == args.chains
                                                         else f"numpyro_vectorized_{chains}")
    if runs:
        best = max(runs, key=lambda k: result[k]["ess_per_s"])
        result["batched_best"] = best
        if "stock" in result:
            result["goal_batched_10x_stock"] = result[f"{best}_vs_stock"] >= 10
        if "numpyro" in result:
            result["goal_batched_at_least_numpyro"] = result[f"{best}_vs_numpyro"] >= 1
            same = [result[f"{k}_vs_numpyro_same_chains"] for k in runs]
            if all(value is not None for value in same):
                result["goal_batched_at_least_numpyro_same_chains"] = min(same) >= 1
    result["config"] = {
        "problem": args.problem, "network": "-".join(map(str, (x.shape[1],) + (args.width,) * args.depth
                                                          + (2 if args.problem == "two-moons" else 1,))),
        "noise": args.noise if args.problem == "boston" else None,
        "weights": flat.size, "train_size": len(x), "warmup": args.warmup, "samples": args.samples,
        "chains": args.chains, "stock_chains": args.stock_chains, "batched_chains": list(args.batched_chains),
        "numpyro_chains": list(args.numpyro_chains),
        "compile": args.compile,
        "max_tree_depth": args.max_tree_depth, "target_accept": args.target_accept, "points": args.points,
        "threads": args.threads, "seed": args.seed, "versions": _versions()}
    return result


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "pyro": pyro.__version__}
    try:
        import jax
        import numpyro

        out.update(jax=jax.__version__, numpyro=numpyro.__version__)
    except ImportError:
        pass
    return out


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    config = result["config"]
    table = Table(title=f"NUTS, {config['problem']} ({config['train_size']} points), MLP {config['network']} "
                        f"({config['weights']} weights), ({config['warmup']} warm-up + {config['samples']} draws) "
                        f"per chain, {config['threads']} threads")
    for column in ("sampler", "chains", "seconds", "bulk ESS", "weights", "predictions", "ESS/s", "vs stock",
                   "vs NumPyro", "vs NumPyro, same C", "leapfrog/draw", "µs/leaf"):
        table.add_column(column, justify="right")
    for name, r in result.items():
        if isinstance(r, dict) and "ess_per_s" in r:
            label = f"{name} ({r['method']})" if "method" in r else name
            table.add_row(label, str(r["chains"]), f"{r['seconds']:.1f}", f"{r['ess']:.0f}", f"{r['ess_weights']:.0f}",
                          f"{r['ess_predictions']:.0f}", f"{r['ess_per_s']:.2f}",
                          str(result.get(f"{name}_vs_stock") or ""), str(result.get(f"{name}_vs_numpyro") or ""),
                          str(result.get(f"{name}_vs_numpyro_same_chains") or ""),
                          f"{r['leapfrog']:.0f}" if math.isfinite(r["leapfrog"]) else "",
                          str(r.get("us_per_leaf", "")))
    Console(width=200).print(table)


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"chain counts must be positive integers, got {text!r}")
    return values


def _samplers(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in SAMPLERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown sampler(s) {unknown}; choose from {', '.join(SAMPLERS)}")
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=tuple(PROBLEMS), default="two-moons")
    parser.add_argument("--width", type=int, default=None, help="hidden units per layer (two-moons 16, else 50)")
    parser.add_argument("--depth", type=int, default=None, help="hidden layers (two-moons 2, else 1)")
    parser.add_argument("--train-size", type=int, default=None, help="training points (two-moons 50, cubic 20)")
    parser.add_argument("--noise", type=float, default=0.3, help="boston: the likelihood's noise, standardised")
    parser.add_argument("--points", type=int, default=50, help="test inputs where predictions are compared")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up (adaptation) iterations per chain")
    parser.add_argument("--samples", type=int, default=200, help="draws per chain")
    parser.add_argument("--chains", type=int, default=4, help="chains of flat and NumPyro")
    parser.add_argument("--stock-chains", type=int, default=1, help="chains of stock (one after another)")
    parser.add_argument("--batched-chains", type=_ints, default=(1, 4, 16, 64), help="chain counts of batched")
    parser.add_argument("--numpyro-chains", type=_ints, default=None,
                        help="chain counts of NumPyro besides --chains (vectorized); default: --batched-chains")
    parser.add_argument("--compile", default="auto", choices=("auto", "none", "trace", "inductor"),
                        help="how the batched sampler runs a leapfrog step")
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--init-jitter", type=float, default=0.01, help="sd of the noise added to the initial weights")
    parser.add_argument("--seed", type=int, default=0, help="network initialisation and chains")
    parser.add_argument("--device", default="cpu",
                        help="where sample_posterior's samplers (batched, flat) run; stock and NumPyro: the CPU")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=THREADS_DEFAULT, help="torch threads and XLA host devices")
    parser.add_argument("--samplers", type=_samplers, default=SAMPLERS,
                        help=f"comma-separated, from {','.join(SAMPLERS)} (numpyro needs the bench extra)")
    args = parser.parse_args()
    if args.numpyro_chains is None:
        args.numpyro_chains = args.batched_chains
    for name, value in zip(("width", "depth", "train_size"), PROBLEMS[args.problem]):
        if getattr(args, name) is None:
            setattr(args, name, value)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    result = measure(args)
    print_table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

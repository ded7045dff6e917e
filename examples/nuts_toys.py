"""NUTS against variational guides on the toy problems: two moons, y = x³ (with a depth study), the sinusoid.

NUTS (``pyrobnn.infer.mcmc.sample_posterior``) samples the exact posterior of a Bayesian MLP; the guides
are trained by ``pyrobnn.infer.svi.fit`` on the same model (same network, prior and likelihood) and the
same data, and every predictive is compared with NUTS's (SPEC section 6):

- ``two_moons``: 1000 points, 50 for training and 950 for testing, inputs standardised with the training
  mean and std; a 2-50-50-2 ReLU MLP with a categorical likelihood. Metrics: test log-likelihood per
  example, accuracy, ECE, and the mean KL(NUTS || method) of the predictive class probabilities on a
  100 x 100 grid over [-2, 3] x [-1.5, 2]. ``two_moons.png``: decision-boundary maps (predictive
  p(class 1), top; epistemic uncertainty = mutual information, bottom), NUTS and each method side by side.
- ``cubic``: y = x³ + N(0, 3²), x ~ U[-4, 4], 20 training points and 500 test points drawn the same
  way (``pyrobnn.data.cubic``); a 1-50-1 ReLU MLP. Inputs and targets are standardised with the
  training mean and std (x' = (x - m_x)/s_x, y' = (y - m_y)/s_y), so the Gaussian likelihood has the
  fixed noise 3/s_y, the true noise level in those units. Metrics are reported in the original units
  of y: test log-likelihood per example, RMSE, coverage of the 95 % band (mean ± 1.96 std) on the
  test points, and the mean 2-Wasserstein distance between the method's Gaussian predictive
  N(mean, std²) and NUTS's, W2² = (m1 - m2)² + (s1 - s2)², on 300 points of x ∈ [-6, 6]
  (interpolation and extrapolation). ``cubic.png``: predictive mean and 95 % band per method.
- ``cubic_depth``: the depth study on the same data: 1 to 5 hidden layers of 256 ReLU units (``--depths``,
  ``--depth-width``), NUTS against mean-field VI (BBB) at each depth, with the time per depth. The study
  runs last, and a depth whose estimated cost (the previous depth's, times the growth seen so far)
  does not fit the rest of ``--budget`` is cut, and the output says so. ``cubic_depth.png``.
- ``sinusoid``: y = x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε, ε ~ N(0, 0.02²), x ~ U[0, 0.5];
  500 points, 40 for training (``pyrobnn.data.sinusoid``); a 1-50-1 ReLU MLP, standardised as the
  cubic, Gaussian likelihood with the fixed noise 0.02/s_y (``--sinusoid-noise``). Same metrics, grid
  x ∈ [-0.5, 1.0]. ``sinusoid.png``. Note that 0.02 is the std of ε, not of y given x: ε also shifts
  the phase of the sines, so y - f(x) has std ≈ 0.02 |1 + 0.6π cos 2πx + 1.2π cos 4πx| (0.01 to 0.13;
  0.058 over the 500 points). The likelihood is too narrow, the posterior sharp and curved: NUTS's
  trees saturate and its chains do not mix within the budget (with ``--sinusoid-noise 0.058`` they do).

The model: every weight and bias is Bayesian, with the fan-in-scaled Gaussian prior N(0, c²/fan_in)
on weights (``GaussianPrior(scale=c, fan_in=True)``; c = √2, He et al. 2015, ``--prior-scale``: the prior
function keeps its scale through ReLU layers, which N(0, 1) does not with 256 units per layer) and N(0, 1)
on biases (``--bias-scale``).
Two moons take c = 3 (``--moons-prior-scale``): its labels are nearly noise-free, and the posterior
predictive is only as confident as the prior lets the logits be (NUTS's test log-likelihood,
150 + 150 draws: -0.28 at c = √2, -0.19 at c = 2, -0.09 at c = 3; larger c costs longer trajectories).
NUTS: 2 chains sampled together by the batched sampler (``--sampler``: one pass of the network per leapfrog
step for both, ``pyrobnn.infer.batched_nuts``; ``--sampler pyro`` runs Pyro's NUTS, one chain after the other),
each from the MAP estimate of the same posterior (Adam on the potential, ``--map-steps``) plus N(0, 0.01²)
jitter, step size and diagonal mass matrix adapted during warm-up; full batch; at most 2^8 - 1 leapfrog steps
per draw. R-hat is the split R-hat of every single weight, reported as the max over all weights, and of every
prediction at the training inputs (function space, ``R-hat f``); ESS the min bulk ESS. Chains that start in one
mode measure mixing within it: the posterior of an MLP has many modes (permutations of hidden units at least)
that no chain visits.

The methods, each guide with its own ``name=`` in Pyro's parameter store, trained full batch with
Adam on the exact ELBO (β ramped linearly from 0 to 1 over the first ``--anneal`` steps, then 1; ``--compile``
as ``pyrobnn train --compile``):

- ``bbb``: Bayes by Backprop (Blundell et al. 2015), ``NormalGuide``, σ = softplus(ρ);
- ``dense``: variational dense (Graves 2011), ``NormalGuide(parameterization="log_variance")``;
- ``additive``: additive (sparse) variational dropout (Molchanov et al. 2017), ``AdditiveDropoutGuide``;
- ``multiplicative``: variational dropout (Kingma et al. 2015), ``MultiplicativeDropoutGuide``, α ≤ 1;
- ``vdp``: VDP++ (moment propagation, ``estimator="vdp"``; ``NormalGuide``, one σ per weight),
  predictions by ``pyrobnn.infer.predict.predict_moments`` (its epistemic map: the mutual information of
  Gaussian logits N(mean, var) with the propagated moments, 200 draws). Its objective is not this
  model's ELBO: classification scores one-hot targets by Gaussians on the softmax moments (VDP++
  eq. 11), regression by log N(y; mean, var + σ²), where the exact expected log-likelihood has
  log N(y; mean, σ²) - var / 2σ²; and its predictive probabilities are softmax(mean logits) (the
  first-order softmax rule), as sharp as a point estimate;
- ``mcdropout``: MC dropout (Gal & Ghahramani 2016), ``DropoutGuide``: point-estimate weights with the
  inputs of every hidden layer dropped at rate ``--dropout`` (not the network's input), trained on NUTS's
  model (the Gaussian prior is its weight decay);
- ``ibnn``: the implicit BNN (Trinh, Kaski & Heinonen 2020), ``NodePrior`` N(1, s²) on every layer's inputs
  with point-estimate weights and a ``MixtureNodeGuide`` of ``--components`` K: another model than NUTS's
  (its weights carry no prior), compared by its predictive only;
- ``deterministic``: the same MLP by maximum likelihood (no prior), through the same loop.

Priors of the dropout guides (``--vd-prior auto``): ``multiplicative`` is trained on NUTS's model (the
Gaussian prior): its family N(θ, αθ²) differs from BBB's and it is compared with NUTS on equal terms.
``additive`` is trained with ``LogUniformPrior``, the prior it was designed for, because under the
Gaussian prior it *is* variational dense (the same family N(θ, σ²), the same parameters θ and log σ²,
the same analytic KL; its rows then equal ``dense``'s up to optimisation noise). The log-uniform prior is
improper, NUTS cannot sample it, so ``additive`` is another model's posterior: its KL / W2 to NUTS is
the distance between two models' predictives, and the checks do not hold it to NUTS's test
log-likelihood (nor the deterministic MLP, which has no prior). ``--vd-prior gaussian`` or
``log-uniform`` sets both. The sampling guides use local reparameterization (``--estimator``) with
``--particles`` samples per step.

Threads: the networks are tiny, so every operation is dominated by its fixed cost; on 2 shared
cores two intra-op threads per process make a NUTS gradient 50-70x slower (60 ms instead of 0.9 ms
for the 2-50-50-2 net) when another process is busy. ``--threads 1`` is the default.

    python examples/nuts_toys.py                     # everything, about 8.5 min on 2 CPU cores (depths 1-4)
    python examples/nuts_toys.py --problems cubic --depths 1 2 3

Prints a table per problem, the depth study, the checks (R-hat <= 1.05, divergences <= 1 %, NUTS's test
log-likelihood against each guide's), the total time (from after the imports), writes the PNGs to ``--out``, and
prints as its last line one JSON object ``{"two_moons": {"nuts": {"test_ll", "accuracy", "ece", "r_hat_max", "ess_min",
"divergence_rate", "seconds", ...}, "bbb": {"test_ll", "accuracy", "ece", "kl_to_nuts", "seconds"}, ...},
"cubic": {"nuts": {"test_ll", "rmse", "coverage95", ...}, "bbb": {..., "w2_to_nuts"}, ...},
"sinusoid": {...}, "cubic_depth": {"1": {"nuts": {...}, "bbb": {...}}, ..., "cut": ...},
"total_seconds": ...}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pyro
import torch
from pyro.ops.stats import effective_sample_size
from rich.console import Console
from rich.table import Table

from pyrobnn import (
    AdditiveDropoutGuide,
    BayesianNetwork,
    Categorical,
    DropoutGuide,
    Gaussian,
    GaussianPrior,
    LogUniformPrior,
    MixtureNodeGuide,
    MultiplicativeDropoutGuide,
    NodePrior,
    NormalGuide,
    Prior,
)
from pyrobnn.analysis.metrics import classification_metrics, regression_metrics
from pyrobnn.data import cubic, sinusoid, two_moons
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.mcmc import sample_posterior
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.predict import predict, predict_moments
from pyrobnn.infer.recording import COMPILE_MODES
from pyrobnn.infer.schedules import Constant, LinearWarmup
from pyrobnn.infer.svi import fit
from pyrobnn.model.likelihoods import uncertainty
from pyrobnn.networks import MLP

PROBLEMS = ("two_moons", "cubic", "sinusoid")
METHODS = ("bbb", "dense", "additive", "multiplicative", "mcdropout", "ibnn", "vdp", "deterministic")
Z95 = 1.959964
console = Console(width=160)
START = time.perf_counter()  # after the imports (torch and pyro: about 2 s)


@dataclass
class Problem:
    """One toy problem, in the units the networks see (regression targets standardised)."""

    name: str
    task: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor  # original units
    grid: torch.Tensor  # model inputs where predictives are compared
    grid_raw: torch.Tensor  # the same points in original units (plots)
    hidden: tuple[int, ...]
    prior_scale: float  # weights ~ N(0, prior_scale² / fan_in)
    noise: float = 0.0  # regression: noise std in original units
    x_shift: torch.Tensor | float = 0.0
    x_scale: torch.Tensor | float = 1.0
    y_shift: float = 0.0
    y_scale: float = 1.0

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """Inputs in their original units."""
        return x * self.x_scale + self.x_shift

    def likelihood(self):
        if self.task == "classification":
            return Categorical(vdp_objective="gaussian")
        return Gaussian(self.noise / self.y_scale)


def standardised(name, task, x_train, y_train, x_test, y_test, grid, hidden, prior_scale, noise=0.0) -> Problem:
    """Inputs standardised per feature with the training mean and std; regression targets too."""
    mx, sx = x_train.mean(0), x_train.std(0)
    my, sy = (float(y_train.mean()), float(y_train.std())) if task == "regression" else (0.0, 1.0)
    y_model = (y_train - my) / sy if task == "regression" else y_train
    return Problem(name, task, (x_train - mx) / sx, y_model, (x_test - mx) / sx, y_test, (grid - mx) / sx, grid,
                   hidden, prior_scale, noise, mx, sx, my, sy)


def make_problem(name: str, args) -> Problem:
    if name == "two_moons":
        d = two_moons(1000, 50, seed=args.seed)
        g1, g2 = torch.meshgrid(torch.linspace(-2.0, 3.0, 100), torch.linspace(-1.5, 2.0, 100), indexing="xy")
        grid = torch.stack([g1.reshape(-1), g2.reshape(-1)], -1)
        return standardised(name, "classification", d.x_train, d.y_train, d.x_test, d.y_test, grid,
                            tuple(args.moons_hidden), args.moons_prior_scale)
    if name == "cubic":
        d = cubic(n_train=args.cubic_train + args.cubic_test, n_test=1, seed=args.seed)  # all x ~ U[-4, 4]
        x, y = d.x_train, d.y_train
        n = args.cubic_train
        return standardised(name, "regression", x[:n], y[:n], x[n:], y[n:], torch.linspace(-6, 6, 300)[:, None],
                            tuple(args.cubic_hidden), args.prior_scale, 3.0)
    d = sinusoid(500, 40, seed=args.seed)
    return standardised(name, "regression", d.x_train, d.y_train, d.x_test, d.y_test,
                        torch.linspace(-0.5, 1.0, 300)[:, None], tuple(args.sinusoid_hidden), args.prior_scale,
                        args.sinusoid_noise)


def true_curve(name: str, x: torch.Tensor) -> torch.Tensor:
    if name.startswith("cubic"):
        return x**3
    return x + 0.3 * torch.sin(2 * torch.pi * x) + 0.3 * torch.sin(4 * torch.pi * x)


# ----------------------------------------------------------------------------- methods


def log_uniform(method: str, args) -> bool:
    """Whether ``method`` is trained on the model with the log-uniform prior (another model than NUTS's)."""
    if method not in ("additive", "multiplicative"):
        return False
    return args.vd_prior == "log-uniform" or (args.vd_prior == "auto" and method == "additive")


def other_model(method: str, args) -> bool:
    """Whether ``method``'s posterior is of another model than NUTS's (log-uniform prior, node latents)."""
    return method == "ibnn" or log_uniform(method, args)


def prior_of(problem: Problem, method: str, args) -> Prior:
    if log_uniform(method, args):
        return LogUniformPrior()
    return GaussianPrior(0.0, problem.prior_scale, fan_in=True, bias_scale=args.bias_scale)


def build(problem: Problem, method: str, net, args, tag: str):
    """Model and guide of one method; the guide's parameters live under its own name ``tag``."""
    if method == "deterministic":
        model = BayesianNetwork(net, problem.likelihood(), deterministic=True)
        return model, NormalGuide(model, name=tag)
    if method == "ibnn":
        model = BayesianNetwork(net, problem.likelihood(), prior=NodePrior(args.node_scale))
        return model, MixtureNodeGuide(model, num_components=args.components, name=tag)
    model = BayesianNetwork(net, problem.likelihood(), prior=prior_of(problem, method, args))
    if method == "dense":
        return model, NormalGuide(model, init_rho=args.init_rho, parameterization="log_variance", name=tag)
    if method == "additive":
        return model, AdditiveDropoutGuide(model, init_log_sigma2=2 * math.log(math.log1p(math.exp(args.init_rho))),
                                           name=tag)
    if method == "multiplicative":
        return model, MultiplicativeDropoutGuide(model, init_log_alpha=-4.0, name=tag)
    if method == "mcdropout":
        first = model.sites()[0].name.rsplit(".", 1)[0]
        return model, DropoutGuide(model, rate={f"{first}.*": 0.0, "*": args.dropout}, name=tag)
    return model, NormalGuide(model, init_rho=args.init_rho, name=tag)  # bbb, vdp


def train_guide(problem: Problem, method: str, net, args, tag: str):
    model, guide = build(problem, method, copy.deepcopy(net), args, tag)
    bayesian = method != "deterministic"
    tick = time.perf_counter()
    fit(model, guide, problem.x_train, problem.y_train, epochs=args.epochs, batch_size=len(problem.x_train),
        optimizer=Optim(lr=args.lr), beta=LinearWarmup(0, args.anneal) if bayesian else Constant(0.0),
        elbo=MeanFieldELBO(args.particles if bayesian and method != "vdp" else 1, vectorize_particles=True,
                           estimator="vdp" if method == "vdp" else args.estimator if bayesian else "sample"),
        seed=args.seed, progress=False, device="cpu", compile=args.compile)
    return model, guide, time.perf_counter() - tick


def run_nuts(problem: Problem, net, args, *, samples, warmup, chains, tree_depth):
    model = BayesianNetwork(copy.deepcopy(net), problem.likelihood(), prior=prior_of(problem, "nuts", args))
    tick = time.perf_counter()
    result = sample_posterior(model, problem.x_train, problem.y_train, num_samples=samples, warmup=warmup,
                              num_chains=chains, seed=args.seed, map_steps=args.map_steps,
                              target_accept=args.target_accept,
                              max_tree_depth=tree_depth, sampler=args.sampler, compile=args.compile)
    return model, result, time.perf_counter() - tick


@torch.no_grad()
def predictive(problem: Problem, method: str, model, guide, x: torch.Tensor, args) -> dict[str, torch.Tensor]:
    """Classification: ``probs`` and ``epistemic`` (mutual information); regression: ``mean`` and ``std``
    of the Gaussian predictive, in the original units of y."""
    pyro.set_rng_seed(args.seed)
    if method == "vdp":
        out = predict_moments(model, guide, x, batch_size=len(x))
        if problem.task == "classification":
            logits = out["mean"] + out["var"].sqrt() * torch.randn((200,) + out["mean"].shape)
            return {"probs": out["probs"], "epistemic": uncertainty(logits.softmax(-1))["epistemic"]}
        observed = model.likelihood.moment_distribution(Moments(out["mean"], out["var"]))
        pred = {"mean": observed.mean, "std": observed.stddev}
    else:
        samples = len(guide) if method == "nuts" else 1 if method == "deterministic" else args.pred_samples
        pred = predict(model, guide, x, num_samples=samples, batch_size=len(x))
        if problem.task == "classification":
            return {"probs": pred["probs"], "epistemic": pred["epistemic"]}
    return {"mean": pred["mean"] * problem.y_scale + problem.y_shift, "std": pred["std"] * problem.y_scale}


def scores(problem: Problem, test: dict, grid: dict, reference: dict | None) -> dict[str, float]:
    """Test metrics of one predictive and its distance to NUTS's on the grid."""
    if problem.task == "classification":
        m = classification_metrics(test["probs"], problem.y_test)
        out = {"test_ll": -m["nll"], "accuracy": m["accuracy"], "ece": m["ece"]}
        if reference is not None:
            p, q = reference["probs"].clamp_min(1e-12), grid["probs"].clamp_min(1e-12)
            out["kl_to_nuts"] = float((p * (p.log() - q.log())).sum(-1).mean())
        return out
    m = regression_metrics(test["mean"], test["std"], problem.y_test)
    inside = ((problem.y_test - test["mean"]).abs() <= Z95 * test["std"]).float().mean()
    out = {"test_ll": -m["nll"], "rmse": m["rmse"], "coverage95": float(inside)}
    if reference is not None:
        w2 = ((grid["mean"] - reference["mean"]).square() + (grid["std"] - reference["std"]).square()).sqrt()
        out["w2_to_nuts"] = float(w2.mean())
    return out


def ess_min(result) -> float:
    """The smallest bulk ESS over all weights. Pyro's estimator (and with it ``diagnostics["ess_min"]``)
    returns a negative or huge value for a weight whose draws are anti-correlated (the autocorrelation sum
    tau <= 0, an ESS above the number of draws); such values count as S log10 S, ArviZ's cap."""
    cap = len(result) * math.log10(len(result))
    worst = math.inf
    for value in result.draws.values():
        ess = effective_sample_size(value.reshape(value.shape[:2] + (-1,)).double(), chain_dim=0, sample_dim=1)
        worst = min(worst, float(torch.where((ess > 0) & (ess < cap), ess, cap).min()))
    return worst


def nuts_summary(result, seconds: float) -> dict[str, float]:
    d = result.diagnostics
    return {"r_hat_max": d["r_hat_max"], "ess_min": ess_min(result), "prediction_r_hat_max": d["prediction_r_hat_max"],
            "prediction_ess_min": d["prediction_ess_min"], "divergences": d["divergences"],
            "divergence_rate": d["divergence_rate"], "leapfrog_steps": d["leapfrog_steps"],
            "num_weights": d["num_weights"], "sampler": d["sampler"], "compile": d["compile"], "seconds": seconds}


def run_problem(problem: Problem, args) -> tuple[dict, dict]:
    """NUTS and every method on one problem: ``({method: metrics}, {method: grid predictive})``."""
    pyro.set_rng_seed(args.seed)  # every method starts from the same initial network
    in_features = problem.x_train.shape[1]
    net = MLP(in_features, problem.hidden, 2 if problem.task == "classification" else 1)
    model, result, seconds = run_nuts(problem, net, args, samples=args.samples, warmup=args.warmup,
                                      chains=args.chains, tree_depth=args.max_tree_depth)
    posterior = result.guide()
    grids = {"nuts": predictive(problem, "nuts", model, posterior, problem.grid, args)}
    metrics = {"nuts": scores(problem, predictive(problem, "nuts", model, posterior, problem.x_test, args),
                              grids["nuts"], None) | nuts_summary(result, seconds)}
    d = result.diagnostics
    console.print(f"{problem.name} nuts ({d['sampler']}, {d['compile']}): {seconds:.1f} s, {d['num_weights']} "
                  f"weights, R-hat max {d['r_hat_max']:.3f} (predictions {d['prediction_r_hat_max']:.3f}), "
                  f"ESS min {metrics['nuts']['ess_min']:.0f}, {d['divergences']} divergences, "
                  f"{d['leapfrog_steps']:.0f} leapfrog steps/draw, "
                  f"step size {[round(c['step_size'], 4) for c in d['chains']]}")
    for warning in d["warnings"]:
        console.print(f"[yellow]{problem.name} nuts: {warning}")
    for method in args.methods:
        model, guide, seconds = train_guide(problem, method, net, args, f"{problem.name}_{method}")
        grids[method] = predictive(problem, method, model, guide, problem.grid, args)
        test = predictive(problem, method, model, guide, problem.x_test, args)
        metrics[method] = scores(problem, test, grids[method], grids["nuts"]) | {"seconds": seconds}
        console.print(f"{problem.name} {method}: {seconds:.1f} s, test LL {metrics[method]['test_ll']:.3f}")
    return metrics, grids


# ----------------------------------------------------------------------------- depth study


def run_depth_study(problem: Problem, args, first_estimate: float) -> tuple[dict, dict]:
    """NUTS and BBB on 1..5 hidden layers of ``--depth-width`` units, as long as the budget allows.
    ``first_estimate``: the expected cost of the first depth (seconds)."""
    results, grids, costs = {}, {}, []
    for depth in args.depths:
        left = args.budget - (time.perf_counter() - START)
        if costs:
            growth = max(1.2, costs[-1] / costs[-2]) if len(costs) > 1 else 3.0
            estimate = costs[-1] * growth
        else:
            estimate = first_estimate
        if estimate > left:
            cut = [d for d in args.depths if d >= depth]
            seen = f"the previous depth took {costs[-1]:.0f} s" if costs else "estimated from the 1-50-1 NUTS run"
            results["cut"] = (f"depths {cut} cut: depth {depth} would take about {estimate:.0f} s ({seen}), "
                              f"{max(left, 0):.0f} s of the {args.budget:.0f} s budget left")
            console.print(f"[yellow]cubic depth study: {results['cut']}")
            break
        tick = time.perf_counter()
        pyro.set_rng_seed(args.seed)
        net = MLP(1, (args.depth_width,) * depth, 1)
        model, result, nuts_seconds = run_nuts(problem, net, args, samples=args.depth_samples,
                                               warmup=args.depth_warmup, chains=args.chains,
                                               tree_depth=args.depth_tree_depth)
        posterior = result.guide()
        reference = predictive(problem, "nuts", model, posterior, problem.grid, args)
        row = {"nuts": scores(problem, predictive(problem, "nuts", model, posterior, problem.x_test, args), reference,
                              None) | nuts_summary(result, nuts_seconds)}
        del posterior, result
        model, guide, bbb_seconds = train_guide(problem, "bbb", net, args, f"cubic_depth{depth}_bbb")
        bbb = predictive(problem, "bbb", model, guide, problem.grid, args)
        row["bbb"] = scores(problem, predictive(problem, "bbb", model, guide, problem.x_test, args), bbb,
                            reference) | {"seconds": bbb_seconds}
        costs.append(time.perf_counter() - tick)
        row["seconds"] = costs[-1]
        results[str(depth)], grids[depth] = row, {"nuts": reference, "bbb": bbb}
        n = row["nuts"]
        console.print(f"cubic depth {depth}: {costs[-1]:.1f} s (NUTS {nuts_seconds:.1f} s, {n['num_weights']} weights, "
                      f"{n['leapfrog_steps']:.0f} leapfrog steps/draw, R-hat max {n['r_hat_max']:.3f}, "
                      f"ESS min {n['ess_min']:.0f}; BBB {bbb_seconds:.1f} s)")
    return results, grids


# ----------------------------------------------------------------------------- output


def table(problem: Problem, metrics: dict, args) -> Table:
    classification = problem.task == "classification"
    if classification:
        title = f"two moons, 50 train / 950 test, 2-{'-'.join(map(str, problem.hidden))}-2"
        columns = ("test LL", "accuracy %", "ECE", "KL(NUTS‖·)")
        keys = ("test_ll", "accuracy", "ece", "kl_to_nuts")
    else:
        title = (f"{problem.name}, {len(problem.x_train)} train / {len(problem.y_test)} test, "
                 f"1-{'-'.join(map(str, problem.hidden))}-1, noise σ {problem.noise:g} (original units)")
        columns = ("test LL", "RMSE", "95 % coverage", "W2 to NUTS")
        keys = ("test_ll", "rmse", "coverage95", "w2_to_nuts")
    title += (f"; NUTS {args.chains} x ({args.warmup} warm-up + {args.samples}), tree depth <= {args.max_tree_depth}, "
              f"prior N(0, {problem.prior_scale:.3g}²/fan_in)")
    t = Table(title=title)
    for column in ("method",) + columns + ("R-hat max", "R-hat f", "ESS min", "divergent", "seconds"):
        t.add_column(column, justify="right")
    for method, m in metrics.items():
        cells = []
        for key in keys:
            value = m.get(key)
            cells.append("" if value is None else f"{100 * value:.1f}" if key == "accuracy" else f"{value:.4g}")
        nuts = method == "nuts"
        cells += [f"{m['r_hat_max']:.3f}" if nuts else "", f"{m['prediction_r_hat_max']:.3f}" if nuts else "",
                  f"{m['ess_min']:.0f}" if nuts else "",
                  f"{m['divergences']} ({100 * m['divergence_rate']:.1f} %)" if nuts else "", f"{m['seconds']:.1f}"]
        label = f"{method} (log-uniform prior)" if log_uniform(method, args) else \
            "ibnn (node prior)" if method == "ibnn" else "deterministic (ML)" if method == "deterministic" else method
        t.add_row(label, *cells)
    return t


def depth_table(results: dict, args) -> Table:
    t = Table(title=f"y = x³, depth study: hidden layers of {args.depth_width} ReLU units, NUTS "
                    f"({args.chains} x ({args.depth_warmup} + {args.depth_samples}), tree depth <= "
                    f"{args.depth_tree_depth}) vs BBB")
    for column in ("depth", "weights", "NUTS s", "leapfrog/draw", "R-hat max", "ESS min", "divergent",
                   "NUTS test LL", "BBB test LL", "NUTS cover", "BBB cover", "BBB W2", "BBB s", "depth s"):
        t.add_column(column, justify="right")
    for depth, row in results.items():
        if depth == "cut":
            continue
        n, b = row["nuts"], row["bbb"]
        t.add_row(depth, str(n["num_weights"]), f"{n['seconds']:.1f}", f"{n['leapfrog_steps']:.0f}",
                  f"{n['r_hat_max']:.3f}", f"{n['ess_min']:.0f}", f"{100 * n['divergence_rate']:.1f} %",
                  f"{n['test_ll']:.3f}", f"{b['test_ll']:.3f}", f"{n['coverage95']:.2f}", f"{b['coverage95']:.2f}",
                  f"{b['w2_to_nuts']:.2f}", f"{b['seconds']:.1f}", f"{row['seconds']:.1f}")
    return t


def checks(results: dict, args) -> list[str]:
    """The acceptance checks, one line each (PASS/FAIL with the figures)."""
    lines = []
    for name, metrics in results.items():
        if name == "cubic_depth":
            rows = {f"cubic depth {d}": r["nuts"] for d, r in metrics.items() if d != "cut"}
        else:
            rows = {name: metrics["nuts"]}
        for label, n in rows.items():
            lines.append(f"{'PASS' if n['r_hat_max'] <= 1.05 else 'FAIL'} {label}: R-hat max {n['r_hat_max']:.3f} "
                         "(<= 1.05)")
            lines.append(f"{'PASS' if n['divergence_rate'] <= 0.01 else 'FAIL'} {label}: "
                         f"{100 * n['divergence_rate']:.1f} % divergent (<= 1 %)")
        if name == "cubic_depth":
            continue
        nuts = metrics["nuts"]["test_ll"]
        same = [m for m in metrics if m not in ("nuts", "deterministic") and not other_model(m, args)]
        better = [m for m in same if metrics[m]["test_ll"] > nuts]
        verdict = "PASS" if not better else "FAIL" if name in ("two_moons", "cubic") else "note"
        lines.append(f"{verdict} {name}: NUTS test LL {nuts:.4f} " + (
            "below " + ", ".join(f"{m} {metrics[m]['test_ll']:.4f}" for m in better) if better
            else f">= every guide of the same model ({', '.join(same)})"))
        others = [m for m in metrics if m not in same + ["nuts"]]
        if others:
            lines.append(f"info {name}: other models: " + ", ".join(
                f"{m} {metrics[m]['test_ll']:.4f}" for m in others))
    return lines


def plot_classification(problem: Problem, grids: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3 * len(grids), 6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(grids), sharex=True, sharey=True, squeeze=False)
    side = int(round(len(problem.grid) ** 0.5))
    x_train, x_test = problem.raw(problem.x_train), problem.raw(problem.x_test)
    g1 = problem.grid_raw[:, 0].reshape(side, side).numpy()
    g2 = problem.grid_raw[:, 1].reshape(side, side).numpy()
    top = max(float(g["epistemic"].max()) for g in grids.values()) or 1.0
    for col, (method, g) in enumerate(grids.items()):
        mean = axes[0, col].contourf(g1, g2, g["probs"][:, 1].reshape(side, side).numpy(),
                                     levels=torch.linspace(0, 1, 21).numpy(), cmap="RdBu_r")
        epi = axes[1, col].contourf(g1, g2, g["epistemic"].clamp(0, top).reshape(side, side).numpy(),
                                    levels=torch.linspace(0, top, 21).numpy(), cmap="viridis")
        for row in range(2):
            ax = axes[row, col]
            ax.scatter(x_test[:, 0], x_test[:, 1], s=1, c="grey", alpha=0.3)
            ax.scatter(x_train[:, 0], x_train[:, 1], s=12, c=problem.y_train, cmap="bwr",
                       edgecolors="k", linewidths=0.5)
        axes[0, col].set_title(f"{method}: p(class 1)", fontsize=9)
        axes[1, col].set_title(f"{method}: " + ("MI of N(mean, var) logits" if method == "vdp" else "epistemic (MI)"),
                               fontsize=9)
    fig.colorbar(mean, ax=axes[0, -1])
    fig.colorbar(epi, ax=axes[1, -1])
    _save(fig, path)


def plot_regression(problem: Problem, grids: dict, path: Path, titles: dict | None = None, rows: int = 1) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = math.ceil(len(grids) / rows)
    fig = Figure(figsize=(3 * cols, 3.2 * rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).reshape(-1)
    x = problem.grid_raw[:, 0]
    x_train = problem.raw(problem.x_train)[:, 0]
    y_train = problem.y_train[:, 0] * problem.y_scale + problem.y_shift
    truth = true_curve(problem.name, x)
    span = float(truth.max() - truth.min())
    for ax, (key, g) in zip(axes, grids.items()):
        mean, std = g["mean"][:, 0], g["std"][:, 0]
        ax.fill_between(x.numpy(), (mean - Z95 * std).numpy(), (mean + Z95 * std).numpy(), alpha=0.3,
                        label="95 % band")
        ax.plot(x.numpy(), mean.numpy(), label="predictive mean")
        ax.plot(x.numpy(), truth.numpy(), "k--", linewidth=0.8, label="true f(x)")
        ax.scatter(x_train.numpy(), y_train.numpy(), s=10, c="k", zorder=3, label="train")
        ax.set_title(titles[key] if titles else key, fontsize=9)
        ax.set_ylim(float(truth.min()) - 0.15 * span, float(truth.max()) + 0.15 * span)
        ax.set_xlabel("x")
    for ax in axes[len(grids):]:
        ax.set_visible(False)
    axes[0].legend(loc="upper left", fontsize=7)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    console.print(f"wrote {path}")


def rounded(value):
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 5) if math.isfinite(value) else str(value)
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    group = parser.add_argument_group("NUTS")
    group.add_argument("--samples", type=int, default=200, help="draws per chain kept")
    group.add_argument("--warmup", type=int, default=200, help="warm-up (adaptation) steps per chain")
    group.add_argument("--chains", type=int, default=2)
    group.add_argument("--max-tree-depth", type=int, default=8, help="at most 2^depth - 1 leapfrog steps per draw")
    group.add_argument("--target-accept", type=float, default=0.8)
    group.add_argument("--sampler", default="auto", choices=["auto", "batched", "pyro"],
                       help="batched: both chains in one pass per leapfrog step; pyro: Pyro's NUTS, one chain after "
                            "the other")
    group.add_argument("--map-steps", type=int, default=2000, help="Adam steps to the MAP, where the chains start")
    group = parser.add_argument_group("model")
    group.add_argument("--moons-hidden", type=int, nargs="+", default=[50, 50])
    group.add_argument("--cubic-hidden", type=int, nargs="+", default=[50])
    group.add_argument("--sinusoid-hidden", type=int, nargs="+", default=[50])
    group.add_argument("--sinusoid-noise", type=float, default=0.02, help="the Gaussian likelihood's fixed noise std")
    group.add_argument("--cubic-train", type=int, default=20)
    group.add_argument("--cubic-test", type=int, default=500)
    group.add_argument("--prior-scale", type=float, default=math.sqrt(2.0),
                       help="regression: weights ~ N(0, scale²/fan_in)")
    group.add_argument("--moons-prior-scale", type=float, default=3.0, help="two moons: weights ~ N(0, scale²/fan_in)")
    group.add_argument("--bias-scale", type=float, default=1.0, help="biases ~ N(0, bias_scale²)")
    group = parser.add_argument_group("guides")
    group.add_argument("--epochs", type=int, default=2000, help="full-batch Adam steps per guide")
    group.add_argument("--anneal", type=int, default=500, help="steps over which β rises from 0 to 1")
    group.add_argument("--lr", type=float, default=1e-2)
    group.add_argument("--particles", type=int, default=4, help="posterior samples per step (sampling guides)")
    group.add_argument("--estimator", default="local", choices=["sample", "local", "flipout"])
    group.add_argument("--init-rho", type=float, default=-5.0, help="initial σ = softplus(ρ)")
    group.add_argument("--dropout", type=float, default=0.1, help="mcdropout: rate of every hidden layer's input")
    group.add_argument("--components", type=int, default=4, help="ibnn: K mixture components (divides --particles)")
    group.add_argument("--node-scale", type=float, default=0.5, help="ibnn: s of the node prior N(1, s²)")
    group.add_argument("--vd-prior", default="auto", choices=["auto", "gaussian", "log-uniform"],
                       help="prior of the variational-dropout guides' model (log-uniform: another model than "
                            "NUTS's); auto: log-uniform for additive, Gaussian for multiplicative")
    group.add_argument("--pred-samples", type=int, default=200, help="posterior samples per guide prediction")
    group.add_argument("--compile", default="auto", choices=COMPILE_MODES,
                       help="how each step (of the guides' fit and of NUTS's leapfrog) runs, as pyrobnn train "
                            "--compile: auto, none (eagerly), trace (recorded once, replayed), inductor")
    group = parser.add_argument_group("depth study (y = x³)")
    group.add_argument("--depths", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    group.add_argument("--depth-width", type=int, default=256)
    group.add_argument("--depth-samples", type=int, default=100)
    group.add_argument("--depth-warmup", type=int, default=100)
    group.add_argument("--depth-tree-depth", type=int, default=8)
    group = parser.add_argument_group("run")
    group.add_argument("--budget", type=float, default=780.0,
                       help="seconds for the whole run; depths of the depth study that would not fit are cut")
    group.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see the docstring)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--out", type=Path, default=Path("outputs/nuts_toys"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    results = {}
    for name in args.problems:
        problem = make_problem(name, args)
        tick = time.perf_counter()
        results[name], grids = run_problem(problem, args)
        console.print(table(problem, results[name], args))
        console.print(f"{name}: {time.perf_counter() - tick:.1f} s")
        if problem.task == "classification":
            plot_classification(problem, grids, args.out / f"{name}.png")
        else:
            plot_regression(problem, grids, args.out / f"{name}.png")
    if "cubic" in args.problems and args.depths:
        problem = make_problem("cubic", args)
        problem.name = "cubic_depth"
        seconds = results["cubic"]["nuts"]["seconds"] if "cubic" in results else 60.0
        first = 2.0 * seconds * (args.depth_samples + args.depth_warmup) / (args.samples + args.warmup)
        results["cubic_depth"], grids = run_depth_study(problem, args, first)
        console.print(depth_table(results["cubic_depth"], args))
        if grids:
            panels = {f"{m} {d}": g[m] for m in ("nuts", "bbb") for d, g in grids.items()}
            plot_regression(problem, panels, args.out / "cubic_depth.png",
                            {k: f"{k.split()[0]}, {k.split()[1]} x {args.depth_width}" for k in panels}, rows=2)
    for line in checks(results, args):
        console.print(line)
    results["total_seconds"] = time.perf_counter() - START
    console.print(f"total {results['total_seconds']:.1f} s ({results['total_seconds'] / 60:.1f} min, "
                  f"{args.threads} thread(s))")
    print(json.dumps(rounded(results)))


if __name__ == "__main__":
    main()

"""Your own Pyro model: a Bayesian network written the way Pyro's tutorials write one, under pyrobnn's guides,
estimators and NUTS, compared in one table.

The model is the README's, verbatim (:class:`pyrobnn.networks.PyroBNN`: ``PyroModule[nn.Linear]`` layers whose
weights and biases are ``PyroSample`` priors, a noise scale ``sigma ~ LogNormal(-1, 0.5)``, ``obs`` under
``pyro.plate("data", ...)``). pyrobnn reads it by tracing (:class:`pyrobnn.model.TracedModel`): no
``BayesianNetwork``, no change to the model. On the sinusoid of Blundell et al. (2015) (40 training points, 460 test
points, ``pyrobnn.data.toys.sinusoid``), targets standardised on the training points, it is trained by
``pyrobnn.fit`` with

- ``NormalGuide`` (Bayes by Backprop) under local reparameterization and under flipout;
- ``DropoutGuide`` (MC dropout, rate 0.05 on the hidden units) under local reparameterization (one mask per row);
- Pyro's own ``AutoNormal`` under local reparameterization (pyrobnn's estimator on Pyro's guide);

and sampled by the batched NUTS (``sample_posterior``, 4 chains, started at the MAP estimate). Every row is scored by
``evaluate`` on the test points in the original units: RMSE, the predictive's mean log-likelihood, and the mean
predictive standard deviation, with the run's seconds. The noise scale's posterior mean is its own column (the
guides' sigma is a mean-field Normal of log sigma; NUTS samples log sigma).

    python examples/pyro_model.py [--hidden 32] [--epochs 2000] [--nuts-samples 300] [--seed 0]

The last line is one JSON object with every row.
"""

from __future__ import annotations

import argparse
import json
import time

import pyro
from pyro.infer.autoguide import AutoNormal
from rich.console import Console
from rich.table import Table

from pyrobnn import DropoutGuide, NormalGuide, Optim, evaluate, fit, predict, sample_posterior
from pyrobnn.data.toys import sinusoid
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.networks import PyroBNN

METHODS = {
    "NormalGuide + local reparameterization": (lambda model: NormalGuide(model, init_rho=-4.0), "local"),
    "NormalGuide + flipout": (lambda model: NormalGuide(model, init_rho=-4.0), "flipout"),
    "DropoutGuide (MC dropout) + local": (lambda model: DropoutGuide(model, rate={"layer1.*": 0.0, "*": 0.05}),
                                          "local"),
    "AutoNormal (Pyro's) + local": (lambda model: AutoNormal(model, init_scale=0.01), "local"),
}


def noise_scale(model, posterior, x) -> float:
    """The posterior mean of sigma: the predictive's aleatoric standard deviation, which is sigma in every draw."""
    return float(predict(model, posterior, x[:1], num_samples=200)["aleatoric_std"].mean())


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2000, help="full-batch SVI steps per guide")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--nuts-samples", type=int, default=300, help="NUTS draws (and warm-up) per chain")
    parser.add_argument("--samples", type=int, default=200, help="predictive samples of each guide")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    data = sinusoid(seed=args.seed)
    x, x_test = data.x_train, data.x_test
    loc, scale = data.y_train.mean(), data.y_train.std()
    y, y_test = ((data.y_train - loc) / scale).squeeze(-1), ((data.y_test - loc) / scale).squeeze(-1)
    units = (loc, scale)
    rows = []

    def score(name, model, posterior, seconds, samples):
        metrics = evaluate(model, posterior, x_test, y_test, num_samples=samples, target_scale=units)
        std = float(predict(model, posterior, x_test, num_samples=samples)["std"].mean() * scale)
        rows.append({"method": name, "rmse": metrics["rmse"], "log_likelihood": metrics["log_likelihood"],
                     "predictive_std": std, "sigma": noise_scale(model, posterior, x) * float(scale),
                     "seconds": seconds})

    for name, (make_guide, estimator) in METHODS.items():
        pyro.clear_param_store()
        pyro.set_rng_seed(args.seed)
        model = PyroBNN(args.hidden)
        guide = make_guide(model)
        tick = time.perf_counter()
        fit(model, guide, x, y, epochs=args.epochs, batch_size=len(x), elbo=MeanFieldELBO(estimator=estimator),
            optimizer=Optim(lr=args.lr), seed=args.seed, progress=False)
        score(name, model, guide, time.perf_counter() - tick, args.samples)

    pyro.set_rng_seed(args.seed)
    model = PyroBNN(args.hidden)
    tick = time.perf_counter()
    result = sample_posterior(model, x, y, num_samples=args.nuts_samples, warmup=args.nuts_samples, num_chains=4,
                              seed=args.seed, map_steps=500)
    draws = result.guide()
    score(f"NUTS ({result.diagnostics['sampler']}, 4 chains, R-hat on predictions "
          f"{result.diagnostics['prediction_r_hat_max']:.3f})", model, draws, time.perf_counter() - tick, len(draws))

    table = Table(title=f"Your own Pyro model: 1-{args.hidden}-1 BNN on the sinusoid (40 training points), test set")
    for column in ("method", "RMSE", "log-lik.", "pred. std", "sigma", "seconds"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        table.add_row(row["method"], f"{row['rmse']:.4f}", f"{row['log_likelihood']:.3f}",
                      f"{row['predictive_std']:.4f}", f"{row['sigma']:.4f}", f"{row['seconds']:.1f}")
    Console().print(table)
    print(json.dumps({"hidden": args.hidden, "epochs": args.epochs, "nuts_samples": args.nuts_samples,
                      "seed": args.seed, "rows": rows}))
    return rows


if __name__ == "__main__":
    main()

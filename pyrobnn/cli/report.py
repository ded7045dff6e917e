"""What a person reads: one-line messages, readable numbers, the epoch line and rich tables."""

from __future__ import annotations

import contextlib
import math
import sys
import warnings

from rich.console import Console
from rich.table import Table

from pyrobnn.checks import one_line

__all__ = ["console", "say", "warn", "one_line_warnings", "error_line", "num", "percent", "epoch_line",
           "calibration_line", "metrics_table", "diagnostics_table", "draws_shape", "json_safe", "prior_name", "shown",
           "rate"]

console = Console(width=None if sys.stdout.isatty() else 200)
"""Tables go to stdout at the terminal's width, or 200 columns when the output is a file or a pipe (rich would
cut them at 80)."""


def say(text: str) -> None:
    """One line on stdout, never wrapped, no markup."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def error_line(message: str) -> None:
    """``error: <message>`` on one line of stderr."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """``warning: <message>`` on one line of stderr."""
    print(f"warning: {one_line(message)}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def one_line_warnings(categories: tuple[type[Warning], ...]):
    """Within it, a warning of ``categories`` (what the library says a person should read, e.g.
    :class:`~pyrobnn.networks.hf.PretrainedLoadWarning`) is shown as :func:`warn`'s one line; others as Python
    shows them."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, categories):
            warn(str(message))
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def num(value) -> str:
    """A readable number: 4 significant digits, no long exponents for tiny values."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    size = abs(value)
    if size < 1e-9:
        return "0"
    if size < 1e-3:
        return f"{value:.1e}"
    if size >= 1e5:
        return f"{value:.0f}"
    return f"{value:.4g}"


def percent(value: float) -> str:
    return f"{100 * value:.1f} %"


_VAL_NAMES = {"accuracy": "acc"}


_PERCENT_METRICS = ("accuracy", "ece")


def epoch_line(record: dict, epochs: int) -> str:
    """The line printed after each epoch, from a :func:`~pyrobnn.infer.svi.fit` record, e.g.
    ``epoch 3/10  loss 0.2312/example  nll 0.1/example  kl 1234 nats  beta 1 (mean)  lr 0.001
    sparsity 45.1 % (net.0 40.2 %, net.2 60.3 %)  val acc 97.1 %  12.3 s``."""
    parts = [f"epoch {record.get('epoch', '?')}/{epochs}"]
    for key, template in (("loss", "loss {}/example"), ("nll", "nll {}/example"), ("kl", "kl {} nats"),
                          ("beta", "beta {} (mean)"), ("lr", "lr {}")):
        if key in record:
            parts.append(template.format(num(record[key])))
    if "sparsity" in record:
        layers = record.get("layer_sparsity")
        detail = ""
        if isinstance(layers, dict) and layers:
            detail = " (" + ", ".join(f"{name.removesuffix('.weight')} {percent(v)}"
                                      for name, v in layers.items()) + ")"
        parts.append(f"sparsity {percent(record['sparsity'])}{detail}")
    for key, value in record.items():
        if key.startswith("val_"):
            metric = key[len("val_"):]
            shown = percent(value) if metric in _PERCENT_METRICS else num(value)
            parts.append(f"val {_VAL_NAMES.get(metric, metric)} {shown}")
    if "seconds" in record:
        parts.append(f"{record['seconds']:.1f} s")
    return "  ".join(parts)


def calibration_line(metrics: dict, rows: int, coverage: float) -> str:
    """The line a ``--calibrate`` run prints after its test report, e.g. ``calibrated on 500 held-out rows:
    temperature 1.31, nll 0.412 -> 0.371, ece 6.3 % -> 1.2 %; conformal sets at 90.0 %: coverage 90.4 %, 1.21
    classes per set``."""
    shown = [f"temperature {num(metrics['temperature'])}", f"nll {num(metrics['nll'])} -> "
             f"{num(metrics['nll_calibrated'])}"]
    if "ece_calibrated" in metrics:
        shown.append(f"ece {percent(metrics['ece'])} -> {percent(metrics['ece_calibrated'])}")
        size = f"{num(metrics['conformal_set_size'])} classes per set"
        kind = "sets"
    else:
        shown.append(f"log-likelihood {num(metrics['log_likelihood'])} -> {num(metrics['log_likelihood_calibrated'])}")
        size = f"mean width {num(metrics['conformal_width'])}"
        kind = "intervals"
    return (f"calibrated on {rows} held-out rows: {', '.join(shown)}; conformal {kind} at {percent(coverage)}: "
            f"coverage {percent(metrics['conformal_coverage'])}, {size}")


def metrics_table(title: str, rows: dict[str, dict[str, float]]) -> Table:
    """A rich table with one row per run and one column per metric (entries that are no number, such as the
    reliability bins or the out-of-distribution metrics of a test report, are left out)."""
    table = Table(title=title)
    columns = list(dict.fromkeys(k for metrics in rows.values() for k, v in metrics.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)))
    table.add_column("run")
    for column in columns:
        table.add_column(column, justify="right")
    for name, metrics in rows.items():
        table.add_row(name, *(f"{metrics[c]:.4f}" if c in metrics else "" for c in columns))
    return table


def draws_shape(draws: dict) -> str:
    chains, samples = next(iter(draws.values())).shape[:2]
    return f"{chains} chain{'s' if chains != 1 else ''} x {samples} draws"


def json_safe(value):
    """``value`` with every non-finite float (an undefined R-hat) as ``None``: strict JSON has no inf or nan."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def diagnostics_table(title: str, diagnostics: dict) -> Table:
    """A rich table of the NUTS diagnostics of :func:`~pyrobnn.infer.mcmc.sample_posterior`, one per row: the worst
    split R-hat and bulk ESS over all weights, divergences, each chain's adapted step size and mean acceptance
    probability (what ``--target-accept`` aims for),
    leapfrog steps per draw and seconds."""
    chains = diagnostics.get("chains", [])
    table = Table(title=title)
    table.add_column("diagnostic")
    table.add_column("value", justify="right")
    rows = (
        ("split R-hat, max (<= 1.05)", num(diagnostics["r_hat_max"])),
        ("bulk ESS, min", num(diagnostics["ess_min"])),
        ("divergences", f"{diagnostics['divergences']} ({percent(diagnostics['divergence_rate'])})"),
        ("step size per chain", ", ".join(num(c["step_size"]) for c in chains)),
        (f"mean acceptance probability per chain (target {diagnostics.get('target_accept', '?')})",
         ", ".join(f"{c['mean_accept_prob']:.3f}" for c in chains)),
        ("leapfrog steps per draw", num(diagnostics["leapfrog_steps"])),
        ("seconds", f"{diagnostics['seconds']:.1f}"),
    )
    for name, value in rows:
        table.add_row(name, value)
    return table


def prior_name(options) -> str:
    """The ``--prior`` of a run as its header line names it: ``gaussian (fan-in)`` with ``--prior.fan-in``."""
    return options.name + (" (fan-in)" if options.fan_in else "")


def shown(value) -> str:
    """An option's value as it is typed on the command line."""
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value))
    return "(none)" if value is None else str(value)


def rate(method, model, epochs: int) -> str:
    """The rate a run trains ``model`` at, as its header and a divergence name it: ``lr 0.05`` (the method's
    per-example rate, ``--lr``), and where it is per unit noise (:meth:`~pyrobnn.methods.Method.rate_factor`) what
    it is at the model's noise: ``lr 0.01 (per unit noise: 0.00017 at noise 0.13)``."""
    lr, factor = method.learning_rate, method.rate_factor(model, epochs)
    return f"lr {lr:.4g}" + ("" if factor == 1 else
                              f" (per unit noise: {lr * factor:.4g} at noise {math.sqrt(factor):.4g})")

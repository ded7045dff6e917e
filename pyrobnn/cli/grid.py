r"""``pyrobnn train --grid``: hyper-parameters chosen on an 80/20 split of the training set, never on the test set.

The protocol of the UCI regression benchmark (Hernández-Lobato & Adams 2015; Gal & Ghahramani 2016, whose
``experiment.py`` this follows): every combination of the grid's values is trained on the first 80 % of the
training set (:func:`~pyrobnn.data.splits.holdout`; a UCI data set's test split is not even read) and scored on
the held-out 20 % by the log-likelihood of its predictive mixture (classification: minus the NLL), in the target's
original units; the run is then trained on the whole training set with the best combination (the first one on
ties), and ``metrics.json`` records every point under ``selection``. The protocol's networks are small enough
that the Python and the dispatch of a step cost more than its arithmetic, so the points that differ only in the noise
precision (``tau``, ``likelihood.scale``: :data:`STACKED`) train at once as one stacked network
(:func:`~pyrobnn.infer.replicas.fit_replicas`: one recorded step for all of them, each with its own random draws),
each stack with the recorded step. With ``--ensemble M`` a point is scored as the ensemble it would train: its M
members (initialised from seeds seed..seed+M-1, trained in the same stack; they share its batches, where the
final ensemble's members each draw their own) predict as their uniform mixture. With ``--swag`` and ``--sgmcmc`` a
point is scored by the draws it would give (its SWAG, or MultiSWAG with ``--ensemble M``; its ``--sgmcmc.chains``
chains), collected by the stacked optimiser (:meth:`~pyrobnn.methods.Method.train_stacked`). A point whose
training diverges (its loss becomes NaN or infinite, with a step too large for its noise precision, say) is dropped
from the search with one warning naming it, and the points trained with it train again without it.

A grid is ``NAME=V1,V2,...`` per option, ``NAME`` a flag of ``pyrobnn train`` without its dashes
(``guide.rate``, ``likelihood.scale``, ``prior.scale``, ``lr``, ``hidden``, ...; not the data and output options),
or ``tau``: a noise precision :math:`\tau` in the target's original units, the convention of Gal's
``tau_values.txt``, whose test log-likelihood is :math:`\log\frac1T\sum_t\mathcal N(y;\hat y_t,\tau^{-1})` with
:math:`\hat y_t` in original units. A model of the standardised target :math:`\tilde y = (y - \mu_y)/s_y` then has
the likelihood scale :math:`\sigma = 1/(\sqrt\tau\, s_y)` (``--likelihood.scale``), with :math:`s_y` the standard
deviation of the rows it trains on. ``protocol`` is the data set's own grid (:func:`~pyrobnn.data.uci_protocol`):
``tau_values.txt`` (left out for a likelihood that learns its noise, ``--likelihood heteroscedastic`` or
``--likelihood.learn-scale``), and ``dropout_rates.txt`` as ``guide.rate`` for ``--guide dropout``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
import typing
from pathlib import Path
from typing import Literal, Union

import pyro

from pyrobnn.cli.build import Run, check_run
from pyrobnn.cli.options import (
    PROTOCOL,
    TAU,
    DataOptions,
    OutputOptions,
    RunConfig,
    grid_entry,
    noise_precision,
)
from pyrobnn.cli.report import num, rate, say, warn
from pyrobnn.cli.runs import augmentation, gigabytes, load_data, test_report
from pyrobnn.data import uci_protocol
from pyrobnn.data.splits import holdout_splits
from pyrobnn.device import resolve_device
from pyrobnn.infer.svi import TrainingDiverged
from pyrobnn.methods import Posterior

__all__ = ["TAU", "PROTOCOL", "STACKED", "grid_axes", "grid_points", "configured", "replica_groups", "held_out_search",
           "search_split", "select_hyperparameters"]

_SCALE = "--likelihood.scale"


def _parse_value(name: str, text: str, annotation):
    """``text`` as a value of an option of type ``annotation`` (a ``ValueError`` naming ``--grid`` and ``name``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union:  # Optional[X]
        return _parse_value(name, text, next(a for a in args if a is not type(None)))
    if origin is Literal:
        if text not in args:
            raise ValueError(f"--grid {name}: {text!r} is not one of {', '.join(map(str, args))}")
        return text
    if origin is tuple:  # one value per grid point: --grid hidden=50,100 is (50,) and (100,)
        return (_parse_value(name, text, args[0]),)
    if annotation is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"--grid {name}: {text!r} is not true or false")
        return text.lower() == "true"
    if annotation is Path:
        return Path(text)
    try:
        return annotation(text)
    except ValueError:
        raise ValueError(f"--grid {name}: {text!r} is not a valid {annotation.__name__}") from None


def _axis(cfg: RunConfig, spec: str) -> tuple[str, tuple[str, ...]]:
    """``NAME=V1,V2,...`` as ``(NAME, values)``, the name checked against the run's options."""
    entry = grid_entry(spec)
    if entry is None:
        raise ValueError(f"--grid {spec!r}: write NAME=V1,V2,... (e.g. guide.rate=0.01,0.05 tau=0.1,0.2) or "
                         f"{PROTOCOL}")
    name, texts = entry
    if name == TAU:
        return name, texts
    fields = cfg.fields()
    if "--" + name not in fields:
        raise ValueError(f"--grid {name}: not an option of pyrobnn train (name a flag without its dashes, e.g. "
                         f"guide.rate, likelihood.scale, prior.scale, lr; or {TAU})")
    group, _ = fields["--" + name]
    if isinstance(group, (DataOptions, OutputOptions)) or name == "grid":
        raise ValueError(f"--grid {name}: only the model, prior, guide, likelihood and optimisation options are "
                         "chosen on held-out data, not the data and output options")
    return name, texts


def _learns_noise(cfg: RunConfig, likelihood: str | None = None) -> bool:
    """Whether the run's likelihood (or ``likelihood``, a grid point's) learns its noise, so that no fixed noise
    precision applies: the heteroscedastic one, or a Gaussian with ``--likelihood.learn-scale``."""
    return (likelihood or cfg.likelihood.name) == "heteroscedastic" or cfg.likelihood.learn_scale


def grid_axes(cfg: RunConfig) -> list[tuple[str, tuple[str, ...]]]:
    """The grid of ``--grid`` as ``[(name, values), ...]`` (``protocol`` expanded from the data set's files: its
    noise precisions only where a likelihood with a fixed noise can be chosen); a ``ValueError`` for a malformed
    entry, an unknown or repeated name, ``tau`` beside ``likelihood.scale``, or a fixed noise for a run whose
    likelihood learns it."""
    explicit = [_axis(cfg, spec) for spec in cfg.optim.grid if spec.strip() != PROTOCOL]
    likelihoods = dict(explicit).get("likelihood", (cfg.likelihood.name,))
    fixed_noise_possible = not all(_learns_noise(cfg, name) for name in likelihoods)
    axes = []
    for spec in cfg.optim.grid:
        if spec.strip() == PROTOCOL:
            protocol = uci_protocol(cfg.data.dataset, cfg.data.data_root)
            if cfg.guide.name == "dropout" and protocol.dropout_rates:
                axes.append(("guide.rate", tuple(map(repr, protocol.dropout_rates))))
            if protocol.tau_values and fixed_noise_possible:
                axes.append((TAU, tuple(map(repr, protocol.tau_values))))
        else:
            axes.append(explicit.pop(0))
    names = [name for name, _ in axes]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--grid names {', '.join(repeated)} more than once ({PROTOCOL} stands for "
                         "guide.rate and tau)")
    if TAU in names and "likelihood.scale" in names:
        raise ValueError(f"--grid {TAU} sets likelihood.scale: name one of them")
    fixed_noise = sorted(set(names) & set(STACKED))
    if fixed_noise and not fixed_noise_possible and not cfg.likelihood.learn_scale:
        raise ValueError(f"--grid {fixed_noise[0]}: --likelihood heteroscedastic learns the noise of every input, "
                         f"so no fixed noise is chosen; drop {fixed_noise[0]} from --grid")
    return axes


def grid_points(cfg: RunConfig, axes: list[tuple[str, tuple[str, ...]]]) -> list[dict[str, str]]:
    """Every combination of the axes' values, in order, except that a point whose likelihood learns its noise
    (``--grid likelihood=gaussian,heteroscedastic``) takes no noise precision: its ``tau`` and
    ``likelihood.scale`` are dropped and the points that become equal are one."""
    names = [name for name, _ in axes]
    points = []
    for values in itertools.product(*(v for _, v in axes)):
        point = dict(zip(names, values))
        if "likelihood" in point and _learns_noise(cfg, point["likelihood"]):
            point = {name: text for name, text in point.items() if name not in STACKED}
        if point not in points:
            points.append(point)
    return points


def configured(cfg: RunConfig, point: dict[str, str], data) -> RunConfig:
    """A copy of ``cfg`` with the grid point's values; ``tau`` becomes ``--likelihood.scale`` =
    :math:`1/(\\sqrt\\tau\\, s_y)` with :math:`s_y` = ``data.y_std`` (1 for targets that were not standardised)."""
    run = copy.deepcopy(cfg)
    fields = run.fields()
    for name, text in point.items():
        if name == TAU:
            tau = noise_precision(text)
            if data.y_std is not None and data.y_std.numel() != 1:
                raise ValueError(f"--grid {TAU} needs one target; {cfg.data.dataset} has {data.y_std.numel()}")
            y_std = 1.0 if data.y_std is None else float(data.y_std)
            group, field_name = fields[_SCALE]
            setattr(group, field_name, 1.0 / (math.sqrt(tau) * y_std))
        else:
            group, field_name = fields["--" + name]
            setattr(group, field_name, _parse_value(name, text, typing.get_type_hints(type(group))[field_name]))
    return run


def _shown(point: dict[str, str]) -> str:
    return " ".join(f"{name}={text}" for name, text in point.items())


def held_out_search(points: list[dict[str, str]], runs: list, evaluate, score: str, held,
                    larger_is_better: bool = True, remedy=lambda: "choose other values") -> tuple[int, dict]:
    """Score each grid point's run on the held-out 20 % (``evaluate(run)`` -> its metrics, ``score`` among them;
    None: the point was dropped, its training diverged) and choose the best (the first of equal scores): ``(index of
    the best point, the record of the search)``, the record ``{"score", "fit_size", "held_out_size", "points":
    [{"values", <metrics> or "diverged"}], "chosen", "seconds"}``.
    Shared by ``pyrobnn train --grid`` and ``pyrobnn mcmc --grid``; every point dropped is a ``ValueError`` ending
    with ``remedy()``."""
    tick, records = time.perf_counter(), []
    for i, (point, run) in enumerate(zip(points, runs)):
        metrics = evaluate(run)
        if metrics is None:  # its training diverged: dropped
            records.append({"values": point, "diverged": True})
            continue
        records.append({"values": point, **metrics})
        say(f"--grid {i + 1}/{len(points)} {_shown(point)}: held-out {score} {num(metrics[score])}")
    scored = [i for i, record in enumerate(records) if not record.get("diverged")]
    if not scored:
        raise ValueError(f"--grid: the training of every one of its {len(points)} points diverged; {remedy()}")
    sign = 1.0 if larger_is_better else -1.0
    best = max(scored, key=lambda i: sign * records[i][score])
    say(f"--grid chose {_shown(points[best])} (held-out {score} {num(records[best][score])})")
    return best, {"score": score, "fit_size": len(held.x_train), "held_out_size": len(held.x_test),
                  "points": records, "chosen": points[best], "seconds": time.perf_counter() - tick}


def _rates(runs: list[Run], held) -> str:
    """The rates the grid's points trained at, as the run's header names them (:func:`~pyrobnn.cli.report.rate`)."""
    rates = []
    for run in runs:
        pyro.set_rng_seed(run.config.optim.seed)
        rates.append(rate(run.method, run.build(held)[0], run.config.optim.epochs))
    return ", ".join(dict.fromkeys(rates))


STACKED = (TAU, "likelihood.scale")
"""The grid's options that set only tensors of the model (the likelihood's noise scale): points that differ in
nothing else train as one stacked network (:func:`~pyrobnn.infer.replicas.fit_replicas`)."""


def replica_groups(points: list[dict[str, str]]) -> list[list[int]]:
    """The indices of ``points`` grouped by their values of every option not in :data:`STACKED` (in order of first
    appearance): each group trains as one stacked network."""
    groups: dict[tuple, list[int]] = {}
    for i, point in enumerate(points):
        groups.setdefault(tuple((k, v) for k, v in point.items() if k not in STACKED), []).append(i)
    return list(groups.values())


def search_split(cfg: RunConfig, data):
    """The 80/20 split the points train and are scored on: the training set's, as the loader splits it (a UCI data
    set's test split is not read); with ``--calibrate``, that of ``data``, whose training rows are those left after
    the calibration rows were held out (:func:`~pyrobnn.cli.runs.calibration_split`), so the search never sees
    them."""
    if not cfg.calibration.calibrate:
        return load_data(cfg, validation=True)
    held, aug = holdout_splits(data), augmentation(cfg, data)
    return held if aug is None else dataclasses.replace(held, x_test=aug.normalize(held.x_test))


def select_hyperparameters(run: Run, data) -> tuple[Run, dict | None]:
    """The run with the ``--grid`` point of highest held-out score (its options checked and its method built: a
    :class:`~pyrobnn.cli.build.Run`), for ``data`` (the run's dataset, whose target scale sets ``tau``), and the
    record of the search (``None`` without ``--grid``): ``{"grid", "score", "fit_size", "held_out_size", "points":
    [{"values", <metrics>}], "chosen", "seconds"}``."""
    cfg = run.config
    if not cfg.optim.grid:
        return run, None
    if cfg.output.resume:
        raise ValueError("--resume does not apply to a run with --grid: the search trains runs that are not "
                         "checkpointed; train again into a new --out")
    axes = grid_axes(cfg)
    if not axes:  # e.g. --grid protocol for a likelihood that learns its noise, with no dropout rate to choose
        say("--grid: nothing to choose for this run (the data set's grid sets the noise precision, which this "
            "likelihood learns), so it trains on the whole training set as given")
        return run, None
    points = grid_points(cfg, axes)
    held = search_split(cfg, data)
    runs = [check_run(configured(cfg, point, held)) for point in points]  # every point checked before any trains
    classification = held.task == "classification"
    score = "nll" if classification else "log_likelihood"
    say(f"--grid: {len(points)} points, each trained on {len(held.x_train)} examples and scored on "
        f"{len(held.x_test)} held out ({score})")
    search = _StackedSearch(points, runs, held, resolve_device(cfg.optim.device))
    best, record = held_out_search(points, runs, search.evaluate, score, held, larger_is_better=not classification,
                                   remedy=lambda: f"they trained at {_rates(runs, held)}: lower --lr (or choose other "
                                                  "values)")
    chosen = check_run(configured(cfg, points[best], data))
    return chosen, {"grid": {name: list(values) for name, values in axes}, **record}


class _StackedSearch:
    """The grid's points trained a stack at a time (:data:`STACKED`: the points that differ only in the noise) by
    their method (:meth:`~pyrobnn.methods.Method.train_stacked`), each scored through its posterior; a point whose
    training diverges is dropped with one warning, and the others of its stack train again without it."""

    def __init__(self, points: list[dict[str, str]], runs: list[Run], held, device):
        self.points, self.runs, self.held, self.device = points, runs, held, device
        self.stacks = replica_groups(points)
        self.trained: dict[int, Posterior] = {}
        self.diverged: dict[int, str] = {}
        self.transform = augmentation(runs[0].config, held)

    def train_stack(self, stack: list[int]) -> None:
        remaining, held = list(stack), self.held
        while remaining:
            first = self.runs[remaining[0]]
            method, opt = first.method, first.config.optim
            pairs = []  # each point as the method trains it: an ensemble's members, MultiSWAG's SWAGs, the chains
            for i in remaining:
                for m in range(method.runs):
                    pyro.set_rng_seed(self.runs[i].config.optim.seed + m)  # weight initialisation (of run m)
                    pairs.append(self.runs[i].build(held))
            try:
                posteriors = method.train_stacked(
                    pairs, held.x_train, held.y_train, epochs=opt.epochs, seed=opt.seed, precision=opt.precision,
                    transform=None if self.transform is None else self.transform.normalize, compile=opt.compile,
                    device=self.device)
            except TrainingDiverged as error:
                point = remaining[0 if error.replica is None else error.replica // method.runs]
                warn(f"--grid {_shown(self.points[point])}: training diverged, so the point is dropped from the "
                     f"search ({error})")
                self.diverged[point] = str(error)
                remaining.remove(point)
                continue
            self.trained.update(zip(remaining, posteriors))
            return

    def evaluate(self, run: Run):
        """The held-out metrics of ``run``'s point (its stack trained first); None: it diverged."""
        index = next(i for i, r in enumerate(self.runs) if r is run)
        if index not in self.trained and index not in self.diverged:
            self.train_stack(next(stack for stack in self.stacks if index in stack))
        if index in self.diverged:
            return None
        return test_report(self.trained.pop(index), self.held, run.config.optim.seed,
                           max_memory=gigabytes(run.config.output.max_memory))

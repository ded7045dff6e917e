"""Monte-Carlo posterior predictive: S weight samples from the guide, one network pass each."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
from pyro import poutine
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import nn

from pyrobnn._compat import DropoutBase
from pyrobnn.checks import multiples_near
from pyrobnn.device import device_of, memory_budget, peak_bytes
from pyrobnn.guides.base import SiteGuide
from pyrobnn.guides.empirical import PosteriorDraws
from pyrobnn.handlers import estimator, vdp
from pyrobnn.handlers.families import has_lazy_value
from pyrobnn.handlers.moments import Moments
from pyrobnn.handlers.particles import ParticlesUnsupported, mismatched_rows_unsupported
from pyrobnn.infer.recording import is_convolutional
from pyrobnn.model.protocol import network_model

PROTOTYPE_ROWS = 16
"""A Pyro model written by hand that no guide or fit has run yet is traced on this many rows of the inputs."""

__all__ = ["predict", "predict_moments", "predictive_outputs", "prediction_mode", "sized_draws", "SizedDraws",
           "LEAST_DRAWS", "FREE_SECONDS"]

LEAST_DRAWS = 2
"""The fewest draws :func:`sized_draws` chooses (unless the method has fewer): two halves, whose spread gives the
report's Monte-Carlo error (:func:`pyrobnn.analysis.evaluate.monte_carlo_error`)."""

FREE_SECONDS = 30.0
"""A report that takes at most this long at the method's draws keeps them all, however short the run
(:func:`sized_draws`): a small run reports the same draws on every machine."""

PROBE_ROWS = 1000
"""The inputs of the larger timed pass of :func:`sized_draws` (at most its ``batch_size``): a pass as large as the
report's, whose inputs cost what they cost there (a convolutional network's per input grows with the batch: its
passes of 256 and 64 inputs put one draw of 10,000 CIFAR images at 6 s where it takes 10 s)."""


@contextlib.contextmanager
def prediction_mode(model: nn.Module, mc_dropout: bool = False):
    """Eval mode (BatchNorm running statistics, dropout off) for the duration, restored afterwards.

    ``mc_dropout=True`` keeps dropout layers sampling (Gal & Ghahramani 2016).
    """
    was_training = [m.training for m in model.modules()]
    model.eval()
    if mc_dropout:
        for m in model.modules():
            if isinstance(m, DropoutBase):
                m.train()
    try:
        yield model
    finally:
        for m, mode in zip(model.modules(), was_training):
            m.training = mode


def _vectorizable(guide) -> bool:
    """Whether the estimator handlers draw the guide's posterior in one pass: empirical draws
    (:class:`~pyrobnn.guides.PosteriorDraws`), or a :class:`~pyrobnn.guides.SiteGuide` with a site of a family of
    :mod:`pyrobnn.handlers.families` (Normal, dropout, mixture nodes) whose other sites are reparameterized (a
    noise scale's Normal) or point masses."""
    if isinstance(guide, PosteriorDraws):
        return True
    if not (isinstance(guide, SiteGuide) and guide.ready):
        return False
    posteriors = [guide.posterior(name) for name in guide.site_names]
    return any(map(has_lazy_value, posteriors)) and all(has_lazy_value(q) or q.has_rsample for q in posteriors)


def _vectorized_by_default(model, guide) -> bool:
    """Whether :func:`predictive_outputs` draws in batched passes by default: a guide the estimators draw in one
    pass (:func:`_vectorizable`) on a network without convolutions."""
    return _vectorizable(guide) and not (isinstance(model, nn.Module) and is_convolutional(model))


def prepared(model, guide, x: torch.Tensor):
    """The model as :class:`~pyrobnn.model.protocol.NetworkModel` and the guide, both ready to predict on ``x``: a
    Pyro model written by hand that nothing has run yet is traced on the first rows of ``x``, a pyrobnn guide that
    has not met it finds its sites there."""
    model = network_model(model, x[:PROTOTYPE_ROWS])
    if isinstance(guide, SiteGuide):
        guide.set_up(x[:PROTOTYPE_ROWS])
    return model, guide


@torch.no_grad()
def predictive_outputs(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
                       mc_dropout: bool = False, vectorized: bool | None = None,
                       max_memory: int | None = None, progress: bool = False) -> torch.Tensor:
    """Network outputs under ``num_samples`` posterior draws, shape ``(S, N, ...)``.

    ``vectorized`` (default: whenever every posterior has a lazy value, e.g. Normal family or dropout, and the
    network has no convolution) draws the S samples in batched passes under
    :func:`~pyrobnn.handlers.local_reparameterization` with ``num_particles``: per example, exactly S independent
    draws of the network under :math:`q(w)`. Otherwise (or when the network uses a Bayesian parameter outside a
    Linear/Conv layer, e.g. a positional embedding or attention weights) a Python loop draws one weight sample per
    pass, shared by all chunks of at most ``batch_size`` inputs. A convolutional network takes the loop by default:
    local reparameterization costs two convolutions a draw (the mean's and the variance's) where a sampled weight
    costs one (on the 2-core CPU, ResNet-18 at width 0.25, 10 draws of 500 CIFAR-shaped inputs: 5.9 s looped against
    12.3 s vectorized; RESULTS.md "Fast by default").

    Memory is bounded by measurement: one pass of a few rows is measured (:func:`pyrobnn.device.peak_bytes`, with
    the random state restored afterwards), and the rows of every pass (particles x examples) are chosen so that a
    pass holds at most ``max_memory`` bytes (default :func:`pyrobnn.device.memory_budget`: half a GPU's free
    memory, or at most 2 GiB on a CPU). ``progress`` shows a bar over the passes.
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    device = device_of(guide, model)
    x = x.to(device)
    model, guide = prepared(model, guide, x)
    model.check_input(x)
    if isinstance(guide, PosteriorDraws):
        guide = guide.thinned(num_samples)  # spread over every chain and the whole run, replayed from draw 0
    budget = memory_budget(device, max_memory)
    explicit = vectorized is not None
    if vectorized is None:
        vectorized = _vectorized_by_default(model, guide)
    with prediction_mode(model, mc_dropout):
        try:
            with _rng_kept(device):  # one draw on one example: x must fit the network (a clear error otherwise)
                _sampled_net(model, guide)(x[:1])
        except ValueError as error:  # run_net's message names the probe's shape: name the input's
            if not isinstance(error.__cause__, RuntimeError):
                raise
            raise ValueError(f"input x of shape {tuple(x.shape)} does not fit the network: {error.__cause__}") from None
        if vectorized:
            _check_components(guide.num_components, num_samples)
            copies = max(2, guide.num_components)
            try:
                rows = _rows_per_pass(lambda probe: _particle_pass(model, guide, probe, copies), x, budget, device,
                                      copies)
                _rewind(guide)
                return _vectorized_outputs(model, guide, x, num_samples, batch_size, rows, progress)
            except ParticlesUnsupported:  # e.g. a residual adding the B-row input to S·B rows
                if explicit:
                    raise
        rows = _rows_per_pass(lambda probe: _sampled_net(model, guide)(probe), x, budget, device, 1)
        _rewind(guide)
        chunk = min(batch_size, rows)
        outputs = []
        with passes(num_samples * math.ceil(len(x) / chunk), progress,
                    f"predict {num_samples} draws x {len(x)} inputs, one draw a pass of {chunk} inputs") as advance:
            for _ in range(num_samples):
                net = _sampled_net(model, guide)
                outputs.append(torch.cat([advance(net(part)) for part in x.split(chunk)]))
    return torch.stack(outputs)


@contextlib.contextmanager
def passes(total: int, progress: bool, what: str = "predict"):
    """A rich progress bar over ``total`` passes (none when ``progress`` is False), labelled ``what`` (e.g. how many
    draws of how many inputs: the passes' count shows from the start); yields ``advance(value)``, which counts one
    pass and returns ``value``."""
    bar = Progress(TextColumn(what.replace("[", "\\[")), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), disable=not progress, transient=True)
    with bar:
        task = bar.add_task("predict", total=total)

        def advance(value):
            bar.advance(task)
            return value

        yield advance


def _check_components(k: int, num_samples: int) -> None:
    if num_samples % k:
        raise ValueError(f"num_samples ({num_samples}) must be a multiple of the guide's {k} mixture components, "
                         f"e.g. {multiples_near(num_samples, k)}")


def _rewind(guide) -> None:
    """Empirical draws replay from the first again (the probes of a pass's memory drew some)."""
    if isinstance(guide, PosteriorDraws):
        guide.index = 0


def _sampled_net(model, guide, check_fit: bool = True):
    """The network with one weight sample of the guide; ``check_fit``: an input that does not fit it is a
    ``ValueError`` (:meth:`~pyrobnn.BayesianNetwork.run_net`)."""
    return poutine.replay(lambda x: model.run_net(x, check=check_fit), trace=poutine.trace(guide).get_trace())


def _particle_pass(model, guide, x, particles: int):
    """``particles`` draws of the network on ``x`` in one pass, shape ``(particles, len(x), ...)``, under local
    reparameterization (chosen here: it says nothing when it finds no site to act on)."""
    with estimator("local", particles, len(x), warn=False) as handler, \
            mismatched_rows_unsupported(handler.particles):
        out = _sampled_net(model, guide, check_fit=False)(x)
    return handler.particles.split(out) if particles > 1 else out.unsqueeze(0)


def _rng_kept(device: torch.device):
    """A context whose draws leave the random state as it was (probes must not change the predictions)."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def _rows_per_pass(run, x: torch.Tensor, budget: int, device: torch.device, copies: int) -> int:
    """How many rows (examples x particles) one pass may take within ``budget`` bytes. The peak memory of ``run``
    is measured on probes of 8 and 32 examples (``copies`` rows each) and fitted as ``fixed + per_row * rows``, so
    what does not grow with the rows (the weight samples of a pass) is not charged to each row; the random state
    is left as it was."""
    sizes = (min(len(x), 8), min(len(x), 32))
    with _rng_kept(device):
        small, large = (peak_bytes(lambda n=n: run(x[:n]), device) for n in sizes)
    if sizes[1] > sizes[0] and large > small:
        per_row = (large - small) / ((sizes[1] - sizes[0]) * copies)
        fixed = max(small - per_row * sizes[0] * copies, 0.0)
    else:
        per_row, fixed = large / (sizes[1] * copies), 0.0
    return max(1, int((budget - fixed) // max(per_row, 1.0)))


@torch.no_grad()
def predict_moments(model, guide, x: torch.Tensor, batch_size: int = 1000) -> dict[str, torch.Tensor]:
    """VDP++ prediction in one deterministic pass: the output ``mean`` and ``var`` of the network
    under :func:`~pyrobnn.handlers.vdp`; for classification also ``probs`` and ``probs_var``, the
    propagated moments of the softmax."""
    x = x.to(device_of(guide, model))
    model, guide = prepared(model, guide, x)
    model.check_input(x)
    parts = []
    with prediction_mode(model), vdp():
        guide_trace = poutine.trace(guide).get_trace()
        net = poutine.replay(lambda rows: model.run_net(rows, check=False), trace=guide_trace)
        for chunk in x.split(batch_size):
            out = net(chunk)
            if not isinstance(out, Moments):
                out = Moments(out, torch.zeros_like(out))
            summary = {"mean": out.loc, "var": out.variance}
            if model.task == "classification":
                probs = torch.nn.functional.softmax(out, -1)
                summary.update(probs=probs.loc, probs_var=probs.variance)
            parts.append(summary)
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def _vectorized_outputs(model, guide, x, num_samples, batch_size, rows, progress=False):
    # a K-component mixture guide (MixtureNodeGuide) gives particle s of example b component (b + s) mod K:
    # every example sees each component equally often when each pass draws a multiple of K
    # every pass draws at least 2 particles: one particle under local reparameterization would sample each
    # position of a convolution independently, not one weight per draw (a single draw left over is the first
    # of two)
    k = guide.num_components
    least = max(2, k)
    chunks, examples = [], max(1, min(batch_size, rows // least))
    per_pass = max(least, min(num_samples, rows // examples) // k * k)
    with passes(math.ceil(len(x) / examples) * math.ceil(num_samples / per_pass), progress,
                f"predict {num_samples} draws x {len(x)} inputs, {per_pass} draws of {examples} inputs a pass") \
            as advance:
        for chunk in x.split(examples):
            draws = [advance(_particle_pass(model, guide, chunk, max(least, min(per_pass, num_samples - start))))
                     for start in range(0, num_samples, per_pass)]
            chunks.append(torch.cat(draws)[:num_samples])
    return torch.cat(chunks, dim=1)


@torch.no_grad()
def predict(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
            mc_dropout: bool = False, vectorized: bool | None = None,
            max_memory: int | None = None, progress: bool = False) -> dict[str, torch.Tensor]:
    r"""Posterior predictive summaries of ``num_samples`` draws of the network under the guide's :math:`q(w)`.

    Classification: ``probs``, the predictive mean :math:`\bar p = \frac1S\sum_s p(y|x, w_s)`; ``total``, its
    entropy :math:`H[\bar p]`; ``aleatoric``, the expected entropy :math:`\frac1S\sum_s H[p(y|x, w_s)]`; and
    ``epistemic``, the mutual information, their difference (Depeweg et al. 2018). Regression: ``mean``, ``std``
    (total), ``epistemic_std`` (of the draws' means) and ``aleatoric_std`` (the observation noise), with
    :math:`\mathrm{std}^2 = \mathrm{epistemic\_std}^2 + \mathrm{aleatoric\_std}^2`.

    :param model: a model of a network (:class:`~pyrobnn.BayesianNetwork`, or a Pyro model written by hand).
    :param guide: its guide (a pyrobnn guide, a Pyro autoguide, or :class:`~pyrobnn.guides.PosteriorDraws`).
    :param x: the inputs, ``(N, ...)``; moved to the guide's device.
    :param num_samples: S, the posterior draws averaged.
    :param batch_size: the most inputs in one pass of the network.
    :param mc_dropout: keep the network's own dropout layers sampling (Gal & Ghahramani 2016).
    :param vectorized: draw the S samples in batched passes (default: when every posterior has a lazy value and
        the network has no convolution), else one weight sample per pass (:func:`predictive_outputs`).
    :param max_memory: the most bytes one pass may hold (default :func:`pyrobnn.device.memory_budget`).
    :param progress: show a progress bar over the passes.
    :returns: ``{name: tensor}``, one row per input.

    Example: the total uncertainty is the aleatoric plus the epistemic.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide, predict
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=32)
    >>> guide = NormalGuide(model, init_rho=-2.0)
    >>> x = torch.randn(32, 4)
    >>> out = predict(model, guide, x, num_samples=10)
    >>> sorted(out), out["probs"].shape
    (['aleatoric', 'epistemic', 'probs', 'total'], torch.Size([32, 3]))
    >>> torch.allclose(out["probs"].sum(-1), torch.ones(32))
    True
    >>> torch.allclose(out["total"], out["aleatoric"] + out["epistemic"], atol=1e-5)
    True
    """
    outputs = predictive_outputs(model, guide, x, num_samples, batch_size, mc_dropout, vectorized, max_memory,
                                 progress)
    return network_model(model).likelihood.predictive(outputs)


@dataclass(frozen=True)
class SizedDraws:
    """The draws :func:`sized_draws` chose (``num_samples``), with what it measured and weighed: the seconds of one
    draw over every input of the report, the ``budget`` in seconds and the ``most`` draws the method takes."""

    num_samples: int
    seconds_per_draw: float
    budget: float
    most: int
    rows: int

    def __str__(self) -> str:
        full = self.most * self.seconds_per_draw
        if self.num_samples == self.most and full <= max(self.budget, FREE_SECONDS):
            why = f"all {self.most} of the method's take {_duration(full)}"
        elif self.num_samples == self.most:
            why = f"the method's {self.most}, though they take {_duration(full)}: a report takes at least that many"
        elif self.num_samples * self.seconds_per_draw <= self.budget:
            why = (f"the most within {_duration(self.budget)}, the run so far; the method's {self.most} would "
                   f"take {_duration(full)}")
        else:
            why = (f"the fewest a report takes ({LEAST_DRAWS}, two halves for its Monte-Carlo error); the method's "
                   f"{self.most} would take {_duration(full)}")
        return (f"{self.num_samples} predictive draws of {self.rows:,} inputs (one draw's passes take "
                f"{_duration(self.seconds_per_draw)}, measured): {why}; --num-samples N sets the number")


def _timed(run) -> float:
    """Seconds ``run()`` takes, its device's work done."""
    start = time.perf_counter()
    float(run().sum())
    return time.perf_counter() - start


def _duration(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def sized_draws(model, guide, x: torch.Tensor, budget: float, most: int, rows: int | None = None,
                least: int = LEAST_DRAWS, free: float = FREE_SECONDS, batch_size: int = 1000,
                mc_dropout: bool = False, max_memory: int | None = None) -> SizedDraws:
    r"""The number of posterior draws S of a report whose passes take about ``budget`` seconds: a report sized to the
    run that precedes it, rather than a fixed S whose passes over a large test set can outlast training many times.

    One draw's time :math:`t` is measured: passes of :data:`PROBE_ROWS` inputs of ``x`` (at most ``batch_size``) and
    of a quarter of them (after a pass of a few that sets up the network), as :func:`predictive_outputs` runs
    them, whose difference is the time of the extra inputs alone (a call's own work, such as its memory probe,
    cancels), scaled to the ``rows`` inputs (default ``len(x)``) the report predicts with each draw. A report whose
    ``most`` draws (the method's own) take at most ``max(budget, free)`` takes them all; otherwise
    :math:`S = \lfloor \text{budget} / t \rfloor`, at least ``least`` (unless ``most`` is fewer), a multiple of a
    mixture guide's components. The random state is left as it was, and
    empirical draws replay from the first.

    :param model, guide: as :func:`predictive_outputs` takes them.
    :param x: inputs of the report (its first :data:`PROBE_ROWS`, at most ``batch_size``, are timed).
    :param budget: the seconds the report may take (e.g. those of the run so far).
    :param most: the method's draws (:attr:`pyrobnn.methods.Posterior.num_samples`).
    :param rows: the inputs each draw predicts in the whole report (the test set, its shifted and held-out sets).
    :param least: the fewest draws (default :data:`LEAST_DRAWS`).
    :param free: a report of at most this many seconds at ``most`` draws keeps them (default :data:`FREE_SECONDS`).
    :returns: a :class:`SizedDraws`, whose ``str`` says the choice and why in one sentence.

    Example: a small network's report keeps all of the method's draws; a budget that one draw already fills takes
    the fewest.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide
    >>> from pyrobnn.infer.predict import sized_draws
    >>> pyro.clear_param_store()
    >>> model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=64)
    >>> guide = NormalGuide(model)
    >>> x = torch.randn(64, 4)
    >>> sized_draws(model, guide, x, budget=1.0, most=100).num_samples
    100
    >>> sized_draws(model, guide, x, budget=0.0, most=100, rows=10**12, free=0.0).num_samples
    2
    """
    if not isinstance(most, int) or most < 1:
        raise ValueError(f"most must be a positive integer (the method's draws), got {most!r}")
    rows = len(x) if rows is None else rows
    components = getattr(guide, "num_components", 1)
    device = device_of(guide, model)
    probe = x[:min(batch_size, PROBE_ROWS)]
    # batched passes draw many at once: time as many as the report's (up to 8); a loop draws one a pass: time one
    batched = _vectorized_by_default(*prepared(model, guide, x.to(device)))
    k = components * max(1, min(most, 8) // components) if batched else components
    options = dict(batch_size=batch_size, mc_dropout=mc_dropout, max_memory=max_memory)
    with _rng_kept(device):
        predictive_outputs(model, guide, probe[:8], num_samples=k, **options)  # sets up the network and guide
        small, large = (_timed(lambda n=n: predictive_outputs(model, guide, probe[:n], num_samples=k, **options))
                        for n in (len(probe) // 4, len(probe)))
    _rewind(guide)
    extra = len(probe) - len(probe) // 4  # a call's own work (its memory probe) cancels in the difference
    per_row = (large - small) / (k * extra) if extra and large > small else large / (k * len(probe))
    seconds = per_row * rows
    if most * seconds <= max(budget, free):
        count = most
    else:
        count = min(most, max(int(budget // seconds), least))
    return SizedDraws(max(components, count - count % components), seconds, budget, most, rows)

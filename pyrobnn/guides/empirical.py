r"""The empirical posterior: draws (from NUTS, or the members of an ensemble) as a guide.

:math:`q(w) = \frac1S \sum_s \delta(w - w_s)`; :class:`PosteriorDraws` replays its draws in order, so
``predict(model, PosteriorDraws(draws), x, num_samples=len(draws))`` averages the predictive over the draws
exactly as it averages a variational guide's samples, and fewer samples take an evenly thinned subset
(:meth:`PosteriorDraws.thinned`).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from torch import nn

from pyrobnn.handlers.particles import ParticlesUnsupported, ParticleValues, current_particles

__all__ = ["PosteriorDraws", "StatefulDraws"]


class PosteriorDraws(nn.Module):
    r"""An empirical guide :math:`q(w) = \frac1S \sum_s \delta(w - w_s)`: its calls replay the draws in order,
    draw ``index mod S`` of every site as a ``Delta`` site, so ``predict(model, PosteriorDraws(draws), x,
    num_samples=len(draws))`` averages the predictive over the draws, exactly as for a variational guide. Under an
    estimator handler with P particles a call replays the next P draws at once
    (:class:`~pyrobnn.handlers.particles.ParticleValues`: one batched pass of the network for P draws).

    ``predict`` and ``evaluate`` with ``num_samples`` = T use :meth:`thinned`: T draws evenly spaced over all S
    (draws of several chains stored chain-major, as :meth:`~pyrobnn.infer.draws.Draws.guide` stores them,
    so every chain and the whole run contribute), deterministic, replayed from the first.

    A site given one draw, ``(1, ...)``, is held at that value in every draw: the sites a last-layer Laplace
    approximation keeps at their MAP values (:func:`pyrobnn.infer.laplace.fit_laplace`) are stored once.

    :param draws: ``{site name: tensor (S, ...) or (1, ...)}`` (e.g. :meth:`~pyrobnn.infer.draws.Draws.guide`).
    """

    num_components: int = 1
    """Draws are replayed whole: no mixture components (see :attr:`pyrobnn.guides.SiteGuide.num_components`)."""

    def __init__(self, draws: dict[str, torch.Tensor]):
        super().__init__()
        if not draws:
            raise ValueError("draws must name at least one site")
        counts = {name: value.shape[0] for name, value in draws.items()}
        if len(set(counts.values()) - {1}) > 1:
            raise ValueError(f"every site needs the same number of draws (or one, held in every draw), got {counts}")
        self.size = max(counts.values())
        self.names = list(draws)
        for i, value in enumerate(draws.values()):
            self.register_buffer(f"draws_{i}", value.detach().clone())
        self.index = 0

    def __len__(self) -> int:
        return self.size

    def draws(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, f"draws_{i}") for i, name in enumerate(self.names)}

    def thinned(self, count: int) -> "PosteriorDraws":
        r"""``count`` draws evenly spaced over all S, :math:`i_t = \mathrm{round}(t\,(S-1)/(T-1))`,
        :math:`t = 0..T-1` (all S in order when ``count`` is S; repeats when it exceeds S), from the first."""
        if count == len(self):
            thinned = PosteriorDraws(self.draws())
        else:
            index = torch.linspace(0, len(self) - 1, count).round().long() if count > 1 else torch.zeros(1).long()
            thinned = PosteriorDraws({name: value if len(value) == 1 else value[index.to(value.device)]
                                      for name, value in self.draws().items()})
        return thinned

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        particles = current_particles()
        count = 1 if particles is None else particles.count
        index = torch.arange(self.index, self.index + count) % len(self)
        self.index += count
        out = {}
        for name, value in self.draws().items():
            if len(value) == 1 or count == 1:
                value = value[int(index[0]) % len(value)]
            else:
                value = ParticleValues(value[index.to(value.device)], particles)
            out[name] = pyro.sample(name, dist.Delta(value, event_dim=value.dim()))
        return out


class StatefulDraws(PosteriorDraws):
    """Empirical draws that carry, besides the Bayesian sites, the network's own state of each draw (its other
    trained parameters and the BatchNorm statistics recomputed for the draw): a call replays draw s of the sites
    and writes draw s of the state into ``model``. One network pass holds one draw, so under vectorized particles it
    raises :class:`~pyrobnn.handlers.particles.ParticlesUnsupported` (``predict`` then draws one sample per pass).

    :param model: the network the state is written into (by name: ``model.named_parameters()`` and
        ``named_buffers()``).
    :param draws: ``{site: (S, ...)}``.
    :param state: ``{parameter or buffer name: (S, ...)}``.
    """

    def __init__(self, model, draws: dict[str, torch.Tensor], state: dict[str, torch.Tensor]):
        super().__init__(draws)
        self.state = PosteriorDraws(state)
        self.__dict__["model"] = model  # not a submodule: the guide does not own the network

    def thinned(self, count: int) -> "StatefulDraws":
        return StatefulDraws(self.model, super().thinned(count).draws(), self.state.thinned(count).draws())

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        particles = current_particles()
        if particles is not None and particles.count > 1:
            raise ParticlesUnsupported("draws with their own BatchNorm statistics run one per network pass")
        index = self.index % len(self)
        out = super().forward(*args, **kwargs)
        self.write(index)
        return out

    @torch.no_grad()
    def write(self, index: int) -> None:
        """Write draw ``index`` of the state into the model."""
        tensors = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
        for name, value in self.state.draws().items():
            tensors[name].copy_(value[index % len(value)])

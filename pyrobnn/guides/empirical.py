r"""The empirical posterior: draws (from NUTS, or the members of an ensemble) as a guide.

:math:`q(w) = \frac1S \sum_s \delta(w - w_s)`; :class:`PosteriorDraws` replays draw ``i`` on call ``i``, so
``predict(model, PosteriorDraws(draws), x, num_samples=len(draws))`` averages the predictive over the draws
exactly as it averages a variational guide's samples.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from torch import nn

__all__ = ["PosteriorDraws"]


class PosteriorDraws(nn.Module):
    r"""An empirical guide :math:`q(w) = \frac1S \sum_s \delta(w - w_s)`: call i replays draw ``i mod S`` of every
    site as a ``Delta`` site, so ``predict(model, PosteriorDraws(draws), x, num_samples=len(draws))`` averages
    the predictive over the draws, exactly as for a variational guide.

    A site given one draw, ``(1, ...)``, is held at that value in every draw: the sites a last-layer Laplace
    approximation keeps at their MAP values (:func:`pyrobnn.infer.laplace.fit_laplace`) are stored once.

    :param draws: ``{site name: tensor (S, ...) or (1, ...)}`` (e.g. :meth:`MCMCResult.posterior`).
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

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        i, self.index = self.index % len(self), self.index + 1
        return {name: pyro.sample(name, dist.Delta(value[i % len(value)], event_dim=value.dim() - 1))
                for name, value in self.draws().items()}

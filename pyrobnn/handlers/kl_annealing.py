"""``kl_annealing``: weight the KL term of the ELBO by β, never the likelihood."""

from __future__ import annotations

from typing import Union

import torch
from pyro.poutine.handlers import _make_handler
from pyro.poutine.messenger import Messenger

__all__ = ["KLAnnealingMessenger", "kl_annealing"]


class KLAnnealingMessenger(Messenger):
    r"""Scale every *latent* sample site by β; observed sites are untouched.

    Applied around an ELBO evaluation (it sees both the guide and the model
    trace), the objective becomes
    :math:`\frac{N}{B}\sum_b \mathbb E_q \log p(y_b|x_b,w) - \beta\,\mathrm{KL}(q\|p)`
    (SPEC section 2): the KL weight of warm-up schedules (paper 001), of
    Blundell's per-minibatch weights (paper 003) and of constant β (paper 000).
    Unlike ``poutine.scale``, β = 0 is allowed (KL switched off).
    """

    def __init__(self, beta: Union[float, torch.Tensor] = 1.0):
        if not bool((torch.as_tensor(beta) >= 0).all()):
            raise ValueError(f"beta (KL weight) must be >= 0, got {beta!r}")
        super().__init__()
        self.beta = beta

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["scale"] = self.beta * msg["scale"]


@_make_handler(KLAnnealingMessenger)
def kl_annealing(fn=None, beta=1.0):  # noqa: D103 (docstring comes from the messenger)
    ...

"""``kl_annealing``: weight the KL term of the ELBO by β, never the likelihood."""

from __future__ import annotations

from typing import Union

import torch
from pyro.poutine.messenger import Messenger

__all__ = ["KLAnnealingMessenger"]


class KLAnnealingMessenger(Messenger):
    r"""Scale every *latent* sample site by β; observed sites are untouched.

    Applied around an ELBO evaluation (it sees both the guide and the model
    trace), the objective becomes
    :math:`\frac{N}{B}\sum_b \mathbb E_q \log p(y_b|x_b,w) - \beta\,\mathrm{KL}(q\|p)`:
    the KL weight of warm-up schedules (Sønderby et al. 2016; Molchanov et al. 2017), of
    Blundell et al.'s (2015) per-minibatch weights and of a constant β.
    Unlike ``poutine.scale``, β = 0 is allowed (KL switched off).
    """

    def __init__(self, beta: Union[float, torch.Tensor] = 1.0, *, validate: bool = True):
        # a number is checked on the host; a tensor costs one device-to-host read. validate=False: the caller
        # checked it (a recorded graph's input, whose value cannot be read while the graph is recorded)
        if validate and not (beta >= 0 if isinstance(beta, (int, float))
                             else bool((torch.as_tensor(beta) >= 0).all())):
            raise ValueError(f"beta (KL weight) must be >= 0, got {beta!r}")
        super().__init__()
        self.beta = beta

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["scale"] = self.beta * msg["scale"]

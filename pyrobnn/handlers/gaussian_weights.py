"""The mechanism shared by :func:`weight_sampling`, :func:`local_reparameterization`, :func:`flipout`
and :func:`vdp`.

A Normal-family latent site sampled under the handler gets a
:class:`~pyrobnn.gaussian_weight.GaussianWeight` as its value instead of a
sampled tensor; the layers that consume it (``F.linear``, ``F.convNd``) then
sample their outputs as the handler's mode says. Sites already given a value
(the model replaying the guide, observed sites) pass through untouched, so the
handler is placed around the whole ELBO (or prediction) call, like
:func:`~pyrobnn.handlers.kl_annealing`.

``num_particles`` S > 1 vectorizes Monte Carlo: the first Bayesian layer to see the
``batch_size``-row input makes S particles of it, so the network returns S·B rows
(particle-major) in one pass; :class:`~pyrobnn.BayesianNetwork` repeats the targets to match,
which averages the ELBO over the S particles. A network that uses a Bayesian parameter outside
a Linear/Conv layer raises :class:`~pyrobnn.gaussian_weight.ParticlesUnsupported` (loop instead).
"""

from __future__ import annotations

from pyro.poutine.messenger import Messenger
from torch.distributions import Independent, Normal

from ..checks import positive_int
from ..gaussian_weight import GaussianWeight

__all__ = ["GaussianWeightMessenger"]


class GaussianWeightMessenger(Messenger):
    """Give every Normal-family latent sample site a :class:`GaussianWeight` value of ``mode``."""

    mode: str = "local"
    handler_name: str = "local_reparameterization"

    def __init__(self, num_particles: int = 1, batch_size: int | None = None):
        num_particles = positive_int("num_particles", num_particles)
        if num_particles > 1 and not (isinstance(batch_size, int) and batch_size > 0):
            raise ValueError(f"{self.handler_name}(num_particles > 1) needs batch_size=<rows of the input>")
        super().__init__()
        self.particles = (batch_size, num_particles) if num_particles > 1 else None

    def _pyro_sample(self, msg):
        if msg["is_observed"] or msg["done"] or msg["value"] is not None:
            return
        fn = msg["fn"]
        base = fn.base_dist if isinstance(fn, Independent) else fn
        if not isinstance(base, Normal):
            raise ValueError(
                f"{self.handler_name} needs a Normal-family posterior, but site {msg['name']!r} is "
                f"sampled from {type(base).__name__}: use a Normal guide (e.g. NormalGuide) for it, "
                f"or keep that parameter out of the handler (pyro.poutine.block) / train without it."
            )
        loc, scale = base.loc, base.scale
        if loc.shape != fn.shape():
            loc, scale = loc.expand(fn.shape()), scale.expand(fn.shape())
        msg["value"] = GaussianWeight(loc, scale, self.mode, self.particles)
        msg["done"] = True

r"""The mechanism every estimator handler shares: latent sites become lazy values.

An estimator handler gives every latent sample site with a lazy value (a Normal-family site: a
:class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight`) that value instead of a sampled
tensor, and is itself the strategy that the layers consuming it call
(``layer``/``other``, see :mod:`pyrobnn.handlers.gaussian_weight`); each subclass (one file
each) holds its own rule. Sites that already have a value (the model replaying
the guide, observed sites), Pyro's subsample sites and latent sites of other families
pass through untouched, so the handler is placed around the whole ELBO or
prediction call (or around the guide), like :func:`~pyrobnn.handlers.kl_annealing`.

``num_particles`` S > 1 vectorizes Monte Carlo by the layout of :mod:`pyrobnn.handlers.particles`.

Which posterior families get a lazy value, and what each estimator does with it, is the table of
:mod:`pyrobnn.handlers.families`.
"""

from __future__ import annotations

import warnings

import torch
from pyro.distributions import Delta, TorchDistribution
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from pyrobnn._compat import DisableTorchFunctionSubclass, tree_map
from pyrobnn.checks import positive_int
from pyrobnn.handlers.families import base_distribution, lazy_value_factory
from pyrobnn.handlers.gaussian_weight import GaussianWeight
from pyrobnn.handlers.lazy_value import LazyValue, ScoredByDraws, as_sample
from pyrobnn.handlers.particles import Particles, ParticlesUnsupported, ParticleValues

__all__ = ["EstimatorMessenger"]

def _name(func) -> str:
    return getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))


class EstimatorMessenger(Messenger):
    """Abstract base: subclasses define :meth:`layer` (and may override :meth:`other`, :meth:`kl_draws`).

    :param num_particles: S > 1 runs S independent draws of the network in one pass.
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).
    """

    stochastic: bool = True
    """Whether the estimator samples (and so takes particles); VDP++ does not."""

    handler: str = "estimator"
    """The name of the handler function that makes it (for its messages)."""

    def __init__(self, num_particles: int = 1, batch_size: int | None = None, *, warn: bool = True):
        num_particles = positive_int("num_particles", num_particles)
        if num_particles > 1 and not (isinstance(batch_size, int) and batch_size > 0):
            raise ValueError(f"{type(self).__name__}(num_particles > 1) needs batch_size=<rows of the input>")
        super().__init__()
        self.particles = Particles(batch_size, num_particles) if num_particles > 1 else None
        self.warn = warn
        self._acted, self._seen = 0, {}

    def __enter__(self):
        self._acted, self._seen = 0, {}
        return super().__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        result = super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and self.warn and not self._acted:
            seen = ", ".join(f"{name!r} ({kind})" for name, kind in list(self._seen.items())[:4]) or "none"
            warnings.warn(f"{self.handler}() found no site it can act on and changed nothing: it acts on latent "
                          "sites whose posterior is Normal (or MC dropout, or mixture nodes) when a Linear/Conv layer "
                          f"uses them; the latent sites it saw: {seen}", UserWarning, stacklevel=2)
        return result

    # -- the effects -----------------------------------------------------------------------
    def _pyro_sample(self, msg):
        if isinstance(msg["value"], LazyValue) and not msg["is_observed"]:  # the model replaying the guide's value
            msg["fn"] = ScoredByDraws(msg["fn"])  # so that Pyro's ELBOs score the draws the layers used
            return
        if msg["is_observed"] or msg["done"] or msg["value"] is not None or site_is_subsample(msg):
            return
        fn = msg["fn"]
        base = base_distribution(fn)
        self._seen.setdefault(msg["name"], type(base).__name__)
        if isinstance(base, Delta) and isinstance(base.v, LazyValue):  # an autoguide's site, T(lazy auxiliary value):
            self._acted += 1  # the value itself (AutoNormal's T is the identity on a weight's real support)
            msg["value"], msg["fn"], msg["done"] = base.v, _DeltaOfLazyValue(fn), True
            return
        factory = lazy_value_factory(fn)
        if factory is None:
            if self.particles is not None:  # a point mass too: its S copies keep the particles' rows
                if not fn.has_rsample:
                    raise ParticlesUnsupported(
                        f"site {msg['name']!r} has a {type(base).__name__} posterior, which cannot be drawn by "
                        f"reparameterization: {self.particles.count} particles need a loop"
                    )
                msg["value"] = ParticleValues(fn.rsample((self.particles.count,)), self.particles)
                msg["fn"], msg["done"] = ScoredByDraws(fn), True
            return  # sampled as usual
        if fn.batch_shape:
            raise ValueError(
                f"site {msg['name']!r} is sampled inside the vectorized plate(s) "
                f"{[f.name for f in msg['cond_indep_stack']]} (Trace_ELBO(vectorize_particles=True) or "
                f"Predictive(parallel=True)): {type(self).__name__} needs one weight per layer; vectorize with "
                f"num_particles=S here (or pyrobnn.infer.predict.predict) instead"
            )
        msg["value"] = factory(fn, self)
        msg["fn"] = ScoredByDraws(fn)
        msg["done"] = True
        self._acted += 1

    def _pyro_current_estimator(self, msg):
        msg["value"], msg["done"] = self, True

    def _pyro_current_particles(self, msg):
        msg["value"], msg["done"] = self.particles, True

    def _pyro_align_targets(self, msg):
        if self.particles is not None and msg["args"][0] is not None:
            msg["value"] = self.particles.repeat(msg["args"][0])
            msg["done"] = True

    # -- the strategy the layers call --------------------------------------------------------
    def layer(self, op, x, weight: GaussianWeight, bias=None, *rest, **kwargs):
        """``op(x, weight, bias, *rest)`` (``F.linear`` or ``F.convNd``) with a Gaussian ``weight``."""
        raise NotImplementedError

    def other(self, func, args, kwargs):
        """Any other operation on a Gaussian weight sees one weight sample, drawn once and reused."""
        if self.particles is not None:
            raise ParticlesUnsupported(
                f"{_name(func)} uses a Bayesian parameter directly: only Linear/Conv layers run S particles in "
                "one pass; draw the samples in a loop instead (num_particles=1, or vectorized=False for prediction)"
            )
        args, kwargs = tree_map(as_sample, (args, kwargs))
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def kl_draws(self, weight: GaussianWeight) -> torch.Tensor:
        """The draws a Monte-Carlo KL of ``weight`` scores: the particles' weights, or the one sample."""
        if self.particles is not None:
            return weight.particle_samples(self.particles.count)
        return weight.sample().unsqueeze(0)

    def sampled_layer(self, op, x, weight: GaussianWeight, bias=None, *rest, **kwargs):
        r"""The layer with whole weights sampled, :math:`w_s = \mu + \sigma \odot \epsilon_s`: one sample for
        the batch, or one per particle applied in one batched call (:meth:`Particles.layer`)."""
        if self.particles is None:
            return op(x, weight.sample(), as_sample(bias), *rest, **kwargs)
        count = self.particles.count
        b = bias.particle_samples(count) if isinstance(bias, GaussianWeight) else bias
        return self.particles.layer(op, x, weight.particle_samples(count), b, *rest, **kwargs)


class _DeltaOfLazyValue(TorchDistribution):
    """An autoguide's ``Delta(T(u), log_density)`` site whose value is the lazy value of its auxiliary site
    ``u``: scored by the Delta's ``log_density`` (the Jacobian term, zero for the identity), the auxiliary site
    scoring the draws (:class:`~pyrobnn.handlers.lazy_value.ScoredByDraws`)."""

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, delta):
        self.delta = delta
        super().__init__(delta.batch_shape, delta.event_shape, validate_args=False)

    @property
    def support(self):
        return self.delta.support

    def rsample(self, sample_shape=torch.Size()):
        return self.delta.v

    def log_prob(self, value):
        return self.delta.log_density

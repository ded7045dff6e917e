r"""The potential energy of a network's posterior, :math:`U(\theta) = -\log p(w(\theta)) - \sum_n \log p(y_n \mid
x_n, w(\theta))`, as a function of one flat vector :math:`\theta` of all Bayesian weights, for Hamiltonian Monte
Carlo (Neal 2011; full batch).

- :class:`FlatPotential`: one vector, the network run with given values of its latent sites
  (:meth:`~pyrobnn.model.protocol.NetworkModel.net_with`: a ``BayesianNetwork`` through the PyroModule cache
  without sample statements; a Pyro model written by hand conditioned on them), what
  ``pyro.infer.NUTS(potential_fn=...)`` takes. A latent on a constrained support (a noise scale) is sampled in
  the unconstrained space, :math:`\theta = T^{-1}(w)`, :math:`T` = ``biject_to(support)``, with the log-Jacobian
  :math:`\log|\det \partial T/\partial\theta|` added to the log prior, as Pyro's ``initialize_model`` /
  ``potential_fn`` do;
- :class:`BatchedPotential`: C vectors ``(C, D)`` in one batched pass of the network. Every latent site is given
  its C values as a :class:`~pyrobnn.handlers.particles.ParticleValues`, which every Linear/Conv layer applies in
  one batched call in the particle layout of :mod:`pyrobnn.handlers.particles` (the layout
  ``weight_sampling(num_particles=C)`` uses: the B-row input shared by all chains, C·B rows after the first layer,
  chain-major), and which any other operation sees row by row (a noise scale beside the C·B rows of the means).
  The gradient of all C potentials is one autograd call on their sum (the chains do not interact, so :math:`\partial
  \sum_c U_c / \partial\theta_c = \partial U_c / \partial\theta_c`). On small networks every PyTorch operation costs its
  dispatch overhead, not its arithmetic, so C chains cost about what one does.
"""

from __future__ import annotations

import copy
import math

import torch
from pyro.distributions import constraints
from pyro.distributions.util import sum_rightmost
from pyro.poutine.messenger import Messenger
from torch.distributions import biject_to
from torch.distributions.transforms import identity_transform

from pyrobnn.distributions import IsotropicNormal, LogUniform
from pyrobnn.handlers.particles import Particles, ParticlesUnsupported, ParticleValues, mismatched_rows_unsupported
from pyrobnn.infer.recording import record, replay
from pyrobnn.model.protocol import network_model

__all__ = ["check_prior", "FlatPotential", "BatchedPotential", "CannotBatch"]


def check_prior(prior, value: torch.Tensor, where: str, real: bool = True) -> None:
    """Raise a ``ValueError`` (its message opens with ``where``) unless ``prior`` is a proper density, on every
    real number (``real``; else on a continuous support NUTS reaches through ``biject_to``), one log density per
    parameter, finite at ``value``: what NUTS needs of :math:`p(w)`."""
    if isinstance(prior, LogUniform):
        raise ValueError(f"{where} is the improper log-uniform prior p(w) ~ 1/|w|, whose posterior is improper too "
                         "(infinite mass at w = 0): NUTS needs a proper prior; use a Gaussian or scale-mixture prior")
    support = prior.support
    if support.is_discrete:
        raise ValueError(f"{where} ({type(prior).__name__}) is discrete: NUTS samples continuous latents; "
                         "enumerate it out or condition the model on its value (pyro.condition)")
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if real and support is not constraints.real:
        raise ValueError(f"{where} ({type(prior).__name__}) has support {prior.support}, not every real number: NUTS "
                         "moves the weights freely over the reals; use a prior on all reals (a Gaussian or "
                         "scale-mixture prior)")
    try:
        density = prior.log_prob(value)
    except NotImplementedError:
        raise ValueError(f"{where} ({type(prior).__name__}) has no density: NUTS needs log p(w); use a Gaussian or "
                         "scale-mixture prior") from None
    if density.shape != ():
        raise ValueError(f"{where} ({type(prior).__name__}) gives log densities of shape {tuple(density.shape)}, not "
                         f"one number: its event shape must be the parameter's shape {tuple(value.shape)} "
                         f"(e.g. .to_event({value.dim()}))")
    if not torch.isfinite(density):
        raise ValueError(f"{where} ({type(prior).__name__}) has log density {density} at the network's weights: "
                         "NUTS needs a proper prior with a finite density")


def _unvalidated(prior):
    """A copy of ``prior`` (and of the distributions it wraps) that does not validate its arguments: a user's prior
    built while validation was on reads a Python bool from every value it scores, which a recorded graph cannot."""
    prior = copy.copy(prior)
    prior._validate_args = False
    if hasattr(prior, "base_dist"):
        prior.base_dist = _unvalidated(prior.base_dist)
    return prior


class FlatPotential:
    r"""The potential energy :math:`U(\theta)` of a network's posterior on full-batch data ``(x, y)``.

    :math:`\theta` is the concatenation of every latent site (in :meth:`~pyrobnn.model.protocol.NetworkModel.sites`
    order), each in the unconstrained space of its prior's support (a weight on the reals as it is; a noise scale
    as its logarithm, ``biject_to``); the network runs with those values (:meth:`network`), and the likelihood is
    the model's own (:meth:`Likelihood.distribution`), unscaled (the batch is the data set).
    Called with ``{"weights": theta}`` as ``NUTS(potential_fn=...)`` does. Deterministic parameters of the
    model (e.g. a learned noise scale) are held at their current values.

    :param model: any model of a network (:func:`~pyrobnn.model.protocol.network_model`; a Pyro model written by
        hand is traced on ``(x, y)``).
    """

    def __init__(self, model, x: torch.Tensor, y: torch.Tensor):
        self.model, self.x = network_model(model, x, y), x
        sites = self.model.sites()
        if not sites:
            raise ValueError("the model has no Bayesian parameters to sample (was it built with deterministic=True?)")
        self.names = [site.name for site in sites]
        self.shapes = [site.shape for site in sites]
        self.priors = [_unvalidated(site.prior_distribution()) for site in sites]
        for site, prior in zip(sites, self.priors):
            # a weight pyrobnn converted starts at the network's own value, which a bounded support may exclude
            check_prior(prior, site.init, f"the prior of site {site.name!r}", real=site.prior is not None)
        self.transforms = [biject_to(prior.support) for prior in self.priors]
        self._sites = sites
        self.evaluations = 0
        self._traced = None
        theta = self.initial()
        self._gaussian = self._diagonal_gaussian(theta)
        with torch.no_grad():  # targets (N,) of a network with one output per example score as (N, 1)
            self.y = self.model.likelihood.targets_for(self.network(self.unflatten(theta), x[:1]), y)

    @property
    def unconstrained_shapes(self) -> list[torch.Size]:
        """Each site's shape in the unconstrained space (its own shape, unless its transform changes it)."""
        return [t.inverse_shape(shape) for t, shape in zip(self.transforms, self.shapes)]

    @property
    def size(self) -> int:
        """The number of sampled numbers, the dimension of :math:`\theta`."""
        return sum(math.prod(shape) for shape in self.unconstrained_shapes)

    def initial(self) -> torch.Tensor:
        """The model's current values (a network's weights; a traced model's traced values) as one flat vector."""
        return torch.cat([t.inv(site.init).reshape(-1) for t, site in zip(self.transforms, self._sites)]).detach()

    def _unconstrained(self, theta: torch.Tensor) -> list[torch.Tensor]:
        shapes = self.unconstrained_shapes
        parts = theta.split([math.prod(shape) for shape in shapes], dim=-1)
        return [part.reshape(theta.shape[:-1] + shape) for part, shape in zip(parts, shapes)]

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{site name: value}`` from a flat vector (or ``(..., D)`` batch: the last dimension is split), each
        mapped to its support."""
        return {name: part if t is identity_transform else t(part)
                for name, part, t in zip(self.names, self._unconstrained(theta), self.transforms)}

    def network(self, values: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The network's output with these values of the latent sites
        (:meth:`~pyrobnn.model.protocol.NetworkModel.net_with`)."""
        return self.model.net_with(values, x)

    def _diagonal_gaussian(self, theta: torch.Tensor):
        r"""``(loc, 1/scale, constant)`` of the prior when every site has an isotropic Gaussian prior (each its
        own :math:`\mathcal N(\mu_k, \sigma_k^2)`, e.g. fan-in scaled): one diagonal Gaussian over the flat
        vector. Python floats when all sites share one, else ``(D,)`` tensors; None for other priors."""
        if not all(isinstance(p, IsotropicNormal) for p in self.priors) or \
                any(t is not identity_transform for t in self.transforms):
            return None
        sizes = [math.prod(shape) for shape in self.shapes]
        constant = sum(n * (math.log(p.scale) + 0.5 * math.log(2 * math.pi)) for n, p in zip(sizes, self.priors))
        if len({(p.loc, p.scale) for p in self.priors}) == 1:
            return self.priors[0].loc, 1.0 / self.priors[0].scale, constant

        def per_weight(values):
            return torch.cat([theta.new_full((n,), v) for n, v in zip(sizes, values)])

        locs = [p.loc for p in self.priors]
        return (per_weight(locs) if any(locs) else 0.0), per_weight([1.0 / p.scale for p in self.priors]), constant

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(w(\theta))` of ``theta`` ``(D,)`` or of each row of ``(C, D)``: one diagonal Gaussian
        term over the flat vector when every site has an isotropic Gaussian prior (the common case, one kernel
        instead of one per site), else the sum over sites."""
        if self._gaussian is not None:
            loc, inverse_scale, constant = self._gaussian
            z = (theta - loc) * inverse_scale if isinstance(loc, torch.Tensor) or loc else theta * inverse_scale
            return -0.5 * torch.linalg.vecdot(z, z) - constant
        total = 0.0
        for prior, part, transform in zip(self.priors, self._unconstrained(theta), self.transforms):
            if transform is identity_transform:
                total = total + prior.log_prob(part)
                continue
            value = transform(part)  # log p(T(u)) + log |det dT/du|
            jacobian = transform.log_abs_det_jacobian(part, value)
            total = total + prior.log_prob(value) + sum_rightmost(jacobian, jacobian.dim() - theta.dim() + 1)
        return total

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(w(\theta)) + \sum_n \log p(y_n \mid x_n, w(\theta))`."""
        output = self.network(self.unflatten(theta), self.x)
        return self.log_prior(theta) + self.model.likelihood.distribution(output).log_prob(self.y).sum()

    def mode(self, theta: torch.Tensor, steps: int, lr: float = 1e-2) -> torch.Tensor:
        r"""The MAP estimate :math:`\arg\max_\theta \log p(w(\theta)) + \sum_n \log p(y_n \mid x_n, w(\theta))`
        approached from ``theta`` ``(D,)`` by ``steps`` full-batch Adam steps of learning rate ``lr`` (Kingma & Ba
        2015) on the potential; where the chains of a network's posterior start inside one basin."""
        theta = theta.detach().clone().requires_grad_()
        optimizer = torch.optim.Adam([theta], lr=lr)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            (-self.log_joint(theta)).backward()
            optimizer.step()
        return theta.detach()

    def compile(self) -> "FlatPotential":
        """Record :meth:`log_joint` once (:func:`~pyrobnn.infer.recording.record`: the network, prior and likelihood
        become one graph without Python in the loop) and replay it (``"trace"``), differentiable; later calls run
        the graph. A graph that differs from the eager potential (data-dependent control flow) is refused."""
        theta = self.initial()
        with torch.no_grad():
            expected = self.log_joint(theta)
        self._traced = replay(record(lambda t: (self.log_joint(t),), (theta.clone(),)), (theta,), "trace")
        with torch.no_grad():
            (got,) = self._traced(theta)
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"compile='trace': the recorded potential gives {got.item()} instead of "
                               f"{expected.item()}; the network has data-dependent control flow: use compile='none'")
        return self

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        self.evaluations += 1
        if self._traced is not None:
            return -self._traced(params["weights"])[0]
        return -self.log_joint(params["weights"])


class _Layout(Messenger):
    """Tells the model the particle layout of the chains (:func:`~pyrobnn.handlers.particles.current_particles`),
    so a model that runs its own data plate repeats its rows for every chain."""

    def __init__(self, particles: Particles):
        super().__init__()
        self.particles = particles

    def _pyro_current_particles(self, msg):
        msg["value"], msg["done"] = self.particles, True


class CannotBatch(ValueError):
    """The network cannot run C weight vectors in one pass (a Bayesian parameter used outside a Linear/Conv
    layer, a residual around the first Bayesian layer, rows that interact), so the batched sampler cannot
    run it: Pyro's NUTS (``sampler="pyro"``) can."""


class BatchedPotential:
    r"""The potential energy of C chains, :math:`\theta` of shape ``(C, D)`` in the layout of ``flat`` (a
    :class:`~pyrobnn.infer.mcmc.FlatPotential`, whose prior, network and likelihood it runs), in one pass of the
    network; calling it returns :math:`U` ``(C,)`` and :math:`\nabla U` ``(C, D)``, the interface
    :class:`~pyrobnn.infer.batched_nuts.BatchedNUTS` takes.

    It checks once, on two chains, that the batched pass gives each chain the potential and gradient of
    ``flat`` (one network pass per chain), and raises :class:`CannotBatch` otherwise.
    """

    def __init__(self, flat: FlatPotential):
        self.flat, self.model, self.x, self.y = flat, flat.model, flat.x, flat.y
        self.evaluations = 0
        self._check_batches()

    def outputs(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The network's outputs on ``x`` for each row of ``theta`` ``(C, D)``: ``(C, len(x), ...)``."""
        particles = Particles(len(x), theta.shape[0])
        values = {name: ParticleValues(value, particles) for name, value in self.flat.unflatten(theta).items()}
        with _Layout(particles), mismatched_rows_unsupported(particles):
            return particles.split(self.flat.network(values, x))

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(w(\theta_c)) + \sum_n \log p(y_n \mid x_n, w(\theta_c))` for every row of ``theta``
        ``(C, D)``: ``(C,)``."""
        log_likelihood = self.model.likelihood.distribution(self.outputs(theta, self.x)).log_prob(self.y)
        return self.flat.log_prior(theta) + log_likelihood.reshape(theta.shape[0], -1).sum(-1)

    def __call__(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.evaluations += 1
        theta = theta.detach().requires_grad_()
        with torch.enable_grad():
            potential = -self.log_joint(theta)
            (grad,) = torch.autograd.grad(potential.sum(), theta)
        return potential.detach(), grad

    def predictions(self, draws: torch.Tensor, x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
        """What the likelihood predicts at ``x`` for every draw of ``draws`` ``(..., D)``: class probabilities
        (classification) or the mean (regression), ``(..., len(x), outputs)``, ``chunk`` draws per pass."""
        flat = draws.reshape(-1, draws.shape[-1])
        out = []
        with torch.no_grad():
            for part in flat.split(chunk):
                fn = self.model.likelihood.distribution(self.outputs(part, x))
                out.append(fn.probs if self.model.likelihood.task == "classification" else fn.mean)
        out = torch.cat(out)
        return out.reshape(draws.shape[:-1] + out.shape[1:])

    def _check_batches(self) -> None:
        start = self.flat.initial()
        theta = torch.stack([start, start + 0.1 * torch.randn(start.shape, generator=torch.Generator().manual_seed(0),
                                                              dtype=start.dtype).to(start.device)])
        try:
            potential, grad = self(theta)
        except ParticlesUnsupported as error:
            raise CannotBatch(f"the network cannot run several weight vectors in one pass: {error}") from None
        for c in range(2):
            one = theta[c].clone().requires_grad_()
            expected = -self.flat.log_joint(one)
            (expected_grad,) = torch.autograd.grad(expected, one)
            if not (torch.allclose(potential[c], expected.detach(), rtol=1e-4, atol=1e-3)
                    and torch.allclose(grad[c], expected_grad, rtol=1e-3, atol=1e-3)):
                raise CannotBatch(f"the batched pass of the network gives chain {c} the potential {float(potential[c])}"
                                  f" instead of {float(expected)} (one pass per chain): the network mixes the rows "
                                  "of different weight vectors")

"""Diagonal Normal posterior: Bayes by Backprop (Blundell et al. 2015)."""

from __future__ import annotations

import math
import weakref

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import Independent, kl_divergence

from pyrobnn.checks import choice, finite
from pyrobnn.distributions import IsotropicNormal, ScaleMixtureNormal, softplus
from pyrobnn.guides.base import SHARING, InitLoc, SiteGuide, shared_shape

__all__ = ["NormalGuide", "PARAMETERIZATIONS", "JointNormal"]

SCALE_ROLES = {"softplus": "rhos", "log_variance": "log_variances", "square": "scale_roots"}
"""The role of the parameter that sets :math:`\\sigma` under each parameterisation (:data:`PARAMETERIZATIONS`)."""

PRUNED_SCALES = {"softplus": -40.0, "log_variance": -80.0, "square": 0.0}
"""What a pruned weight's scale parameter is set to (:math:`\\sigma` vanishes)."""


def _split(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """``flat`` cut into consecutive views of ``shapes``."""
    return [piece if piece.shape == shape else piece.view(shape)
            for piece, shape in zip(flat.split([shape.numel() for shape in shapes]), shapes)]


class _Factor(dist.Normal):
    """Site ``index`` of a :class:`JointNormal`: a ``Normal`` whose single draw is the joint's."""

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, joint: "JointNormal", index: int):
        self.loc, self.scale, self.joint, self.index = loc, scale, joint, index
        torch.distributions.Distribution.__init__(self, loc.shape, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return dist.Normal(self.loc, self.scale, validate_args=False).expand(batch_shape, _instance)

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape == torch.Size():
            return self.joint.draws()[self.index]
        return super().rsample(sample_shape)


_CONSTANT_NORMALS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _constant_normal(base) -> tuple[float, float] | None:
    """``(loc, scale)`` of a ``Normal`` whose location and scale are each one number broadcast to every weight (a
    prior written ``dist.Normal(0., s).expand(shape)``), else None; read once per distribution object (a
    ``PyroSample`` keeps its prior), so a training step does not read a device's tensor back every time."""
    if type(base) not in (dist.Normal, torch.distributions.Normal):
        return None
    if base in _CONSTANT_NORMALS:
        return _CONSTANT_NORMALS[base]
    one = [t for t in (base.loc, base.scale) if t.numel() == 1 or all(stride == 0 for stride in t.stride())]
    value = (float(base.loc.reshape(-1)[0]), float(base.scale.reshape(-1)[0])) if len(one) == 2 else None
    _CONSTANT_NORMALS[base] = value
    return value


class JointNormal:
    r"""The posterior of every site of a :class:`NormalGuide` at once, :math:`q(w) = \mathcal N(\mu, \sigma^2)`
    over the flat vector of all weights (the guide's parameters share one flat storage per role,
    :meth:`~pyrobnn.guides.base.SiteGuide.flat`), with the per-site factors as views (:meth:`factors`, the
    distributions of the guide's sample sites). What is elementwise over the weights is one operation over the
    flat vector instead of one per site: :math:`\sigma = \mathrm{softplus}(\rho)`, the draw
    :math:`w = \mu + \sigma \odot \epsilon`, and the KL of all the sites against a prior that is the same for
    every weight (:meth:`kl`, which :class:`~pyrobnn.MeanFieldELBO` uses for the sites it finds here).
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, loc_shapes, scale_shapes):
        self.loc, self.scale, self.shapes, self.scale_shapes = loc, scale, loc_shapes, scale_shapes
        self._variances = None
        locs, scales = _split(loc, loc_shapes), _split(scale, scale_shapes)
        self.sites = [(m, s if s.shape == m.shape else s.expand(m.shape)) for m, s in zip(locs, scales)]
        self._noise = self._flat_draw = self._draws = None

    def factors(self) -> list[dist.Independent]:
        """The distributions of the guide's sample sites, one per site; each holds this joint (the joint holds
        none of them: no reference cycle keeps a step's draws alive until the garbage collector runs)."""
        return [dist.Independent(_Factor(m, s, self, i), m.dim(), validate_args=False)
                for i, (m, s) in enumerate(self.sites)]

    def draws(self) -> list[torch.Tensor]:
        r"""One draw of every site, :math:`w = \mu + \sigma \odot \epsilon` over the flat vector, made on the
        first request (a site's sample) and reused by the others."""
        if self._draws is None:
            if self.loc.shape == self.scale.shape:
                self._noise = torch.randn_like(self.loc)
                self._flat_draw = torch.addcmul(self.loc, self.scale, self._noise)
                self._draws = _split(self._flat_draw, self.shapes)
            else:  # a shared sigma (per row or layer): each site's own draw
                self._draws = [dist.Normal(m, s, validate_args=False).rsample() for m, s in self.sites]
        return self._draws

    def variance(self, index: int) -> torch.Tensor:
        r""":math:`\sigma^2` of site ``index`` (its scale's shape), squared once over all weights on first request."""
        if self._variances is None:
            self._variances = _split(self.scale.square(), self.scale_shapes)
        return self._variances[index]

    @staticmethod
    def prior_key(prior) -> tuple | None:
        """A key equal for the priors that put the same law on every weight (those :meth:`kl` covers at once)."""
        base = prior.base_dist if isinstance(prior, Independent) else prior
        if type(base) is IsotropicNormal:
            return ("normal", base.loc, base.scale)
        constant = _constant_normal(base)
        if constant is not None:
            return ("normal", *constant)
        if type(base) is ScaleMixtureNormal and isinstance(prior, Independent):
            return ("scale-mixture", base.pi, base.sigma1, base.sigma2)
        return None

    def kl(self, prior, values: dict[int, torch.Tensor]) -> torch.Tensor | None:
        r""":math:`\mathrm{KL}(q\|p)` summed over all sites, given the prior ``p`` of one site (the same law on
        every weight: :meth:`prior_key`) and the value of every site (by index); None when this cannot be one
        computation (some sites missing, a shared :math:`\sigma`, a Monte-Carlo KL of values not drawn here).

        Against :math:`\mathcal N(\mu_p, \sigma_p^2)` the closed form; otherwise the one-sample estimate
        :math:`\log q(w) - \log p(w)` of the draw, with
        :math:`\log q(w) = -\sum_i (\tfrac12\epsilon_i^2 + \log\sigma_i) - \tfrac n2 \log 2\pi` (the same
        value and gradient as the density at :math:`w = \mu + \sigma\odot\epsilon`)."""
        key = self.prior_key(prior)
        if key is None or len(values) != len(self.sites) or self.loc.shape != self.scale.shape:
            return None
        options = {"device": self.loc.device, "dtype": self.loc.dtype}
        if key[0] == "normal":
            flat_prior = IsotropicNormal(key[1], key[2], self.loc.shape, **options)
            return kl_divergence(dist.Independent(dist.Normal(self.loc, self.scale, validate_args=False), 1,
                                             validate_args=False), flat_prior)
        if self._flat_draw is None or any(values[i] is not draw for i, draw in enumerate(self._draws)):
            return None
        w = self._flat_draw
        log_q = -0.5 * torch.dot(self._noise, self._noise) - self.scale.log().sum() \
            - 0.5 * math.log(2 * math.pi) * w.numel()
        log_p = ScaleMixtureNormal(*key[1:], w.shape, **options).log_prob(w).sum()
        return log_q - log_p


PARAMETERIZATIONS = ("softplus", "log_variance", "square")
"""How :class:`NormalGuide` parameterises :math:`\\sigma`."""


class NormalGuide(SiteGuide):
    r"""Diagonal Normal posterior :math:`q(w) = \mathcal N(\mu, \sigma^2)`, sampled as
    :math:`w = \mu + \sigma \odot \epsilon`, :math:`\epsilon \sim \mathcal N(0, I)`.

    Three parameterisations of :math:`\sigma`:

    - ``"softplus"``: :math:`\sigma = \log(1 + e^{\rho})`, Bayes by Backprop (Blundell et al.
      2015, sec. 3.2);
    - ``"log_variance"``: :math:`\sigma = \exp(\tfrac12 \log\sigma^2)`, variational dense
      (Graves 2011, with a Gaussian prior);
    - ``"square"``: :math:`\sigma = G^2`, :math:`G` drawn per weight from :math:`U(\epsilon/\sqrt2, \epsilon)`,
      :math:`\epsilon^2 = \mathrm{softplus}(\rho_0)` the largest :math:`\sigma_0` (BLoB, Wang et al. 2024, as its
      code initialises it: :math:`\epsilon = 0.05`, :math:`\sigma_0` from 0.00125 to 0.0025). A gradient step
      moves :math:`G` by about the learning rate, so :math:`\sigma` can grow by orders of magnitude in a few hundred
      steps, where under ``"softplus"`` from :math:`\rho_0 = -6` it grows by about :math:`e^{\eta t}`.

    Against a Gaussian prior the ELBO uses the analytic KL; against the scale
    mixture it uses ``log q(w) - log p(w)``.

    :param model: the :class:`~pyrobnn.BayesianNetwork`.
    :param init_loc: initial means (default: the network's current weights).
    :param init_rho: initial :math:`\rho`; :math:`\sigma_0 = \mathrm{softplus}(\rho_0)` in every
        parameterisation (under ``"square"`` the largest of the drawn ones; -5 gives :math:`\sigma_0 \approx
        6.7\cdot 10^{-3}`; a very negative value makes the guide reproduce the deterministic network).
    :param parameterization: ``"softplus"``, ``"log_variance"`` or ``"square"``.
    :param share: one :math:`\sigma` per ``"weight"``, per output unit (``"row"``: the weights
        :math:`v_n` of unit :math:`n` share :math:`\sigma_{v_n}`, :math:`q(v_n) = \mathcal N(\mu_{v_n},
        \sigma_{v_n}^2 I)`, whose KL against :math:`\mathcal N(0, I)` is VDP++'s eq. 12 (Dera et al.),
        :math:`\tfrac12\sum_n (\|\mu_{v_n}\|^2 + j\sigma_{v_n}^2 - j\log\sigma_{v_n}^2 - j)`), or per ``"layer"``.

    Example: every weight starts at :math:`\sigma_0 = \mathrm{softplus}(-5) \approx 0.0067`.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> model = BayesianNetwork(nn.Linear(4, 3), num_data=32)
    >>> guide = NormalGuide(model, init_rho=-5.0)
    >>> loc, scale = guide.loc_scale("net.weight")
    >>> loc.shape, torch.allclose(scale, torch.nn.functional.softplus(torch.tensor(-5.0)))
    (torch.Size([3, 4]), True)
    >>> torch.equal(guide.median()["net.weight"], loc)  # the posterior's median is its mean
    True
    """

    def __init__(self, model, init_loc: InitLoc = "module", init_rho: float = -5.0,
                 parameterization: str = "softplus", share: str = "weight", *, name: str | None = None):
        init_rho = finite("init_rho", init_rho)
        self.share = choice("share", share, SHARING)
        parameterization = choice("parameterization", parameterization, PARAMETERIZATIONS)
        self.init_rho, self.parameterization = init_rho, parameterization
        self._scale_role = SCALE_ROLES[parameterization]
        self.pruned_values = {"locs": 0.0, self._scale_role: PRUNED_SCALES[parameterization]}
        super().__init__(model, init_loc, name=name)

    def setup_site(self, site, loc):
        self.add_param(site, "locs", loc)
        shape = shared_shape(loc.shape, self.share)
        if self.parameterization == "square":  # BLoB: G ~ U(eps / sqrt 2, eps), from torch's global RNG
            eps = math.sqrt(math.log1p(math.exp(self.init_rho)))
            root = torch.empty(shape, dtype=loc.dtype, device=loc.device).uniform_(eps / math.sqrt(2), eps)
            self.add_param(site, self._scale_role, root)
            return
        rho = torch.full(shape, self.init_rho, dtype=loc.dtype, device=loc.device)
        self.add_param(site, self._scale_role, rho if self.parameterization == "softplus"
                       else 2 * torch.nn.functional.softplus(rho).log())

    def _scale(self, raw: torch.Tensor) -> torch.Tensor:
        if self.parameterization == "square":
            return raw.square()
        return softplus(raw) if self.parameterization == "softplus" else (0.5 * raw).exp()

    def loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and standard deviation of site ``name``."""
        return self.param(name, "locs"), self._scale(self.param(name, self._scale_role))

    @torch.no_grad()
    def scale_summary(self) -> dict[str, float]:
        r"""The learned :math:`\sigma` over every weight of every site: its ``mean``, standard deviation ``std``,
        ``median``, ``min`` and ``max`` (BLoB's posterior scale on :math:`A`, Wang et al. 2024)."""
        sigma = torch.cat([self.loc_scale(name)[1].detach().flatten().double() for name in self.site_names])
        return {"mean": float(sigma.mean()), "std": float(sigma.std()) if sigma.numel() > 1 else 0.0,
                "median": float(sigma.median()), "min": float(sigma.min()), "max": float(sigma.max())}

    def joint_posterior(self) -> JointNormal | None:
        """The posterior of all sites at once (:class:`JointNormal`), or None when the parameters cannot share one
        flat storage (sites on several devices or dtypes)."""
        if not self.family_names:
            return None
        locs, raws = self.flat("locs"), self.flat(self._scale_role)
        if locs is None or raws is None:
            return None
        return JointNormal(locs[0], self._scale(raws[0]), locs[1], raws[1])

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self.set_up(*args, **kwargs)
        self._claim()
        joint = self.joint_posterior()
        if joint is None:
            return super().forward(*args, **kwargs)
        values = {name: pyro.sample(name, factor) for name, factor in zip(self.family_names, joint.factors())}
        for name in self.site_names:  # the sites off the family (a noise scale): their unconstrained Normals
            if name not in self._family:
                values[name] = pyro.sample(name, self.posterior(name))
        return values

    def get_posterior(self, name, prior):
        loc, scale = self.loc_scale(name)
        return dist.Normal(loc, scale).to_event(loc.dim())

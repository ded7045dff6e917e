"""Turn any ``nn.Module`` into a Pyro model whose selected parameters are prior sample sites.

:func:`bayesian` converts a network in place to a :class:`~pyro.nn.PyroModule`
(``pyro.nn.module.to_pyro_module_``) and replaces each selected parameter by a
:class:`~pyro.nn.PyroSample` whose prior is built by a :class:`~pyrobnn.model.priors.Prior`.
The parameter's current value is kept as a non-persistent buffer
``<name>_init`` on its module: it carries shape, dtype and device for the
prior (so the prior follows ``.to(device)``) and initialises guide means from
pretrained weights. Unselected parameters stay ordinary ``nn.Parameter`` s
(point estimates trained by the optimiser).

A pretrained network brings its own rules. A *frozen* parameter (``requires_grad`` False: a transformer's backbone
under LoRA adapters) is a constant: the default selection (``include=None``) takes only the trainable parameters,
so the adapters carry the prior and the backbone stays deterministic, and a module that keeps a frozen parameter
stays a plain ``nn.Module`` (Pyro's param store, which makes every parameter it holds trainable, never sees it).
A module class that Pyro cannot subclass (``PyroModule[cls]`` fails with a metaclass conflict, as ``peft``'s LoRA
layers do) stays plain too; the modules beneath it are converted, and :func:`link_pyro_modules` gives them the
model's names and context.

A :class:`~pyrobnn.model.priors.NodePrior` makes no weight Bayesian: each selected Linear/Conv layer gets
node latents instead (:mod:`pyrobnn.model.nodes`), sites of the same kind (a ``PyroSample`` attribute and its
``<name>_init`` reference, the prior mean), so :func:`bayesian_sites` lists them too.
"""

from __future__ import annotations

import fnmatch
from typing import Iterable, Iterator, Sequence, Union

import torch
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from torch import nn

from pyrobnn._compat import BatchNormBase, pyro_name, pyro_samples
from pyrobnn.model.nodes import NODE_LAYERS, node_latents, register_node_hooks
from pyrobnn.model.priors import GaussianPrior, NodePrior, Prior
from pyrobnn.model.protocol import INIT_SUFFIX, Site

__all__ = ["bayesian", "bayesian_sites", "last_layer", "link_pyro_modules", "to_pyro_modules_", "Site",
           "NORMALIZATION_LAYERS"]

Selector = Union[str, type]

NORMALIZATION_LAYERS: tuple[type, ...] = (
    BatchNormBase,
    nn.LayerNorm,
    nn.GroupNorm,
)
"""Module types kept deterministic by default (BatchNorm, InstanceNorm, LayerNorm, GroupNorm)."""

class _PriorSite:
    """Callable given to ``PyroSample``: builds the prior from the module's reference buffer.

    The distribution depends only on the buffer's shape, dtype and device, so it
    is built once and reused until the module moves (``.to(device)``).
    """

    def __init__(self, attr: str, prior: Prior):
        self.attr, self.prior = attr, prior
        self._key, self._dist = None, None

    def __call__(self, module: nn.Module):
        reference = getattr(module, self.attr + INIT_SUFFIX)
        key = (reference.shape, reference.dtype, reference.device)
        if key != self._key:
            self._key, self._dist = key, self.prior(reference)
        return self._dist


def _matches(selector: Selector, name: str, module: nn.Module) -> bool:
    if isinstance(selector, str):
        return fnmatch.fnmatchcase(name, selector)
    if isinstance(selector, type):
        return isinstance(module, selector)
    raise TypeError(
        f"include/exclude entries must be glob patterns over parameter names (str) or module "
        f"types, got {selector!r}"
    )


def _as_list(selectors: Selector | Iterable[Selector] | None) -> list[Selector]:
    if selectors is None:
        return []
    if isinstance(selectors, (str, type)):
        return [selectors]
    return list(selectors)


def _selected(net: nn.Module, include: list[Selector], exclude: list[Selector]) -> list[tuple[str, str]]:
    """``(module name, attribute)`` of every parameter that ``include`` selects and ``exclude`` does not; without
    ``include``, every trainable one (a frozen parameter is selected only by an ``include`` that names it)."""
    selected = []
    for module_name, module in net.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{attr}" if module_name else attr
            chosen = any(_matches(s, full, module) for s in include) if include else param.requires_grad
            if chosen and not any(_matches(s, full, module) for s in exclude):
                selected.append((module_name, attr))
    return selected


def _pyro_convertible(cls: type) -> bool:
    """Whether Pyro can subclass ``cls`` (``PyroModule[cls]``); a class with a metaclass of its own that conflicts
    with ``nn.Module``'s (``peft``'s LoRA layers, an ``abc.ABC`` mixin) cannot."""
    try:
        PyroModule[cls]
    except TypeError:
        return False
    return True


def to_pyro_modules_(net: nn.Module, keep: Iterable[tuple[str, str]] = ()) -> nn.Module:
    """Convert ``net`` to a ``PyroModule`` in place (``pyro.nn.module.to_pyro_module_``), or, where it holds a
    module that cannot be one, each largest part of it that can: a module stays a plain ``nn.Module`` when its
    class is one Pyro cannot subclass, when it holds a frozen parameter (``requires_grad`` False) not named in
    ``keep`` (the ``(module name, attribute)`` pairs about to become sites), or when a module beneath it stays
    plain. Pyro registers a plain module that a ``PyroModule`` runs with ``pyro.module`` on every pass, which
    would make a frozen backbone trainable, so a converted part never holds a plain one. :func:`link_pyro_modules`
    names the parts once ``net`` sits in its model. Returns ``net``."""
    keep = set(keep)
    convertible: dict[int, bool] = {}

    def walk(name: str, module: nn.Module) -> bool:
        children = [walk(_join(name, child_name), child) for child_name, child in module._modules.items()
                    if child is not None]
        convertible[id(module)] = (
            all(children)
            and (isinstance(module, PyroModule) or _pyro_convertible(type(module)))
            and all(param.requires_grad or (name, attr) in keep
                    for attr, param in module.named_parameters(recurse=False)))
        return convertible[id(module)]

    if walk("", net):
        to_pyro_module_(net)
        return net
    for module in [m for m in net.modules() if not convertible[id(m)]]:
        for child in module.children():
            if convertible[id(child)]:
                to_pyro_module_(child)
    return net


def link_pyro_modules(root: PyroModule) -> None:
    """Give every ``PyroModule`` beneath ``root`` whose parent is a plain module (:func:`to_pyro_modules_`) its
    full name under ``root`` and ``root``'s context, so its sites are named as if every module between them were a
    ``PyroModule`` and it runs in the model's context (Pyro links a ``PyroModule`` only to a ``PyroModule``
    parent)."""
    context = root._pyro_context
    for name, module in root.named_modules():
        if isinstance(module, PyroModule) and module._pyro_context is not context:
            module._pyro_set_supermodule(_join(pyro_name(root), name), context)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _add_site(module: nn.Module, attr: str, reference: torch.Tensor, prior: Prior) -> None:
    """Make ``module.<attr>`` a prior sample site shaped like ``reference`` (kept as the buffer ``<attr>_init``)."""
    if not isinstance(module, PyroModule):
        raise TypeError(f"include selected {attr!r} of a {type(module).__name__}, a class Pyro cannot make a "
                        "PyroModule (metaclass conflict): select the parameters of the layers inside it instead")
    module.register_buffer(attr + INIT_SUFFIX, reference, persistent=False)
    setattr(module, attr, PyroSample(_PriorSite(attr, prior)))


def bayesian(
    net: nn.Module,
    prior: Prior | None = None,
    *,
    include: Selector | Sequence[Selector] | None = None,
    exclude: Selector | Sequence[Selector] | None = NORMALIZATION_LAYERS,
) -> PyroModule:
    """Make the parameters of ``net`` Bayesian, in place, and return it as a ``PyroModule``.

    :param net: any ``nn.Module`` (your own or a torchvision model), possibly pretrained.
    :param prior: the weight prior (default ``GaussianPrior(0, 1)``), or a :class:`~pyrobnn.model.priors.NodePrior`:
        node latents on the selected Linear/Conv layers (a layer is selected when one of its parameters is),
        whose weights stay deterministic.
    :param include: which parameters become Bayesian: glob patterns over the full
        parameter names (``"fc2.*"``, ``"*.weight"``) and/or module types
        (``nn.Linear``). ``None`` selects every trainable parameter (frozen ones, ``requires_grad`` False, stay
        constants: module docstring).
    :param exclude: parameters to keep deterministic, same syntax; by default
        normalisation layers (BatchNorm, LayerNorm, GroupNorm).
    :returns: the same object, converted (a ``PyroModule`` unless its class cannot be one); its sites are listed by
        :func:`bayesian_sites`.

    The network's own priors are kept: a ``PyroSample`` attribute it already has (a layer written the Pyro way,
    ``layer.weight = PyroSample(dist.Normal(0., 1.).expand([out, in]).to_event(2))``) stays a site with its
    prior, and ``prior`` fills only its plain parameters, so a user's priors on some layers mix with pyrobnn's on
    the rest.
    """
    if not isinstance(net, nn.Module):
        raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
    prior = GaussianPrior() if prior is None else prior
    if not isinstance(prior, Prior):
        raise TypeError(f"prior must be a pyrobnn Prior (e.g. GaussianPrior()), got {prior!r}")
    selected = _selected(net, _as_list(include), _as_list(exclude))
    own = _keep_own_priors(net)
    if not selected and not own:
        trainable = [n for n, p in net.named_parameters() if p.requires_grad]
        raise ValueError(
            "include/exclude selected no parameter of the network: check the patterns against "
            f"its {'trainable ' if trainable else ''}parameter names, e.g. "
            f"{(trainable or [n for n, _ in net.named_parameters()])[:5]}"
        )
    if isinstance(prior, NodePrior) and selected:
        modules = dict(net.named_modules())
        layers = [name for name in dict.fromkeys(name for name, _ in selected)
                  if isinstance(modules[name], NODE_LAYERS)]
        if not layers:
            raise ValueError(
                f"NodePrior puts node latents on {', '.join(t.__name__ for t in NODE_LAYERS)} layers, but the selected "
                f"parameters {[f'{m}.{a}' if m else a for m, a in selected][:5]} belong to none: select a Linear or "
                "Conv layer with include="
            )
        to_pyro_modules_(net, selected)
        for name in layers:
            layer = modules[name]
            for attr, reference in node_latents(layer, prior).items():
                _add_site(layer, attr, reference, prior)
            register_node_hooks(layer, prior)
        return _linked(net)
    to_pyro_modules_(net, selected)
    modules = dict(net.named_modules())
    for module_name, attr in selected:
        module = modules[module_name]
        value = getattr(module, attr).detach().clone()
        delattr(module, attr)
        _add_site(module, attr, value, prior)
    return _linked(net)


def _linked(net: nn.Module) -> nn.Module:
    if isinstance(net, PyroModule):
        link_pyro_modules(net)
    return net


def _keep_own_priors(net: nn.Module) -> list[tuple[nn.Module, str]]:
    """The ``PyroSample`` attributes the network already has (the user's own priors), which :func:`bayesian`
    keeps: each gets a reference buffer ``<attr>_init``, one draw of its prior (shape, dtype and device for the
    guides, and their initial means), made once."""
    kept = []
    for module in net.modules():
        for attr, fn in pyro_samples(module).items():
            if isinstance(fn, _PriorSite):
                continue
            if attr + INIT_SUFFIX not in module._buffers:
                prior = fn if hasattr(fn, "sample") else fn(module)
                module.register_buffer(attr + INIT_SUFFIX, prior.sample().detach(), persistent=False)
            kept.append((module, attr))
    return kept


def bayesian_sites(net: nn.Module) -> Iterator[Site]:
    """The Bayesian parameters of a converted network, in module order, with their site names: the sites
    :func:`bayesian` made (``site.prior`` is their :class:`~pyrobnn.model.priors.Prior`) and the ``PyroSample`` s
    the network brought (``site.prior`` None: the prior is the user's)."""
    for module in net.modules():
        samples = pyro_samples(module)
        for attr, fn in samples.items():
            if isinstance(fn, _PriorSite) or attr + INIT_SUFFIX in module._buffers:
                name = f"{pyro_name(module)}.{attr}" if pyro_name(module) else attr
                yield Site(name, module, attr, fn.prior if isinstance(fn, _PriorSite) else None)


def last_layer(net: nn.Module) -> list[str]:
    """Names of the parameters of the last module that has any (``include=last_layer(net)``)."""
    last = None
    for name, module in net.named_modules():
        own = [attr for attr, _ in module.named_parameters(recurse=False)]
        if own:
            last = [f"{name}.{attr}" if name else attr for attr in own]
    if last is None:
        raise ValueError("the network has no parameters")
    return last

"""Methods on the command line: a method's fields as its options' values, and the method a run's options describe.

A method is an object of :mod:`pyrobnn.methods` (its settings, with its paper's defaults, are there and nowhere
here). ``pyrobnn train --method NAME`` turns it into option values (:func:`method_args`) placed before the user's
own, which therefore win (:func:`expand_method`): the method gives the parser its defaults and nothing more. After
parsing, :func:`run_method` reads the options back into the method the run trains: the method named (or the one the
posterior options select: ``--ensemble M``, ``--laplace``, ``--swag``, ``--sgmcmc NAME``), with every field that
has an option set from it. The studies expand a cell's ``--method`` the same way.

The correspondence is one table per kind of field: the prior, the guide, the β schedule and the optimiser map to
their option groups (:func:`settings_args`); a method's own fields map to ``--<field>``, ``--<kind>.<field>`` or a
renamed flag (:data:`RENAMED`). A field without an option keeps the method's value.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

from pyrobnn.cli.options import MCMCConfig, RunConfig, cli_spelling
from pyrobnn.guides import GUIDES
from pyrobnn.infer.optim import FlatThenLinear, GuideRateOptim, Optim, StepDecay
from pyrobnn.infer.schedules import SCHEDULES
from pyrobnn.methods import (
    METHOD_NAMES,
    SGMCMC,
    SWAG,
    Ensemble,
    Laplace,
    Method,
    Variational,
    finetuned,
    resolve_method,
)
from pyrobnn.methods.rules import guide_class, guide_options
from pyrobnn.model.priors import PRIORS

__all__ = ["method_args", "expand_method", "run_method", "RECORDING_COMMANDS", "METHOD_NAMES",
           "resolve_method", "KINDS", "RENAMED", "GUIDE_ARGUMENTS", "SCHEDULE_ARGUMENTS"]

RECORDING_COMMANDS = ("train",)
"""Commands whose configuration records the method it was expanded from (``RunConfig.method``); for the others
(``mcmc``) :func:`expand_method` drops ``--method NAME`` after inserting its arguments."""

KINDS: dict[type, tuple[str, Optional[str]]] = {Ensemble: ("--ensemble", None), Laplace: ("--laplace", None),
                                                SWAG: ("--swag", "swag"), SGMCMC: ("--sgmcmc", "sgmcmc")}
"""The method classes the posterior options select -> (the option that selects it, the prefix of its own fields'
options: ``--swag.rank``, ``--sgmcmc.friction``). :class:`~pyrobnn.methods.Variational` is selected by none; a
method of another class is selected by its name alone (``--method ivon``)."""

RENAMED = {"members": "--ensemble", "swa_lr": "--swag.lr", "sampler": "--sgmcmc", "chains": "--sgmcmc.chains"}
"""A method's field -> its option, where the option is not ``--<field>`` or ``--<kind>.<field>``."""

GUIDE_ARGUMENTS = {"num_components": "components"}
"""Guide constructor argument -> its ``--guide.*`` option, where the names differ (``--guide.components`` is K)."""

SCHEDULE_ARGUMENTS = {"beta": "value", "final": "value"}
"""Schedule constructor argument -> its ``--beta.*`` option, where the names differ (``Constant(beta)``,
``LinearWarmup(final)``)."""

def _name_of(registry: dict, cls: type, what: str) -> str:
    for name, registered in registry.items():
        if registered is cls:
            return name
    raise ValueError(f"{what} {cls.__name__} has no command-line name: register it in {what}s' registry")


def settings_args(method: Method, flags: set[str]) -> dict[str, Any]:
    """``{flag: value}`` among ``flags`` (a command's options) of the method's prior, guide, estimator, particles,
    batch size, predictive samples, β schedule and optimiser (``None``: the option keeps its default, the rule of
    :mod:`pyrobnn.methods.rules`); a setting away from :class:`~pyrobnn.methods.Method`'s default without an option
    in ``flags`` is a ``ValueError``."""
    values, defaults = _settings_values(method), _settings_values(Variational())
    missing = [flag for flag in values if flag not in flags and values[flag] != defaults.get(flag, object())]
    if missing:
        raise ValueError(f"{', '.join(missing)}: the method's settings have no option here")
    return {flag: value for flag, value in values.items() if flag in flags}


def _settings_values(method: Method) -> dict[str, Any]:
    values: dict[str, Any] = {"--prior": _name_of(PRIORS, type(method.prior), "prior")}
    for field in dataclasses.fields(method.prior):
        values[f"--prior.{field.name.replace('_', '-')}"] = getattr(method.prior, field.name)
    values["--guide"] = _name_of(GUIDES, guide_class(method.guide), "guide")
    for name, value in guide_options(method.guide).items():
        values[f"--guide.{GUIDE_ARGUMENTS.get(name, name).replace('_', '-')}"] = value
    values.update({"--estimator": method.estimator, "--num-particles": method.num_particles,
                   "--batch-size": method.batch_size, "--num-samples": method.num_samples})
    if method.beta is not None:
        values["--beta"] = _name_of(SCHEDULES, type(method.beta), "schedule")
        for field in dataclasses.fields(method.beta):
            values[f"--beta.{SCHEDULE_ARGUMENTS.get(field.name, field.name)}"] = getattr(method.beta, field.name)
    values.update(_optimizer_args(method.optimizer))
    return values


def _optimizer_args(optimizer) -> dict[str, Any]:
    if optimizer is None:
        return {}
    if not isinstance(optimizer, Optim) or optimizer.warmup_steps:
        raise ValueError(f"optimizer {optimizer!r} has no command-line options (Optim, GuideRateOptim without "
                         "warm-up have)")
    flags = {"--optimizer": optimizer.name, "--lr": optimizer.lr, "--weight-decay": optimizer.weight_decay}
    if optimizer.kl_lr is not None:
        flags["--kl-lr"] = optimizer.kl_lr
    if isinstance(optimizer.schedule, StepDecay):
        flags.update({"--lr-step": optimizer.schedule.step, "--lr-gamma": optimizer.schedule.gamma})
    elif isinstance(optimizer.schedule, FlatThenLinear):
        flags["--lr-linear-from"] = optimizer.schedule.start
    elif optimizer.schedule is not None:
        raise ValueError(f"the learning-rate schedule {optimizer.schedule!r} has no command-line option")
    if isinstance(optimizer, GuideRateOptim):
        flags["--variational-lr-factor"] = optimizer.factor
    return flags


def _own_fields(method: Method) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(method)
            if field.name not in {f.name for f in dataclasses.fields(Method)}]


def _own_flag(method: Method, name: str, flags: set[str]) -> Optional[str]:
    """The option of the method's own field ``name`` among ``flags`` (None: it has none)."""
    prefix = KINDS.get(type(method), (None, None))[1]
    for flag in (RENAMED.get(name), f"--{name.replace('_', '-')}",
                 f"--{prefix}.{name.replace('_', '-')}" if prefix else None):
        if flag in flags:
            return flag
    return None


def method_args(name: str | Method, flags: Optional[set[str]] = None) -> tuple[str, ...]:
    """The option values method ``name`` (a name or a :class:`~pyrobnn.methods.Method`) stands for, as arguments of
    its command (:attr:`Method.command`): :func:`settings_args`, the option that selects its kind, and its own fields
    that have options (``flags``: the command's options, default those of its configuration)."""
    method = name if isinstance(name, Method) else resolve_method(name)
    flags = _command_flags(method.command) if flags is None else flags
    values = settings_args(method, flags)
    selector = KINDS.get(type(method), (None, None))[0]
    if selector is not None:
        values[selector] = True
    for field in _own_fields(method):
        flag = _own_flag(method, field.name, flags)
        if flag is not None:
            values[flag] = getattr(method, field.name)
    if method.command == "train":  # the report's draws stay the method's (run_method): unset, they fit the run
        values.pop("--num-samples", None)
    if isinstance(method, SWAG) and method.members == 1:
        values["--ensemble"] = 0  # one SWAG: not MultiSWAG
    unknown = sorted(flag for flag in values if flag not in flags)
    if unknown:
        raise ValueError(f"--method {name}: {', '.join(unknown)} are not options of pyrobnn {method.command}")
    return tuple(arg for flag, value in values.items() for arg in _argv(flag, value))


@functools.lru_cache(maxsize=None)
def _command_flags(command: str) -> frozenset:
    return frozenset({"train": RunConfig, "mcmc": MCMCConfig}[command]().flags())


def _argv(flag: str, value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):  # tyro's negation: --no-swag, --prior.no-fan-in
        group, _, name = flag[2:].rpartition(".")
        return [flag] if value else [f"--{group + '.' if group else ''}no-{name}"]
    if isinstance(value, tuple):
        return [flag, *map(str, value)]
    return [flag, str(cli_spelling(value))]


def _named(argv: list[str], flag: str = "--method", default=None):
    """The value of the last ``--method NAME`` / ``--method=NAME`` (``flag``) in ``argv`` (``default``: none)."""
    name = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith(f"{flag}="):
            name = arg.split("=", 1)[1]
    return name


def expand_method(argv: list[str]) -> list[str]:
    """``[command, *args]`` with the arguments of the ``--method`` it names inserted right after the command, before
    the user's own, which therefore win: ``["train", "--method", "bbb", "--epochs", "3"]`` ->
    ``["train", *method_args("bbb"), "--method", "bbb", "--epochs", "3"]``.

    A pretrained network (``--model hf:...``) takes the method's settings for a first fine-tune
    (:func:`pyrobnn.methods.finetuned`), the method's own or ``train``'s defaults' (without ``--method``).

    ``argv`` is returned unchanged without ``--method``, for an unknown method, or for one that another command
    runs: the run's checks (:func:`pyrobnn.cli.build.check_run`) then report it as one error line. A command outside
    :data:`RECORDING_COMMANDS` gets the arguments without ``--method NAME`` itself.
    """
    name = _named(argv[1:]) if argv else None
    try:
        method = resolve_method(name) if name is not None else None
    except ValueError:
        return list(argv)
    pretrained = argv[:1] == ["train"] and _named(argv[1:], "--model", "").lower().startswith("hf:")
    if method is None and pretrained:
        tuned = finetuned(Variational())
        values = {**_optimizer_args(tuned.optimizer), "--batch-size": tuned.batch_size}
        return [argv[0], *(arg for flag, value in values.items() for arg in _argv(flag, value)), *argv[1:]]
    if method is None or method.command != argv[0]:
        return list(argv)
    rest = argv[1:]
    if argv[0] not in RECORDING_COMMANDS:
        rest = [arg for i, arg in enumerate(rest) if not (arg == "--method" or arg.startswith("--method=")
                                                          or (i > 0 and rest[i - 1] == "--method"))]
    return [argv[0], *method_args(finetuned(method) if pretrained else method), *rest]


def _selected(cfg) -> list[type]:
    post = cfg.posterior
    return [cls for cls, on in ((SWAG, post.swag), (Ensemble, post.ensemble and not post.swag),
                                (Laplace, post.laplace), (SGMCMC, post.sgmcmc != "none")) if on]


def run_method(cfg, settings: dict) -> Method:
    """The method a parsed ``pyrobnn train`` configuration trains: the class the posterior options select (else the
    named method's; else :class:`~pyrobnn.methods.Variational`), the named method's values (else the class's
    defaults) for the fields without options, and ``settings`` (the prior, guide, β schedule and optimiser the
    options build: :func:`pyrobnn.cli.build.settings_of`) with every field that has an option read from it."""
    named = resolve_method(cfg.method) if cfg.method is not None else None
    selected = _selected(cfg)
    cls = selected[0] if selected else Variational
    if named is not None and type(named) not in (*KINDS, Variational):
        if selected:
            raise ValueError(f"{KINDS[cls][0]} does not apply to --method {cfg.method}: it trains its own way")
        cls = type(named)
    base = named if named is not None and type(named) is cls else cls()
    flags = cfg.flags()
    values = {field.name: flags[flag] for field in _own_fields(base)
              if (flag := _own_flag(base, field.name, set(flags))) is not None}
    if cls is SWAG:  # --ensemble 0 (its default) is one SWAG; M > 1 is MultiSWAG
        values["members"] = max(1, values["members"])
    common = {name: value for name, value in settings.items() if name in {f.name for f in dataclasses.fields(Method)}
              and (name != "optimizer" or cls.takes_optimizer)}
    return dataclasses.replace(base, **common, **values)


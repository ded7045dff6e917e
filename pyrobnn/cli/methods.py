"""Methods on the command line: one table between a method's fields and the command's options, read both ways.

A method is an object of :mod:`pyrobnn.methods` (its settings, with its paper's defaults, are there and nowhere
here). ``pyrobnn train --method NAME`` turns it into option values (:func:`method_args`) placed before the user's
own, which therefore win (:func:`expand_method`): the method gives the parser its defaults and nothing more. After
parsing, :func:`run_method` reads the options back into the method the run trains, once: the named method with
every field that has an option set from it. The studies expand a cell's ``--method`` the same way.

The table (:func:`flag_of`): the prior, the guide, the β schedule and the optimiser map to their option groups
(:func:`settings_args`); a method's own fields map to ``--<field>`` where the command has that option (IVON's
``--lr``), else ``--<kind>.<field>`` with the kind of :data:`KINDS` (``--swag.rank``, ``--sgmcmc.chains``,
``--ivon.ess``), or a renamed option (:data:`RENAMED`); a field without an option keeps the method's value. What a
method refuses (:class:`~pyrobnn.methods.Refused`) is reported with the same table (:func:`spelled`): the method
states the rule, the command line names its options.

The former way to pick a method by flag (``--ensemble M``, ``--laplace``, ``--swag``, ``--sgmcmc NAME``) is an alias
of ``--method`` (:data:`ALIASES`, :func:`resolve_aliases`), with a ``DeprecationWarning``: it names the method and,
as it did, takes the command's defaults for what it does not set (no preset), so an old command line trains as it
did.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, NamedTuple, Optional

from pyrobnn.cli.options import MCMCConfig, RunConfig, cli_spelling
from pyrobnn.guides import GUIDES
from pyrobnn.infer.optim import FlatThenLinear, GuideRateOptim, Optim, StepDecay
from pyrobnn.infer.schedules import SCHEDULES
from pyrobnn.methods import (
    METHOD_NAMES,
    METHODS,
    SGMCMC,
    SWAG,
    Ensemble,
    Laplace,
    Method,
    Refused,
    Variational,
    finetuned,
    resolve_method,
)
from pyrobnn.methods.rules import guide_class, guide_options
from pyrobnn.model.priors import PRIORS
from pyrobnn.networks import network_spec

__all__ = ["method_args", "expand_method", "run_method", "RECORDING_COMMANDS", "METHOD_NAMES", "resolve_method",
           "KINDS", "RENAMED", "GUIDE_ARGUMENTS", "SCHEDULE_ARGUMENTS", "ALIASES", "resolve_aliases", "flag_of",
           "spelled", "former_selectors", "legacy_config"]

RECORDING_COMMANDS = ("train",)
"""Commands whose configuration records the method it was expanded from (``RunConfig.method``); for the others
(``mcmc``) :func:`expand_method` drops ``--method NAME`` after inserting its arguments."""

def _kinds() -> dict[type, str]:
    prefixes = {flag[2:].split(".", 1)[0] for flag in RunConfig().flags() if "." in flag}
    classes = dict.fromkeys(type(method) for method in METHODS.values())
    return {cls: cls.__name__.lower() for cls in classes if cls.__name__.lower() in prefixes}


KINDS: dict[type, str] = _kinds()
"""The method classes of the registry whose own fields have options of their own, named by the class
(``--swag.rank``, ``--sgmcmc.friction``, ``--ivon.ess``) -> that prefix; the options of one kind reach only its
methods (a study's base may hold them for some of its cells). A new method's options are its own fields under its
name (``cli/options.py``'s ``MethodOptions``)."""

RENAMED = {"swa_lr": "--swag.lr"}
"""A method's field -> its option, where the option is not ``--<field>`` or ``--<kind>.<field>``."""

GUIDE_ARGUMENTS = {"num_components": "components"}
"""Guide constructor argument -> its ``--guide.*`` option, where the names differ (``--guide.components`` is K)."""

SCHEDULE_ARGUMENTS = {"beta": "value", "final": "value"}
"""Schedule constructor argument -> its ``--beta.*`` option, where the names differ (``Constant(beta)``,
``LinearWarmup(final)``)."""

SETTINGS = {"prior": "--prior", "guide": "--guide", "estimator": "--estimator", "num_particles": "--num-particles",
            "batch_size": "--batch-size", "num_samples": "--num-samples", "beta": "--beta",
            "optimizer": "--optimizer", "optimizer.name": "--optimizer", "optimizer.lr": "--lr",
            "optimizer.weight_decay": "--weight-decay", "optimizer.schedule": "--lr-step/--lr-linear-from",
            "optimizer.factor": "--variational-lr-factor", "epochs": "--epochs", "rows": "--train-size",
            "transform": "--augment", "validation": "--val-size", "likelihood.learn_scale": "--likelihood.learn-scale",
            "likelihood.scale": "--likelihood.scale", "network": "--hidden", "network.dropout": "--dropout",
            "sites": "--bayesian", "guide.num_components": "--guide.components", "members": "--method",
            "sampler": "--method"}
"""The settings :class:`~pyrobnn.methods.Method` and a run have -> their options (a refusal's ``{field}``)."""


class Alias(NamedTuple):
    """A former flag that picks a method: the method's name for the flag's value (None: it picks none)."""

    flag: str
    name: Callable[[str, list[str]], Optional[str]]


def _ensemble(value: str, argv: list[str]) -> Optional[str]:
    if not value.isdigit():
        raise ValueError(f"--ensemble must be a non-negative integer (M, the members; 0: none), got {value!r}")
    if "--swag" in argv:  # MultiSWAG: M SWAGs (the option of --swag below)
        return None
    return None if int(value) == 0 else f"ensemble-{int(value)}"


def _swag(value: str, argv: list[str]) -> Optional[str]:
    members = _value_of(argv, "--ensemble")
    return f"multiswag-{members}" if members not in (None, "0") else "swag"


ALIASES = (Alias("--ensemble", _ensemble), Alias("--laplace", lambda value, argv: "laplace"),
           Alias("--swag", _swag), Alias("--sgmcmc", lambda value, argv: None if value == "none" else value))
"""The former flags that picked a method (``--ensemble M``, ``--laplace``, ``--swag`` (with ``--ensemble M``:
MultiSWAG), ``--sgmcmc NAME``), each an alias of ``--method``, deprecated."""

_SWITCHES = {"--laplace", "--swag"}
_NEGATED = {"--no-laplace", "--no-swag"}


def _value_of(argv: list[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def resolve_aliases(argv: list[str]) -> tuple[list[str], Optional[str]]:
    """``(argv without the former selector flags, the method they name)`` (None: they name none), with a
    ``DeprecationWarning`` naming the ``--method`` to write; two methods named (two flags, or a flag beside
    ``--method``) are a ``ValueError``."""
    kept, named = [], []
    i = 0
    while i < len(argv):
        arg, flag = argv[i], argv[i].split("=", 1)[0]
        alias = next((a for a in ALIASES if a.flag == flag), None)
        if arg in _NEGATED:
            i += 1
            continue
        if alias is None:
            kept.append(arg)
            i += 1
            continue
        if flag in _SWITCHES:
            value, i = "", i + 1
        elif "=" in arg:
            value, i = arg.split("=", 1)[1], i + 1
        else:
            value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 2
        name = alias.name(value, argv)
        if name is not None:
            named.append((f"{flag} {value}".strip(), name))
    if not named:
        return kept, None
    flags, names = [flag for flag, _ in named], list(dict.fromkeys(name for _, name in named))
    if len(names) > 1:
        raise ValueError(f"{flags[0]} and {flags[1]} are two posteriors: choose one --method")
    explicit = _named(kept)
    if explicit is not None and explicit != names[0]:
        raise ValueError(f"{' '.join(flags)} stands for --method {names[0]}, and --method {explicit} names another: "
                         "choose one")
    warnings.warn(f"{' '.join(flags)} is deprecated: write --method {names[0]} (its paper's settings; the former flag "
                  "takes the command's defaults, as it did)", DeprecationWarning, stacklevel=2)
    return kept, names[0]


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
    values = _settings_values(method)
    missing = [flag for flag in values if flag not in flags and values[flag] != _DEFAULTS.get(flag, object())]
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


_DEFAULTS = _settings_values(Variational())
"""The settings of :class:`~pyrobnn.methods.Method`'s defaults as option values (what a preset need not carry)."""


def _own_fields(method) -> list[dataclasses.Field]:
    common = {f.name for f in dataclasses.fields(Method)}
    return [field for field in dataclasses.fields(method) if field.name not in common]


def _kind(method) -> Optional[str]:
    cls = method if isinstance(method, type) else type(method)
    return next((prefix for kind, prefix in KINDS.items() if issubclass(cls, kind)), None)


def _own_flag(method, name: str, flags) -> Optional[str]:
    """The option of the method's own field ``name`` among ``flags`` (None: it has none)."""
    prefix = _kind(method)
    for flag in (RENAMED.get(name), f"--{prefix}.{name.replace('_', '-')}" if prefix else None,
                 f"--{name.replace('_', '-')}"):
        if flag in flags:
            return flag
    return None


def flag_of(method, field: str, command: str = "train") -> str:
    """The option of ``method``'s setting ``field`` (a refusal's ``{field}``) on ``pyrobnn <command>``: its own
    field's option, a common setting's (:data:`SETTINGS`), ``--prior.*`` / ``--guide.*`` / ``--likelihood.*`` for a
    field of those, else ``--<field>``."""
    flags = _command_flags(command)
    own = _own_flag(method, field, flags) if "." not in field else None
    if own is not None:
        return own
    if field in SETTINGS:
        return SETTINGS[field]
    group, _, name = field.partition(".")
    if group in ("prior", "guide", "likelihood") and name:
        return f"--{group}.{GUIDE_ARGUMENTS.get(name, name).replace('_', '-')}"
    return f"--{field.replace('_', '-')}"


def spelled(refusal: Refused, command: str = "train") -> str:
    """What ``refusal``'s method refuses, its settings named as ``pyrobnn <command>``'s options (:func:`flag_of`)."""
    return refusal.spelled(lambda field: flag_of(refusal.method, field, command))


def method_args(name: str | Method, flags: Optional[set[str]] = None) -> tuple[str, ...]:
    """The option values method ``name`` (a name or a :class:`~pyrobnn.methods.Method`) stands for, as arguments of
    its command (:attr:`Method.command`): :func:`settings_args` and its own fields that have options (``flags``: the
    command's options, default those of its configuration)."""
    method = name if isinstance(name, Method) else resolve_method(name)
    flags = _command_flags(method.command) if flags is None else flags
    values = settings_args(method, flags)
    for field in _own_fields(method):
        flag = _own_flag(method, field.name, flags)
        if flag is not None:
            values[flag] = getattr(method, field.name)
    if method.command == "train":  # the report's draws stay the method's (run_method): unset, they fit the run
        values.pop("--num-samples", None)
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
    if isinstance(value, bool):  # tyro's negation: --no-augment, --prior.no-fan-in
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
    ``["train", *method_args("bbb"), "--method", "bbb", "--epochs", "3"]``. A former selector flag
    (:data:`ALIASES`) becomes ``--method NAME`` without the preset's arguments (the command's defaults, as before).

    A pretrained network (``--model hf:...``) takes the method's settings for a first fine-tune
    (:func:`pyrobnn.methods.finetuned`), the method's own or ``train``'s defaults' (without ``--method``).

    ``argv`` is returned unchanged without ``--method``, for an unknown method, or for one that another command
    runs: the run's checks (:func:`pyrobnn.cli.build.check_run`) then report it as one error line. A command outside
    :data:`RECORDING_COMMANDS` gets the arguments without ``--method NAME`` itself.
    """
    if argv[:1] == ["train"]:
        rest, aliased = resolve_aliases(argv[1:])
        if aliased is not None:
            return ["train", *[arg for i, arg in enumerate(rest) if not _is_method(rest, i)], "--method", aliased]
    name = _named(argv[1:]) if argv else None
    try:
        method = resolve_method(name) if name is not None else None
    except ValueError:
        return list(argv)
    pretrained = argv[:1] == ["train"] and _pretrained(_named(argv[1:], "--model", ""))
    if method is None and pretrained:
        tuned = finetuned(Variational())
        values = {**_optimizer_args(tuned.optimizer), "--batch-size": tuned.batch_size}
        return [argv[0], *(arg for flag, value in values.items() for arg in _argv(flag, value)), *argv[1:]]
    if method is None or method.command != argv[0]:
        return list(argv)
    rest = argv[1:]
    if argv[0] not in RECORDING_COMMANDS:
        rest = [arg for i, arg in enumerate(rest) if not _is_method(rest, i)]
    return [argv[0], *method_args(finetuned(method) if pretrained else method), *rest]


def _pretrained(model: str) -> bool:
    """Whether ``--model`` names a pretrained network (:func:`~pyrobnn.networks.network_spec`; a name it does not
    know is the run's checks' to report)."""
    try:
        return network_spec(model).pretrained
    except ValueError:
        return False


def _is_method(argv: list[str], i: int) -> bool:
    arg = argv[i]
    return arg == "--method" or arg.startswith("--method=") or (i > 0 and argv[i - 1] == "--method")


def run_method(cfg, settings: dict) -> Method:
    """The method a parsed ``pyrobnn train`` configuration trains, built once: the named method (else
    :class:`~pyrobnn.methods.Variational`) with ``settings`` (the prior, guide, β schedule and optimiser the options
    build: :func:`pyrobnn.cli.build.settings_of`) and every own field that has an option read from the options. What
    the method refuses is a ``ValueError`` naming the options (:func:`spelled`)."""
    base = resolve_method(cfg.method) if cfg.method is not None else Variational()
    if base.command != "train":
        raise ValueError(f"--method {cfg.method} runs with `pyrobnn {base.command}`, not `pyrobnn train`: "
                         f"pyrobnn {base.command} --method {cfg.method} --dataset two-moons ...")
    flags = cfg.flags()
    _refuse_other_kinds(base, flags)
    values = {field.name: flags[flag] for field in _own_fields(base)
              if (flag := _own_flag(base, field.name, flags)) is not None}
    common = {name: value for name, value in settings.items() if name in {f.name for f in dataclasses.fields(Method)}}
    if not base.takes_optimizer:
        _refuse_an_optimizer(base, cfg, flags)
        del common["optimizer"]
    try:
        return dataclasses.replace(base, **common, **values)
    except Refused as refusal:
        raise ValueError(spelled(refusal)) from None


def _refuse_other_kinds(method: Method, flags: dict) -> None:
    """An option of another kind of method than ``method``'s (``--swag.rank`` for MC dropout) set: a ValueError."""
    defaults = RunConfig().flags()
    for cls, prefix in KINDS.items():
        if isinstance(method, cls):
            continue
        changed = [flag for flag, value in flags.items() if flag.startswith(f"--{prefix}.") and value != defaults[flag]]
        if changed:
            names = [name for name, m in METHODS.items() if isinstance(m, cls)]
            raise ValueError(f"{changed[0]} sets {cls.__name__}'s {changed[0].split('.', 1)[1]}: it applies to "
                             f"--method {' or '.join(names)}")


def _refuse_an_optimizer(method: Method, cfg, flags: dict) -> None:
    """Options of an optimiser set for a method that is its own (IVON): a ValueError naming the first."""
    defaults = RunConfig().flags()
    for flag in ("--optimizer", "--lr-step", "--lr-linear-from", "--variational-lr-factor"):
        if flags[flag] != defaults[flag]:
            raise ValueError(f"{flag} does not apply to --method {cfg.method}: {type(method).__name__} is its own "
                             "optimiser (its rate is --lr)")


def former_selectors(method: Optional[Method]) -> dict[str, Any]:
    """The values the former selector options had for a run of ``method`` (``--ensemble``, ``--laplace``,
    ``--swag``, ``--sgmcmc``): what a study's cache key held, so that the cells cached before keep their keys."""
    swag = isinstance(method, SWAG)
    members = getattr(method, "members", 0) if isinstance(method, (Ensemble, SWAG)) else 0
    return {"--ensemble": 0 if swag and members == 1 else members, "--laplace": isinstance(method, Laplace),
            "--swag": swag, "--sgmcmc": method.sampler if isinstance(method, SGMCMC) else "none"}


def legacy_config(values: dict) -> dict:
    """A stored configuration of a former version (its ``posterior`` group: the selector options and SWAG's and
    SG-MCMC's) as today's: the method its selectors named (unless it names one) and the options of its kinds."""
    values = dict(values)
    post = values.pop("posterior", None)
    if not isinstance(post, dict):
        return values
    argv = [*(["--ensemble", str(post.get("ensemble", 0))]), *(["--laplace"] if post.get("laplace") else []),
            *(["--swag"] if post.get("swag") else []), "--sgmcmc", str(post.get("sgmcmc", "none"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _, name = resolve_aliases(argv)
    if values.get("method") is None:
        values["method"] = name
    own = {key: value for key, value in post.items() if key.startswith(("swag_", "sgmcmc_"))}
    values["method_options"] = {**own, **(values.get("method_options") or {})}
    return values


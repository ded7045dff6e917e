"""A study's cell: one ``pyrobnn train`` command line (``pyrobnn mcmc`` for a method that samples), parsed and
checked as that command would, and its cache key.

A cell's arguments are its label's settings (a study file's ``[settings]``), the study's base arguments, then one
value of each axis (``--guide dropout``), then its replicate (``--seed 2``, ``--split 1``): later arguments win, so
an axis overrides the base and the base a label's settings. A ``--method NAME`` among them stays as written (the
replay command reads ``pyrobnn train --method bbb ...``) and is expanded, as the command line expands it, by
:func:`pyrobnn.cli.methods.expand_method`: the preset's arguments first, the user's after them. Every option of the
base reaches every cell, its ``--lr`` a SWAG cell's SGD too (a rate the method cannot take stops the study in one
line naming the option that sets the method's), except the options of another kind of method (``--swag.lr`` in an
MC dropout cell). A method that another command runs (``nuts``: ``pyrobnn mcmc``) keeps the base and axis options
that command takes and drops the others (``--epochs``, ``--lr``). ``--num-samples`` is the number of draws there: a
base that names the sampling method itself sets it, a base written for ``pyrobnn train`` (the method from an axis)
does not, and the preset's stands (:data:`_OTHER_MEANING`).

The cache key is a hash of everything that changes what the cell trains or measures: every option of its parsed
configuration except :data:`NOT_IN_KEY`, and the command.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import re
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import tyro

from pyrobnn.cli import mcmc, parse_config, train
from pyrobnn.cli.build import check_mcmc, check_run, dataset_options, method_of
from pyrobnn.cli.methods import KINDS, expand_method, former_selectors
from pyrobnn.cli.noise import default_noise_applies
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.data import check_dataset
from pyrobnn.methods import resolve_method

__all__ = ["Cell", "CONFIGS", "RUNS", "NOT_IN_KEY", "KEYED_WHEN_SET", "keyed_when_set", "EXECUTOR_KEY", "STUDY_SETS",
           "LIST_OPTIONS", "make_cell", "parse_cell", "cache_key", "accepted_options", "split_options",
           "axis_arguments", "check_axis"]

CONFIGS = {"train": RunConfig, "mcmc": MCMCConfig}
"""The commands a cell runs -> the configuration each parses."""

RUNS = {"train": train, "mcmc": mcmc}
"""The commands a cell runs -> the function that runs a parsed configuration."""

_CHECKS = {"train": check_run, "mcmc": check_mcmc}

NOT_IN_KEY = ("--out", "--progress", "--device", "--data-root", "--overwrite", "--resume", "--max-memory")
"""Options that change neither what a cell trains nor what it measures, left out of its cache key: where it is
written and shown, where it runs and reads data, and the memory of a prediction pass (the same numbers in smaller
passes). Unlike :data:`pyrobnn.cli.options.RESUMABLE`, ``--epochs``, ``--num-samples`` and the extra test sets
count: they change the results."""

KEYED_WHEN_SET = ("--data.target", "--data.task", "--data.features", "--data.categorical", "--data.folds",
                  "--data.test-fraction", "--data.seed", "--calibrate", "--calibrate.fraction", "--calibrate.coverage",
                  "--swag", "--sgmcmc", "--data.max-length", "--lora-rank", "--lora-alpha", "--lora-targets",
                  "--kl-lr")
"""Options added after studies had cached cells: at their default they change nothing that a cell trains or
measures, so they enter its key only when set, and the cells cached before they existed keep their keys (an option
added later joins this list). So do a method's own options (:func:`keyed_when_set`)."""


def keyed_when_set(flag: str) -> bool:
    """Whether ``flag`` enters a cell's key only when set: one of :data:`KEYED_WHEN_SET`, or a method's own option,
    ``--<kind>.<field>`` of a kind of :data:`pyrobnn.cli.methods.KINDS` (``--swag.rank``, ``--ivon.ess``): at its
    default it is the method's preset, and a new method's options leave the cells cached before it their keys."""
    return flag in KEYED_WHEN_SET or ("." in flag and flag[2:].split(".", 1)[0] in KINDS.values())

STUDY_SETS = ("--out", "--progress", "--overwrite", "--resume")
"""Options the study sets for every cell (its directory, no progress bars, replace a half-written run)."""

_OTHER_MEANING = ("--num-samples",)
"""Options ``pyrobnn mcmc`` takes with another meaning than ``pyrobnn train`` (draws per chain, not predictive
samples). A base that names a sampling method itself (``--method nuts``: every cell samples) was written for
``pyrobnn mcmc`` and keeps them; a base whose sampling method comes from an axis was written for ``pyrobnn train``,
and its values of them never reach an mcmc cell (a label's own settings, written for its method, always do)."""


@dataclass
class Cell:
    """One run of a study: the command (``train`` or ``mcmc``), its arguments (``argv``, as typed: ``--method`` not
    expanded, without the options the study sets), the values of the study's axes, its label, seed, split and cache
    key."""

    command: str
    argv: tuple[str, ...]
    label: str
    axes: dict[str, str] = field(default_factory=dict)
    seed: Optional[int] = None
    split: Optional[int] = None
    key: str = ""

    def directory(self, out: Path) -> Path:
        """Where the cell's run is written: ``<out>/cells/<key>``."""
        return Path(out) / "cells" / self.key

    def run_argv(self, out: Path, force: bool = False) -> list[str]:
        """The arguments the study runs: the cell's, written to :meth:`directory`, without progress bars; a train
        cell replaces what an interrupted run left there, resuming from its checkpoint unless ``force``."""
        directory = self.directory(out)
        argv = [*self.argv, "--out", str(directory), "--no-progress"]
        if self.command == "train":
            argv += ["--overwrite"] + ([] if force or not (directory / "checkpoint.pt").exists() else ["--resume"])
        return argv

    def replay(self, out: Path) -> str:
        """The shell command that reruns this cell alone, into its own directory."""
        extra = ["--overwrite"] if self.command == "train" else []
        return shlex.join(["pyrobnn", self.command, *self.argv, "--out", str(self.directory(out)), *extra])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Cell":
        return cls(**{**values, "argv": tuple(values["argv"])})


def _suppressed(group, name: str) -> bool:
    """Is option ``name`` of the option group ``group`` hidden from the command line (``tyro.conf.Suppress``)?"""
    hint = typing.get_type_hints(type(group), include_extras=True)[name]
    return tyro.conf.Suppress in getattr(hint, "__metadata__", ())


@functools.lru_cache(maxsize=None)
def accepted_options(command: str) -> dict[str, object]:
    """``{flag: default}`` of every option the command line of ``command`` takes (do not modify it)."""
    return {flag: getattr(group, name) for flag, (group, name) in CONFIGS[command]().fields().items()
            if not _suppressed(group, name)}


def parse_cell(command: str, argv: typing.Sequence[str]):
    """The configuration ``pyrobnn <command> <argv>`` runs (``--method NAME`` expanded as the command line does); a
    :class:`ValueError` holding tyro's message on one line when it does not parse. A train cell without
    ``--num-samples`` reports the method's draws: a study's cells measure the same on every machine (the command
    line sizes an unset report to the run, :func:`pyrobnn.cli.runs.report_draws`), keyed as they always were."""
    config = parse_config(CONFIGS[command], expand_method([command, *argv])[1:], f"pyrobnn {command}")
    if command == "train" and config.output.num_samples is None:
        config.output.num_samples = method_of(config).num_samples
    return config


def split_options(argv: typing.Sequence[str]) -> list[tuple[str, list[str]]]:
    """``argv`` as ``(flag, tokens)`` per option: ``--hidden 400 400`` -> ``("--hidden", ["--hidden", "400",
    "400"])``; ``--no-augment`` and ``--prior.no-bias`` name the flags ``--augment`` and ``--prior.bias``; tokens
    before the first option come as flag ``""``."""
    found: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            name = token.split("=", 1)[0][2:]
            head, dot, tail = name.rpartition(".")
            found.append(("--" + head + dot + tail.removeprefix("no-"), [token]))
        elif found:
            found[-1][1].append(token)
        else:
            found.append(("", [token]))
    return found


def _negated(flag: str) -> str:
    head, dot, tail = flag[2:].rpartition(".")
    return f"--{head}{dot}no-{tail}"


def axis_arguments(command: str, name: str, value: str) -> list[str]:
    """The arguments of axis ``name`` at ``value``: ``["--guide", "dropout"]``; a value of several words gives several
    arguments (``hidden="800 800"``); ``true``/``false`` of a switch give ``--augment`` / ``--no-augment``."""
    flag = "--" + name
    options = accepted_options(command)
    if isinstance(options.get(flag), bool):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"--vary {name}={value}: {flag} is a switch; its values are true and false")
        return [flag if value.lower() == "true" else _negated(flag)]
    return [flag, *value.split()]


def check_axis(name: str) -> None:
    """Refuse an axis that no cell command takes, naming the closest options."""
    flag = "--" + name
    known = {f for command in CONFIGS for f in accepted_options(command)}
    if flag in STUDY_SETS or flag in ("--seed", "--split"):
        replicate = {"--seed": " (vary seeds with --seeds N)", "--split": " (vary splits with --splits N)"}
        raise ValueError(f"--vary {name}: the study sets {flag} for every cell{replicate.get(flag, '')}")
    if flag not in known:
        close = difflib.get_close_matches(flag, sorted(known), n=3)
        hint = f"; did you mean {', '.join(f[2:] for f in close)}?" if close else ""
        raise ValueError(f"--vary {name}: pyrobnn train has no option {flag}{hint}")


@functools.lru_cache(maxsize=None)
def _defaults(command: str) -> dict[str, object]:
    return CONFIGS[command]().flags()


EXECUTOR_KEY = {"train": {"--compile": "none"}, "mcmc": {"--compiler": "auto", "--jit": False}}
"""How a cell's step runs (``--compile``: every executor gives the same numbers) is no part of its key; its key
holds these values, the executor options' defaults before they became one ``--compile``, so that the cells cached
before keep their keys."""


FORMER_NOISE = 0.1
"""The ``--likelihood.scale`` in the key of a ``train`` cell that leaves it unset and whose run did not change when a
regression's noise became learned by default (:mod:`pyrobnn.cli.noise`): a classifier, a heteroscedastic regression,
a noise its ``--grid`` sets. It was their default, so the cells cached before keep their keys; a cell whose noise is
the new default (:func:`~pyrobnn.cli.noise.default_noise_applies`) is keyed ``"default"``, and trains again."""


def _noise_key(config) -> float | str:
    task = check_dataset(config.data.dataset, config.data.data_root, **dataset_options(config))  # a table: read once
    return "default" if default_noise_applies(config, task) else FORMER_NOISE


FORMER_SELECTORS = {"--ensemble": 0, "--laplace": False, "--swag": False, "--sgmcmc": "none"}
"""The options that once picked a method beside ``--method`` (:data:`pyrobnn.cli.methods.ALIASES`) and their
defaults: a ``train`` cell's key holds their values for its method (:func:`~pyrobnn.cli.methods.former_selectors`),
so that the cells cached before they became aliases keep their keys."""


def cache_key(command: str, config, method=None) -> str:
    """sha256 (first 12 hex digits) of the command and every option of ``config`` except :data:`NOT_IN_KEY`, those
    :func:`keyed_when_set` at their default, and the executor (:data:`EXECUTOR_KEY`), as canonical JSON (sorted
    keys); an unset noise as :data:`FORMER_NOISE` or ``"default"``, unset draws as the method's; a ``train`` cell's
    former selector options of its ``method`` (:data:`FORMER_SELECTORS`; default: the method its options build)."""
    defaults = {**_defaults(command), **FORMER_SELECTORS}
    flags = config.flags()
    if command == "train":
        method = method_of(config) if method is None else method
        flags.update(former_selectors(method))
    options = {flag: value for flag, value in flags.items()
               if flag not in NOT_IN_KEY and flag != "--compile"
               and not (keyed_when_set(flag) and value == defaults[flag])}
    options.update(EXECUTOR_KEY[command])
    if command == "train" and config.likelihood.scale is None:
        options["--likelihood.scale"] = _noise_key(config)
    if command == "train" and config.output.num_samples is None:  # the method's draws, as parse_cell runs them
        options["--num-samples"] = method.num_samples
    text = json.dumps({"command": command, "options": options}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _method_of(arguments: list[str]) -> Optional[str]:
    names = [tokens[1] if len(tokens) > 1 else tokens[0].partition("=")[2]
             for flag, tokens in split_options(arguments) if flag == "--method"]
    return names[-1] if names else None


LIST_OPTIONS = ("--grid",)
"""Options whose values are a list of entries: a label's settings add their entries to the base's (``--grid
protocol`` in the base and ``--grid likelihood=gaussian,heteroscedastic`` in one method's settings search both)."""


def _merged_lists(settings: typing.Sequence[str], base: typing.Sequence[str]) -> tuple[list[str], list[str]]:
    """``(settings, base)`` with the entries of every :data:`LIST_OPTIONS` flag that both set moved from the
    settings to the end of the base's."""
    in_settings, in_base = split_options(settings), split_options(base)
    shared = {flag for flag, _ in in_settings} & {flag for flag, _ in in_base} & set(LIST_OPTIONS)
    extra = {flag: tokens[1:] for flag, tokens in in_settings if flag in shared}
    kept = [token for flag, tokens in in_settings if flag not in shared for token in tokens]
    joined = [token for flag, tokens in in_base for token in (tokens + extra.pop(flag, []) if flag in shared
                                                               else tokens)]
    return kept, joined


def _for_its_method(base: typing.Sequence[str], method) -> list[str]:
    """``base`` without the options of another kind of method than ``method``'s own (``--swag.lr`` in the cells of
    MC dropout: a study's base may hold SWAG's rate for its SWAG cells, and it means nothing to the others; every
    other option of the base, its ``--lr`` included, reaches every cell)."""
    foreign = tuple(f"--{prefix}." for cls, prefix in KINDS.items() if not isinstance(method, cls))
    return [token for flag, tokens in split_options(base) if not flag.startswith(foreign) for token in tokens]


def _how_a_study_sets(message: str) -> str:
    """How a study sets the options of a kind of method that ``message`` names (``--swag.lr``), for that method's
    cells alone: in its base (they reach only the cells of their kind), or as an axis."""
    prefixes = "|".join(re.escape(prefix) for prefix in KINDS.values())
    flags = list(dict.fromkeys(re.findall(rf"--(?:{prefixes})\.[a-z0-9-]+", message)))
    if not flags:
        return ""
    return (f" (a study sets {flags[0]} for its cells of that method: {flags[0]} V in its base, or --vary "
            f"{flags[0][2:]}=V1,V2)")


def make_cell(base: typing.Sequence[str], axes: dict[str, str], replicate: dict[str, int], label: str,
              settings: typing.Sequence[str] = ()) -> Cell:
    """The cell of ``base`` at ``axes`` (``{option name: value}``) and ``replicate`` (``{"seed": 2}``), parsed and
    checked as its command would (a :class:`ValueError` naming the cell and the problem otherwise). ``settings``:
    the label's own arguments, placed before the base (after a method's preset, once expanded), so that the preset
    is refined by them and the base and the axes win over them; entries of a list option (:data:`LIST_OPTIONS`) add
    to the base's."""
    where = " ".join([repr(label), *(f"{name} {value}" for name, value in replicate.items())])
    method = axes.get("method")
    try:
        if method is not None:
            resolve_method(method)  # the registry's error names the known methods
        name = _method_of([*base, *(["--method", method] if method else [])])
        command = resolve_method(name).command if name else "train"
        if name is not None:
            base = _for_its_method(base, resolve_method(name))
        settings, base = _merged_lists(settings, base)
        arguments = list(base)
        for axis, value in axes.items():
            arguments += axis_arguments("mcmc" if axis != "method" and command == "mcmc" else "train", axis, value)
        for option, value in replicate.items():
            arguments += [f"--{option}", str(value)]
        if command != "train" and _method_of(list(base)) != name:  # written for train: its other meanings are train's
            arguments = [token for flag, tokens in split_options(arguments) if flag not in _OTHER_MEANING
                         for token in tokens]
        arguments = [*settings, *arguments]
        if command != "train":  # keep what the command takes
            takes = set(accepted_options(command)) | {"--method"}
            arguments = [token for flag, tokens in split_options(arguments) if flag in takes for token in tokens]
        config = parse_cell(command, arguments)
        checked = _CHECKS[command](config)
    except ValueError as error:
        raise ValueError(f"study cell {where}: {error}{_how_a_study_sets(str(error))}") from None
    flags = config.flags()
    return Cell(command, tuple(arguments), label, dict(axes), flags.get("--seed"), flags.get("--split"),
                cache_key(command, config, checked.method if command == "train" else None))

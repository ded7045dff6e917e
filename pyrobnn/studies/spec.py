"""A study: a base ``pyrobnn train`` run crossed with axes (any train option, or ``method``) and replicates (seeds
or the fixed splits of a dataset), written in Python, as a TOML file, or on the command line.

.. code-block:: python

    from pyrobnn.studies import Study
    study = Study(base=["--dataset", "mnist", "--train-size", "2000", "--epochs", "1"],
                  vary={"guide": ["normal", "dropout"], "estimator": ["sample", "local"]}, seeds=3)
    records = study.run("runs/ablation", workers=2)

Arrays or a DataFrame held in Python are a study's data set (``data=``: ``(x, y)``, ``{column: values}`` or a
DataFrame, as :func:`pyrobnn.data.tables.as_data` takes them): the study writes them once, named by their content,
to ``<out>/data/<hash>.npz``, and every cell reads that file (``--dataset npz:...``), in worker processes and on Dask
workers alike (which cannot see this process's memory)::

    study = Study(base=["--epochs", "100", "--hidden", "50"], data=(x, y), splits=5,
                  vary={"method": ["mcdropout", "bbb"]})
    study.run("runs/mine", workers=2)

The same study as a file (``pyrobnn study --file ablation.toml``)::

    [study]
    name = "ablation"
    seeds = 3
    base = ["--dataset", "mnist", "--train-size", "2000", "--epochs", "1"]

    [vary]
    guide = ["normal", "dropout"]
    estimator = ["sample", "local"]

A file may add the paper's figures (``[published]``: a source and, per label, ``metric = value``; see
:mod:`pyrobnn.studies.published`), shown beside the study's in its report, and named configurations whose base
arguments are appended to the study's and whose axes add to (or replace) its own (``pyrobnn study --file F
--configuration gpu``; default: ``[study] default_configuration``, else ``cpu``); a published figure may name a label
of any configuration::

    [study]
    default_configuration = "cpu"
    base = ["--dataset", "mnist", "--epochs", "20"]

    [configurations.cpu]
    base = ["--train-size", "10000"]

    [configurations.gpu]
    base = ["--epochs", "300"]
    vary = { hidden = [400, 1200] }

    [published]
    source = "Rahmanto (paper 003), Table 2"
    bbb = { accuracy = 0.9807 }
    mcdropout = { error = 0.0157 }

A file may also give some labels arguments of their own (``[settings]``, keyed like ``[published]``; a
configuration's ``settings`` add to them): a paper's settings for one method, which the study's base (it applies to
every cell) cannot hold. They refine the method's preset; the base, the axes and the command line win over them,
except that a label's ``--grid`` entries add to the base's grid::

    [settings]
    "method=mcdropout" = ["--guide.rate", "0.1", "--guide.rates", "net.0.*=0", "--lr", "0.01"]

Axis values are written as on the command line (``"800 800"`` or ``[800, 800]`` for ``hidden``, ``true`` /
``false`` for a switch); dotted option names are quoted keys or tables (``"prior.scale" = [0.1, 1.0]``).
"""

from __future__ import annotations

import dataclasses
import itertools
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from pyrobnn.checks import positive_int
from pyrobnn.data.tables import fingerprint, save_arrays
from pyrobnn.files import check_writable
from pyrobnn.methods import resolve_method
from pyrobnn.studies.baseline import resolve_baseline
from pyrobnn.studies.cells import LIST_OPTIONS, Cell, axis_arguments, check_axis, make_cell, split_options
from pyrobnn.studies.published import check_published, known_keys, label_keys, unmatched_keys
from pyrobnn.studies.runner import run_study

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Study", "parse_axis", "load_study", "DATA_AXES"]

STUDY_KEYS = ("name", "base", "seeds", "splits", "baseline", "out", "default_configuration")
"""The keys of a study file's ``[study]`` table."""

TABLES = ("study", "vary", "published", "settings", "configurations")
"""The tables of a study file."""

CONFIGURATION_KEYS = ("base", "vary", "settings")
"""The keys of a study file's ``[configurations.NAME]`` tables: base arguments appended to the study's, axes
added to (or replacing) its ``[vary]``, and labels' settings appended to its ``[settings]``."""

STUDY_OWNED = ("--out", "--overwrite", "--resume")
"""Options the study sets for every cell, refused in its base and in a label's settings."""

SETTINGS_REFUSED = ("--method", "--seed", "--split", *STUDY_OWNED)
"""Options a label's settings may not set: the label, the replicate and the study choose them."""

DEFAULT_CONFIGURATION = "cpu"
"""The configuration a file with ``[configurations]`` runs when neither the command line nor
``default_configuration`` names one."""

_REPLICATES = {"seeds": "seed", "splits": "split"}
"""A study's replicate counts -> the option each sets in its cells."""

DATA_AXES = ("dataset", "data-root", "data.target", "data.task", "test-size", "data.test-fraction", "data.folds",
             "data.seed")
"""Axes that change which examples a cell is tested on: a difference between two of their values compares two
problems, not two methods, so the default baseline is matched within them (:meth:`Study.resolved_baseline`)."""


def _text(value, where: str) -> str:
    """An axis value or base argument as typed on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float, Path)):
        return str(value)
    if isinstance(value, (list, tuple)) and value and all(not isinstance(v, (list, tuple, dict)) for v in value):
        return " ".join(_text(v, where) for v in value)
    raise ValueError(f"{where}: {value!r} is not a value of an option (a string, number, true/false, or a list of "
                     "them for an option of several values)")


def _unmatched(key: str, labels: Sequence[str], more: str = "", table: str = "published") -> ValueError:
    """The error of a ``[published]`` (or ``[settings]``) key that names no label."""
    return ValueError(f"[{table}] {key!r}: names no label of this study; give a label, an axis value or "
                      "NAME=VALUE; its labels are " + ", ".join(repr(label) for label in labels) + more)


def parse_axis(text: str) -> tuple[str, list[str]]:
    """``"guide=normal,dropout"`` -> ``("guide", ["normal", "dropout"])``: an option name (without ``--``) and its
    comma-separated values."""
    name, equals, values = text.partition("=")
    name = name.strip().removeprefix("--")
    if not equals or not name:
        raise ValueError(f"--vary {text!r}: write NAME=VALUE,VALUE,..., e.g. --vary guide=normal,dropout")
    items = [value.strip() for value in values.split(",")] if values.strip() else []
    return name, items


@dataclass
class Study:
    """A base run, axes to vary and replicates: the cells are every combination of one value per axis, each run
    with ``seed`` 0..``seeds``-1 (and/or ``split`` 0..``splits``-1), as ``pyrobnn train`` command lines.

    :param base: ``pyrobnn train`` arguments shared by every cell (a list, or one string split as a shell would).
    :param vary: ``{option name: values}``, e.g. ``{"guide": ["normal", "dropout"], "method": ["bbb", "map"]}``;
        ``method`` names presets of :data:`pyrobnn.methods.METHODS`.
    :param seeds: run each combination with ``--seed 0`` .. ``--seed seeds-1`` (None: the base's seed).
    :param splits: run each combination on ``--split 0`` .. ``--split splits-1`` (datasets with fixed splits).
    :param baseline: the label the others are compared with, or ``name=value`` pairs of some axes
        (``"method=mcdropout"``): each label is then compared with the label of the same other axes' values
        (:mod:`pyrobnn.studies.baseline`). Default: the first label, matched within the data axes
        (:data:`DATA_AXES`): with ``dataset`` and ``method`` axes, each data set's methods against that data set's
        first method.
    :param name: the study's name: the label of a study without axes, and its default folder ``runs/<name>``.
    :param out: the study's folder (default ``runs/<name>``).
    :param published: a paper's figures, ``{"source": "paper, table", label or axis value: {metric: value}}``
        (:mod:`pyrobnn.studies.published`); a key that names no label is a :class:`ValueError`.
    :param configuration: the name of the study file's configuration whose base arguments are in ``base`` (the
        report records it).
    :param settings: ``{label key (as in published): [train arguments]}``, the arguments of the cells of that label
        (every key that names a cell's label, shortest first), before the base
        (:func:`~pyrobnn.studies.cells.make_cell`); a key that names no label is a :class:`ValueError`.
    :param data: in-memory data for every cell instead of ``--dataset``: ``(x, y)``, ``{"x": x, "y": y}``,
        ``{column: values}`` or a DataFrame (:func:`~pyrobnn.data.tables.as_data`; ``--data.target`` and the other
        data options apply as to a file). Checked when the study is made; written once to
        :meth:`data_file` when its cells are made.

    Example: two methods, two seeds each, as four ``pyrobnn train`` cells (:meth:`run` runs them).

    >>> from pyrobnn.studies import Study
    >>> study = Study(base="--dataset two-moons --train-size 100 --test-size 100 --epochs 1",
    ...               vary={"method": ["bbb", "map"]}, seeds=2, name="moons")
    >>> study.labels(), study.resolved_baseline(), str(study.folder())
    (['bbb', 'map'], 'bbb', 'runs/moons')
    >>> [(cell.label, cell.seed) for cell in study.cells()]
    [('bbb', 0), ('bbb', 1), ('map', 0), ('map', 1)]
    >>> " ".join(study.cells()[0].argv)
    '--dataset two-moons --train-size 100 --test-size 100 --epochs 1 --method bbb --seed 0'
    """

    base: Union[str, Sequence] = ()
    vary: Mapping[str, Sequence] = field(default_factory=dict)
    seeds: Optional[int] = None
    splits: Optional[int] = None
    baseline: Optional[str] = None
    name: str = "study"
    out: Optional[Path] = None
    published: Mapping = field(default_factory=dict)
    configuration: Optional[str] = None
    settings: Mapping[str, Sequence] = field(default_factory=dict)
    data: object = field(default=None, repr=False)

    def __post_init__(self):
        base = shlex.split(self.base) if isinstance(self.base, str) else self.base
        if not isinstance(base, (list, tuple)):
            raise ValueError(f"base must be a list of pyrobnn train arguments, got {self.base!r}")
        self.base = tuple(_text(argument, "base") for argument in base)
        for count in _REPLICATES:
            if getattr(self, count) is not None:
                setattr(self, count, positive_int(f"--{count} (the number of {count})", getattr(self, count)))
        if not isinstance(self.vary, Mapping):
            raise ValueError(f"vary must map option names to lists of values, got {self.vary!r}")
        self.vary = {str(name).removeprefix("--"): self._axis(str(name).removeprefix("--"), values)
                     for name, values in self.vary.items()}
        self._check_base()
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        self.out = None if self.out is None else Path(self.out)
        self.published = check_published(self.published)
        unknown = unmatched_keys(self.published, self._combinations(), self.name)
        if unknown:
            raise _unmatched(unknown[0], self.labels())
        self.settings = self._checked_settings(self.settings)
        known = known_keys(self._combinations(), self.name)
        unknown = [key for key in self.settings if key not in known]
        if unknown:
            raise _unmatched(unknown[0], self.labels(), table="settings")
        if self.configuration is not None and not isinstance(self.configuration, str):
            raise ValueError(f"configuration must be a name (a string), got {self.configuration!r}")
        self._data_hash = None if self.data is None else fingerprint(self.data)  # checks the data
        if self.data is not None and ("--dataset" in {flag for flag, _ in split_options(self.base)}
                                      or "dataset" in self.vary):
            raise ValueError("data= and --dataset both name the study's data set: give one")

    @staticmethod
    def _axis(name: str, values) -> tuple[str, ...]:
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
            raise ValueError(f"--vary {name}: give a list of values, got {values!r}")
        if not values:
            raise ValueError(f"--vary {name}: the axis has no values; give at least one, e.g. {name}=A,B")
        texts = tuple(_text(value, f"--vary {name}") for value in values)
        if any(not text.strip() for text in texts):
            raise ValueError(f"--vary {name}={','.join(texts)}: an empty value")
        repeated = sorted({text for text in texts if texts.count(text) > 1})
        if repeated:
            raise ValueError(f"--vary {name}: {', '.join(repeated)} given twice")
        check_axis(name)
        for text in texts:
            axis_arguments("train", name, text)  # a switch takes true or false
        if name == "method":
            for text in texts:
                try:
                    resolve_method(text)
                except ValueError as error:
                    raise ValueError(f"--vary method={text}: {str(error).removeprefix(f'--method {text}: ')}") \
                        from None
        return texts

    @staticmethod
    def _checked_settings(settings) -> dict[str, tuple[str, ...]]:
        """``settings`` as ``{key: arguments}``, each list of arguments as typed (a string is split as a shell
        would); an option the label or the study sets (:data:`SETTINGS_REFUSED`) is refused."""
        if not isinstance(settings, Mapping):
            raise ValueError(f"settings must map a label to pyrobnn train arguments, got {settings!r}")
        checked = {}
        for key, arguments in settings.items():
            where = f"[settings] {key!r}"
            if isinstance(arguments, str):
                arguments = shlex.split(arguments)
            if not isinstance(arguments, (list, tuple)):
                raise ValueError(f"{where}: give a list of pyrobnn train arguments, got {arguments!r}")
            checked[str(key)] = tuple(_text(argument, where) for argument in arguments)
            for flag, _ in split_options(checked[str(key)]):
                if flag in SETTINGS_REFUSED:
                    raise ValueError(f"{where} sets {flag}, which the study sets for each cell: drop it (the label "
                                     "chooses the method, the replicate the seed and split)")
        return checked

    def settings_of(self, axes: Mapping[str, str]) -> tuple[str, ...]:
        """The settings arguments of the label of ``axes``: those of every key that names it, shortest key first."""
        keys = label_keys(axes) | {self._label(dict(axes))}
        return tuple(argument for key in sorted(self.settings, key=len) if key in keys
                     for argument in self.settings[key])

    def _check_base(self) -> None:
        flags = {flag for flag, _ in split_options(self.base)}
        for flag in STUDY_OWNED:
            if flag in flags:
                raise ValueError(f"{flag} in the base arguments: the study sets it for every cell (each is written to "
                                 "<study>/cells/<key>); give the study's own --out instead")
        for count, option in _REPLICATES.items():
            if getattr(self, count) is not None and f"--{option}" in flags:
                raise ValueError(f"--{option} in the base arguments conflicts with --{count}: drop one")

    def replace(self, **changes) -> "Study":
        """A copy with ``changes`` (checked again); new axes without new ``published`` (``settings``) keep the
        figures (settings) of the labels that remain."""
        if "vary" in changes and "settings" not in changes and self.settings:
            kept = dataclasses.replace(self, vary=changes["vary"], published={}, settings={})._combinations()
            known = known_keys(kept, self.name)
            changes["settings"] = {key: value for key, value in self.settings.items() if key in known}
        if "vary" not in changes or "published" in changes or not self.published:
            return dataclasses.replace(self, **changes)
        return dataclasses.replace(self, **changes, published={})._with_published(self.published)

    def _with_published(self, published: Mapping) -> "Study":
        """A copy with the figures of ``published`` whose keys name a label of this study."""
        published = check_published(published)
        unknown = set(unmatched_keys(published, self._combinations(), self.name))
        kept = {key: value for key, value in published.items() if key not in unknown}
        return dataclasses.replace(self, published=kept if len(kept) > 1 else {})

    def labels(self) -> list[str]:
        """The label of each combination of axis values, in order: its value for one axis (``"bbb"``), ``name=value``
        pairs for several (``"guide=normal estimator=local"``), the study's name without axes."""
        return [self._label(combination) for combination in self._combinations()]

    def _combinations(self) -> list[dict[str, str]]:
        names = list(self.vary)
        return [dict(zip(names, values)) for values in itertools.product(*self.vary.values())]

    def _label(self, axes: dict[str, str]) -> str:
        if not axes:
            return self.name
        if len(axes) == 1:
            return next(iter(axes.values()))
        return " ".join(f"{name}={value}" for name, value in axes.items())

    def _replicates(self) -> list[dict[str, int]]:
        ranges = [[(option, i) for i in range(getattr(self, count))] for count, option in _REPLICATES.items()
                  if getattr(self, count) is not None]
        return [dict(pairs) for pairs in itertools.product(*ranges)]

    def folder(self) -> Path:
        """The study's folder: :attr:`out`, else ``runs/<name>``."""
        return self.out if self.out is not None else Path("runs") / self.name

    def data_file(self) -> Optional[Path]:
        """Where the cells read :attr:`data` (None without it): ``<folder>/data/<hash of its content>.npz``, so that
        changed data is a new file, a new ``--dataset`` and new cells."""
        return None if self.data is None else self.folder() / "data" / f"{self._data_hash}.npz"

    def cells(self) -> list[Cell]:
        """Every cell, each parsed and checked as its command would (its data set read and split); a
        :class:`ValueError` names the first that fails. In-memory :attr:`data` is first written to
        :meth:`data_file`, where the checks and the cells read it, unless it is there."""
        base = self.base
        if self.data is not None:
            path = self.data_file()
            if not path.is_file():
                check_writable(self.folder(), "--out", directory=True)
                save_arrays(path, self.data)
            base = (*base, "--dataset", f"npz:{path}")
        return [make_cell(base, axes, replicate, self._label(axes), self.settings_of(axes))
                for axes in self._combinations() for replicate in self._replicates()]

    def resolved_baseline(self) -> str:
        """:attr:`baseline` as given (a label, or ``name=value`` pairs of some axes, matched within the others:
        :func:`~pyrobnn.studies.baseline.resolve_baseline`), or the default: the first label's values of the axes
        that are not :data:`DATA_AXES`, matched within those (the first label itself where the study varies no data
        axis, or only data axes); a :class:`ValueError` if it matches no label of the study."""
        labels = {self._label(axes): axes for axes in self._combinations()}
        baseline = self.baseline
        if baseline is None:
            first = next(iter(labels.values()))
            compared = {name: value for name, value in first.items() if name not in DATA_AXES}
            matched = 0 < len(compared) < len(first)
            baseline = " ".join(f"{k}={v}" for k, v in compared.items()) if matched else next(iter(labels))
        resolve_baseline(baseline, labels)
        return baseline

    def run(self, out: Optional[Union[str, Path]] = None, **options) -> list[dict]:
        """Run the cells not cached in ``out`` (default: :attr:`out`, else ``runs/<name>``) and report them; returns
        one record per cell. ``options``: ``workers``, ``executor``, ``address``, ``force``, ``progress``,
        ``console`` of :func:`~pyrobnn.studies.runner.run_study`."""
        study = self if out is None else self.replace(out=Path(out))
        return run_study(study, study.folder(), **options)

    def to_dict(self) -> dict:
        """The study as plain data (what ``study.json`` holds)."""
        return {"name": self.name, "base": list(self.base), "vary": {k: list(v) for k, v in self.vary.items()},
                "seeds": self.seeds, "splits": self.splits, "baseline": self.baseline, "published": self.published,
                "configuration": self.configuration, "settings": {k: list(v) for k, v in self.settings.items()},
                "data": None if self.data is None else f"npz:{self.data_file()}"}

    @classmethod
    def from_file(cls, path: Union[str, Path], configuration: Optional[str] = None) -> "Study":
        """The study of a TOML file (see the module's docstring) in its ``configuration`` (default: the file's
        ``default_configuration``, else ``cpu`` where it has configurations); an unknown table, key, label or
        configuration, or a value of the wrong kind, is a :class:`ValueError` naming the file and the key."""
        path = Path(path)
        try:
            document = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"--file {path}: no such study file") from None
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"--file {path}: not valid TOML: {error}") from None
        unknown = sorted(set(document) - set(TABLES))
        if unknown:
            raise ValueError(f"{path}: unknown table or key {', '.join(unknown)}; a study file has [study] "
                             f"({', '.join(STUDY_KEYS)}), [vary] (option = [values]), [published], [settings] "
                             "(label = [arguments]) and [configurations.NAME] (base = [...], vary = {option = "
                             "[values]}, settings = {label = [arguments]})")
        settings, vary = document.get("study", {}), document.get("vary", {})
        if not isinstance(settings, dict) or not isinstance(vary, dict):
            raise ValueError(f"{path}: [study] and [vary] must be tables")
        unknown = sorted(set(settings) - set(STUDY_KEYS))
        if unknown:
            raise ValueError(f"{path}: unknown key {', '.join(unknown)} in [study]; its keys are "
                             f"{', '.join(STUDY_KEYS)}")
        kwargs = dict(settings)
        for key in ("name", "baseline", "out"):
            if key in kwargs and not isinstance(kwargs[key], str):
                raise ValueError(f"{path}: [study] {key} must be a string, got {kwargs[key]!r}")
        kwargs.setdefault("name", path.stem)
        try:
            configurations = _configurations(document.get("configurations", {}))
            chosen = _chosen(configurations, kwargs.pop("default_configuration", None), configuration)
            base = kwargs.pop("base", [])

            def build(name: Optional[str]) -> Study:
                extra = configurations.get(name, {})
                joined = base
                if extra.get("base") and isinstance(base, (str, list)):
                    joined = [*(shlex.split(base) if isinstance(base, str) else base), *extra["base"]]
                settings = _joined_settings(document.get("settings", {}), extra.get("settings", {}))
                study = cls(**kwargs, base=joined, vary={**_dotted(vary), **_dotted(extra.get("vary", {}))},
                            configuration=name)
                known = known_keys(study._combinations(), study.name)
                own = [key for key in extra.get("settings", {}) if key not in known]
                if own:
                    raise _unmatched(own[0], study.labels(), f" (configuration {name})", table="settings")
                # the study's [settings] keys that name a label of this configuration (others: of another one)
                study = dataclasses.replace(study, settings={k: v for k, v in settings.items() if k in known})
                overridden = {flag for flag, _ in split_options(study.base)} - set(LIST_OPTIONS)  # these add up
                for key, arguments in study.settings.items():
                    for flag, _ in split_options(arguments):
                        if flag in overridden:
                            raise ValueError(f"[settings] {key!r} sets {flag}, which the base also sets "
                                             f"{f'(configuration {name}) ' if name else ''}and would override: "
                                             "drop one")
                return study

            study = build(chosen)
            published = check_published(document.get("published", {}))
            combinations = [axes for other in [study, *(build(name) for name in configurations if name != chosen)]
                            for axes in other._combinations()]
            more = " (and those of its other configurations)" if len(configurations) > 1 else ""
            unknown = unmatched_keys(published, combinations, study.name)
            if unknown:
                raise _unmatched(unknown[0], study.labels(), more)
            known = known_keys(combinations, study.name)
            unknown = [key for key in document.get("settings", {}) if key not in known]
            if unknown:
                raise _unmatched(unknown[0], study.labels(), more, table="settings")
            return study._with_published(published)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None


def _joined_settings(study: dict, configuration: dict) -> dict:
    """A file's ``[settings]`` with a configuration's ``settings`` appended, key by key (a ``ValueError`` for
    tables that are not ``{label: [arguments]}``)."""
    for table in (study, configuration):
        if not isinstance(table, dict) or any(isinstance(v, dict) for v in table.values()):
            raise ValueError("[settings] must map labels to lists of arguments: \"method=bbb\" = [\"--lr\", "
                             "\"0.001\"] (quote a key that holds = or .)")

    def listed(value):
        return shlex.split(value) if isinstance(value, str) else value

    joined = {key: listed(value) for key, value in study.items()}
    for key, value in configuration.items():
        before, value = joined.get(key, []), listed(value)
        joined[key] = [*before, *value] if isinstance(before, list) and isinstance(value, list) else value
    return joined


def _dotted(table: dict, prefix: str = "") -> dict:
    """``{"prior": {"scale": [...]}}`` (TOML's reading of ``prior.scale = [...]``) -> ``{"prior.scale": [...]}``."""
    found = {}
    for name, value in table.items():
        if isinstance(value, dict):
            found.update(_dotted(value, f"{prefix}{name}."))
        else:
            found[prefix + name] = value
    return found


def _configurations(table) -> dict[str, dict]:
    """A file's ``[configurations]``: ``{name: {"base": [...], "vary": {...}}}``, checked."""
    if not isinstance(table, dict) or not all(isinstance(c, dict) for c in table.values()):
        raise ValueError("[configurations] must hold tables: [configurations.NAME] base = [...]")
    for name, settings in table.items():
        unknown = sorted(set(settings) - set(CONFIGURATION_KEYS))
        if unknown:
            raise ValueError(f"[configurations.{name}]: unknown key {', '.join(unknown)}; its keys are "
                             f"{', '.join(CONFIGURATION_KEYS)}")
        if not isinstance(settings.get("base", []), (str, list)):
            raise ValueError(f"[configurations.{name}] base must be a list of pyrobnn train arguments")
        if not isinstance(settings.get("vary", {}), dict):
            raise ValueError(f"[configurations.{name}] vary must be a table: vary = {{option = [values]}}")
        if not isinstance(settings.get("settings", {}), dict):
            raise ValueError(f"[configurations.{name}] settings must be a table: settings = {{label = [arguments]}}")
    return {name: {**settings, "base": shlex.split(settings["base"]) if isinstance(settings.get("base"), str)
                   else list(settings.get("base", []))} for name, settings in table.items()}


def _chosen(configurations: dict, default: Optional[str], chosen: Optional[str]) -> Optional[str]:
    """The configuration to run: ``chosen``, else ``default``, else :data:`DEFAULT_CONFIGURATION` (None for a file
    without configurations)."""
    if not configurations:
        if chosen is not None or default is not None:
            raise ValueError(f"--configuration {chosen or default}: the file has no [configurations.NAME] tables")
        return None
    name = chosen or default or DEFAULT_CONFIGURATION
    if not isinstance(name, str) or name not in configurations:
        raise ValueError(f"--configuration {name}: not a configuration of this study; its configurations are "
                         + ", ".join(configurations))
    return name


def load_study(path: Union[str, Path], configuration: Optional[str] = None) -> Study:
    """:meth:`Study.from_file`."""
    return Study.from_file(path, configuration)

"""The generated half of the documentation: the API reference from the package's ``__all__`` lists and docstrings,
and the command-line reference from the tyro options. Nothing here is hand-copied: every page under
``docs/generated/`` is written anew at each build from the code as it is.

- **API.** ``pyrobnn.__all__`` and every subpackage's ``__all__`` (:func:`public_names`) are documented in full on
  their subpackage's page (``pyrobnn.guides.NormalGuide``); the other documented members of each module on that
  module's page (:func:`modules`). An object has one full entry; its other public names (``pyrobnn.NormalGuide``,
  the module path ``pyrobnn.guides.normal.NormalGuide``) are registered as aliases of it, so each resolves in a
  cross-reference and appears in ``objects.inv``.
- **Checks** (each a warning, so an error under ``-W``): a public name without a docstring of its own; a
  cross-reference to a name that does not exist (a reference to a name that exists but has no entry, a private
  helper or another library's class, renders as code: there is no inventory of torch's or Pyro's pages offline).
- **CLI.** Each ``pyrobnn`` command's options, in tyro's groups, from the argparse parser tyro builds.
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import inspect
import io
import os
import pkgutil
import re
import sys
import warnings
from contextlib import redirect_stdout
from pathlib import Path

from docutils import nodes
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = "pyrobnn"
# The order a reader meets the layers in (README "Layout"), then the ground modules.
PACKAGES = ["data", "networks", "model", "guides", "handlers", "infer", "analysis", "methods", "studies", "cli"]
GROUND = ["distributions", "checks", "files", "device", "checkpoint"]
OUT = "generated"


# ----------------------------------------------------------------------------- what is public


def public_names() -> dict[str, list[str]]:
    """``{package: its __all__}`` for ``pyrobnn`` and each subpackage that has one (the names a user imports)."""
    names = {}
    for package in [ROOT] + [f"{ROOT}.{p}" for p in PACKAGES]:
        module = importlib.import_module(package)
        if hasattr(module, "__all__"):
            names[package] = list(module.__all__)
    return names


def modules(package: str) -> list[str]:
    """The public modules of ``package`` (no leading underscore), in file order."""
    module = importlib.import_module(package)
    return sorted(f"{package}.{info.name}" for info in pkgutil.iter_modules(module.__path__)
                  if not info.name.startswith("_"))


def kind_of(obj) -> str:
    if inspect.isclass(obj):
        return "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return "function"
    return "data"


def attribute_doc(package: str, name: str) -> tuple[str, str] | None:
    """The docstring written under an assignment (``NAME = ...`` then a string) of ``package.name``, searched in the
    package and its modules: ``(defining module, text)``."""
    obj = getattr(importlib.import_module(package), name)
    candidates = [package] + (modules(package) if package != ROOT else [])
    for modname in candidates:
        try:
            docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except Exception:  # noqa: BLE001 - a module without source
            continue
        text = docs.get(("", name))
        if text and getattr(importlib.import_module(modname), name, None) is obj:
            return modname, "\n".join(text).strip()
    return None


def own_docstring(package: str, name: str) -> bool:
    """Whether ``package.name`` has a docstring of its own (not one inherited from a base class or a type)."""
    obj = getattr(importlib.import_module(package), name)
    kind = kind_of(obj)
    if kind == "class":
        return bool((obj.__dict__.get("__doc__") or "").strip())
    if kind == "function":
        return bool((getattr(obj, "__doc__", None) or "").strip())
    return attribute_doc(package, name) is not None


# ----------------------------------------------------------------------------- the API pages


def title(text: str, char: str = "=") -> str:
    return f"{text}\n{char * len(text)}\n"


def indent(text: str, prefix: str = "   ") -> str:
    return "\n".join(prefix + line if line.strip() else "" for line in text.splitlines())


def short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else ""


def entry(package: str, name: str) -> str:
    """The full entry of ``package.name``: autodoc for classes and functions, the attribute docstring for data."""
    obj = getattr(importlib.import_module(package), name)
    kind = kind_of(obj)
    if kind == "class":
        return f".. autoclass:: {package}.{name}\n   :members:\n   :show-inheritance:\n"
    if kind == "function":
        return f".. autofunction:: {package}.{name}\n"
    found = attribute_doc(package, name)
    text = found[1] if found else ""
    lines = [f".. py:data:: {name}", f"   :module: {package}"]
    keys = ""
    if isinstance(obj, dict):
        lines.append("   :type: dict")
        if obj and all(isinstance(k, str) for k in obj):
            keys = "\n\n   Keys: " + ", ".join(f"``{k}``" if k else "``''`` (the empty string)" for k in obj) + "."
    elif short_repr(obj):
        lines.append(f"   :value: {short_repr(obj)}")
    return "\n".join(lines) + "\n\n" + indent(text) + keys + "\n"


SUMMARY_LENGTH = 200
"""The longest summary the API table shows; a longer first sentence is cut at its last clause before it."""

ABBREVIATIONS = re.compile(r"(\bet al|\b[Ee]qs?|\bi\.e|\be\.g|\bcf|\bvs|\b[Ff]igs?|\b[Ss]ec|\b[A-Z])\.$")
"""A period that ends one of these ends no sentence (``Blundell et al. (2015)``, ``eq. 11``, ``i.e. q(w)``)."""


def prose_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``text`` outside backquoted code and roles (``:math:`a. b```)."""
    spans, start = [], 0
    for match in re.finditer(r"(?::[\w:]+:)?`+[^`]*`+_?", text):
        spans.append((start, match.start()))
        start = match.end()
    return spans + [(start, len(text))]


def first_sentence(obj) -> str:
    """The summary of ``obj`` in the API table: the first sentence of its docstring as reST that stands alone.

    A sentence ends at a period outside code and math followed by a space and not closing an abbreviation
    (``et al.``, ``eq.``, ``i.e.``, ``e.g.``, an initial); a first paragraph without one ends where it ends, its
    trailing comma or colon made a period. Over :data:`SUMMARY_LENGTH` characters it is cut at its last ``;``,
    ``:`` or ``,`` outside code and parentheses, with an ellipsis. ``|`` outside code is escaped (``|w|`` is no
    substitution)."""
    doc = inspect.getdoc(obj) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    spans = prose_spans(paragraph)
    end = len(paragraph)
    for start, stop in spans:
        for match in re.finditer(r"\.(?=\s|$)", paragraph[start:stop]):
            at = start + match.end()
            if not ABBREVIATIONS.search(paragraph[:at]):
                end = at
                break
        if end < len(paragraph):
            break
    sentence = paragraph[:end].rstrip()
    if len(sentence) > SUMMARY_LENGTH:
        cuts = [start + match.start() for start, stop in prose_spans(sentence) if start < SUMMARY_LENGTH
                for match in re.finditer(r"[;:,](?=\s)", sentence[start:min(stop, SUMMARY_LENGTH)])
                if sentence[:start + match.start()].count("(") == sentence[:start + match.start()].count(")")]
        sentence = sentence[:cuts[-1]] + " ..." if cuts else sentence
    sentence = re.sub(r"[,;:]$", ".", sentence)
    pieces = [(sentence[a:b], True) for a, b in prose_spans(sentence)]
    codes = re.findall(r"(?::[\w:]+:)?`+[^`]*`+_?", sentence)
    out = ""
    for i, (prose, _) in enumerate(pieces):
        out += re.sub(r"(?<!\\)\|", r"\\|", prose) + (codes[i] if i < len(codes) else "")
    return out


def top_page(names: list[str], documented: dict[int, str]) -> str:
    """``pyrobnn``: its docstring, then a table of ``pyrobnn.__all__`` linking to each name's full entry."""
    module = importlib.import_module(ROOT)
    rows = []
    for name in names:
        if name == "__version__":
            continue
        obj = getattr(module, name)
        rows.append(f"   * - :obj:`{ROOT}.{name}`\n     - {first_sentence(obj)}")
    return "\n".join([
        title(f"``{ROOT}``"), f".. automodule:: {ROOT}\n   :no-members:\n",
        "The names ``import pyrobnn`` gives. Each is the object of the same name in its subpackage, where its full "
        "entry is: ``pyrobnn.NormalGuide`` is :class:`pyrobnn.guides.NormalGuide`.\n",
        ".. list-table::\n   :widths: 30 70\n\n" + "\n".join(rows) + "\n",
        f".. py:data:: __version__\n   :module: {ROOT}\n   :type: str\n\n   The version of pyrobnn "
        f"(``pyrobnn --version`` prints it).\n"])


def package_page(package: str, names: list[str] | None, documented: dict[int, str]) -> str:
    """A subpackage on one page: its docstring, the full entries of its ``__all__``, then each module as a section
    (one page per subpackage keeps the site's navigation, which every page carries, small)."""
    out = [title(f"``{package}``"), f".. automodule:: {package}\n   :no-members:\n"]
    if names:
        out.append(title("Public names", "-"))
        for name in names:
            out.append(entry(package, name))
    mods = modules(package)
    if mods:
        out.append(title("Modules", "-"))
        out.append("\n".join(f"- :mod:`{m}`" for m in mods) + "\n")
        for modname in mods:
            out.append(module_section(modname, documented, "^"))
    return "\n".join(out)


def shadowed(modname: str) -> bool:
    """Whether the package's attribute of the module's name is something else (``pyrobnn.infer.predict`` is the
    function ``predict``, exported by the package, not the module): Sphinx keeps one object per name, so such a
    module is not an indexed object; its page is reached by :mod: references all the same (``missing_reference``)."""
    package, _, last = modname.rpartition(".")
    return getattr(importlib.import_module(package), last, None) is not importlib.import_module(modname)


def own_members(modname: str) -> list[str]:
    """What ``automodule :members:`` documents: the module's ``__all__``, or its public classes and functions
    defined in it, and its data with a docstring, in source order."""
    module = importlib.import_module(modname)
    analyzer = ModuleAnalyzer.for_module(modname)
    attr_docs = {name for (cls, name) in analyzer.find_attr_docs() if cls == ""}
    order = analyzer.tagorder
    if hasattr(module, "__all__"):
        return list(module.__all__)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if inspect.isclass(value) or inspect.isfunction(value):
            if value.__module__ == modname and (value.__doc__ or "").strip():
                names.append(name)
        elif name in attr_docs:
            names.append(name)
    return sorted(names, key=lambda n: order.get(n, len(order)))


def module_section(modname: str, documented: dict[int, str], char: str = "-") -> str:
    """A module: its docstring and its documented members, less those with a full entry on the package's page."""
    module = importlib.import_module(modname)
    excluded = sorted(name for name, value in vars(module).items()
                      if id(value) in documented and not name.startswith("_")
                      and documented[id(value)] != f"{modname}.{name}")
    elsewhere = [name for name in excluded  # defined here, documented with the package
                 if getattr(getattr(module, name), "__module__", None) == modname]
    out = [title(f"``{modname}``", char)]
    if shadowed(modname):
        out.append(f".. automodule:: {modname}\n   :no-index:\n\n.. currentmodule:: {modname}\n")
        for name in own_members(modname):
            if name in excluded:
                continue
            obj = getattr(module, name)
            kind = kind_of(obj)
            directive = {"class": "autoclass", "function": "autofunction", "data": "autodata"}[kind]
            options = "\n   :members:\n   :show-inheritance:" if kind == "class" else ""
            out.append(f".. {directive}:: {name}{options}\n")
    else:
        out.append(f".. automodule:: {modname}\n   :members:\n   :show-inheritance:")
        if excluded:
            out.append(f"   :exclude-members: {', '.join(excluded)}")
        out.append("")
    if elsewhere:
        out.append("Documented with their package: " + ", ".join(
            f":obj:`~{documented[id(getattr(module, name))]}`" for name in elsewhere) + ".\n")
    return "\n".join(out) + "\n"


def api_index(packages: list[str]) -> str:
    out = [title("API reference"),
           "Generated from the docstrings. ``pyrobnn`` re-exports the names most scripts need; each subpackage "
           "lists its own public names (its ``__all__``) with their full entries, then its modules. The layers "
           "go from the ground up: each may import only from those before it.\n",
           ".. toctree::\n   :maxdepth: 1\n\n   " + ROOT + "\n" + "\n".join(f"   {p}" for p in packages)
           + "\n   ground\n"]
    return "\n".join(out)


def ground_page(documented: dict[int, str]) -> str:
    out = [title("Ground modules"),
           "What every layer may use: the distributions of the priors and posteriors and their KLs, argument "
           "checks, atomic writes, devices, safe checkpoints.\n"]
    out += [module_section(f"{ROOT}.{m}", documented) for m in GROUND]
    return "\n".join(out)


def write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def generate_api(srcdir: Path) -> dict[int, str]:
    """Write ``generated/api/*.rst``; return ``{id(object): the name of its full entry}``."""
    out = srcdir / OUT / "api"
    public = public_names()
    documented: dict[int, str] = {}
    for package, names in public.items():
        if package == ROOT:
            continue
        module = importlib.import_module(package)
        for name in names:
            obj = getattr(module, name)
            if kind_of(obj) != "data":
                documented.setdefault(id(obj), f"{package}.{name}")
    wanted = {}
    packages = [f"{ROOT}.{p}" for p in PACKAGES]
    wanted["index.rst"] = api_index(packages)
    wanted[f"{ROOT}.rst"] = top_page(public[ROOT], documented)
    for package in packages:
        wanted[f"{package}.rst"] = package_page(package, public.get(package), documented)
    wanted["ground.rst"] = ground_page(documented)
    for stale in out.glob("*.rst") if out.exists() else []:
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        write_if_changed(out / name, text)
    return documented


# ----------------------------------------------------------------------------- the CLI page


def rst_escape(text: str) -> str:
    """``--help`` text as reST that reads as the text: markup characters escaped, and ``scheme:`` escaped unless a
    ``//`` follows (``tv:NAME`` is a name of the command line, not a link in the ``tv`` URI scheme)."""
    text = re.sub(r"([\\`*|_])", r"\\\1", text)
    return re.sub(r"(?<=[A-Za-z0-9]):(?!//)", r"\\:", text)


def parser_of(options: type, prog: str) -> argparse.ArgumentParser | None:
    import tyro

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parser = tyro.extras.get_parser(options)
    except Exception:  # noqa: BLE001 - a tyro without get_parser: the page falls back to --help
        return None
    parser.prog = prog
    return parser


def help_text(argv: list[str]) -> str:
    """What ``pyrobnn ARGV --help`` prints, 100 columns wide, without colour."""
    from pyrobnn.__main__ import main

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    buffer = io.StringIO()
    try:
        with redirect_stdout(buffer):
            main([*argv, "--help"])
    except SystemExit:
        pass
    finally:
        if old is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = old
    return re.sub(r"\x1b\[[0-9;]*m", "", buffer.getvalue())


def command_section(prog: str, options: type, summary: str) -> str:
    out = [title(f"``{prog}``", "-"), rst_escape(summary) + "\n", f".. program:: {prog}\n"]
    parser = parser_of(options, prog)
    if parser is None:
        return "\n".join(out) + "\n.. code-block:: text\n\n" + indent(help_text(prog.split()[1:])) + "\n"
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS and a.option_strings
                   and "--help" not in a.option_strings]
        positionals = [a for a in group._group_actions if not a.option_strings]
        if not actions and not positionals:
            continue
        heading = group.title[0].upper() + group.title[1:] if group.title else "Options"
        out.append(title(heading, "^"))
        if group.description:
            out.append(rst_escape(group.description) + "\n")
        for action in positionals + actions:
            names = action.option_strings or [action.metavar or action.dest]
            metavar = action.metavar
            if metavar is None and action.choices is not None:
                metavar = "{" + ",".join(map(str, action.choices)) + "}"
            if action.nargs == 0:
                metavar = None
            signature = ", ".join(f"{n} {metavar}" if metavar else n for n in names)
            out.append(f".. option:: {signature}\n\n" + indent(rst_escape(action.help or "")) + "\n")
    return "\n".join(out)


def generate_cli(srcdir: Path) -> None:
    from pyrobnn.__main__ import ALL_COMMANDS
    from pyrobnn.studies.command import StudyReport

    out = [title("Command line"),
           "``pyrobnn COMMAND [OPTIONS]`` (or ``python -m pyrobnn``). Generated from the options the commands "
           "parse, as ``pyrobnn COMMAND --help`` prints them. An error is one ``error:`` line on stderr and exit "
           "status 2. ``pyrobnn --version`` prints the version.\n",
           ".. code-block:: text\n\n" + indent(help_text([]).strip()) + "\n"]
    for name, command in ALL_COMMANDS.items():
        doc = inspect.getdoc(command.options) or ""
        summary = doc.split("\n\n")[0].replace("\n", " ")
        out.append(command_section(f"pyrobnn {name}", command.options, summary))
    doc = inspect.getdoc(StudyReport) or ""
    out.append(command_section("pyrobnn study report", StudyReport, doc.split("\n\n")[0].replace("\n", " ")))
    write_if_changed(srcdir / OUT / "cli.rst", "\n".join(out))


# ----------------------------------------------------------------------------- checks and references


def check_docstrings(app) -> None:
    """A public name without a docstring of its own is a warning (an error under ``-W``)."""
    for package, names in public_names().items():
        for name in names:
            if name == "__version__":
                continue
            if not own_docstring(package, name):
                logger.warning(f"public name {package}.{name} has no docstring of its own",
                               type="pyrobnn", subtype="docstring")


def declared_fields(obj) -> list:
    """The names a class declares without a class-level value: annotations, dataclass fields, slots, tuple fields."""
    out = []
    for cls in getattr(obj, "__mro__", (obj,)):
        for attr in ("__annotations__", "__dataclass_fields__", "__slots__", "_fields"):
            value = vars(cls).get(attr) if hasattr(cls, "__dict__") else None
            if isinstance(value, (dict, tuple, list, set, frozenset, str)):
                out.append(value)
    return out


def lookup(path: str):
    """The object a dotted path names, importing what it must; ``KeyError`` when it names nothing."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        modname = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(modname)
        except Exception:  # noqa: BLE001 - not a module: try a shorter prefix
            continue
        for attr in parts[cut:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif any(attr in declared for declared in declared_fields(obj)):
                obj = None  # a field declared without a class-level value
            else:
                raise KeyError(path)
        return obj
    if hasattr(builtins, path):
        return getattr(builtins, path)
    raise KeyError(path)


def candidates(target: str, modname: str | None, classname: str | None, source: str = "") -> list[str]:
    """Where a name may live, as Python would find it from the docstring that wrote it: the documented object's own
    namespace and module (``docstring of pyrobnn.infer.mcmc.sample_posterior`` names ``FlatPotential`` of
    ``pyrobnn.infer.mcmc``), the page's module and class, a module of the page's package, then the name alone."""
    out = []
    match = re.search(r"docstring of ([\w.]+)", source or "")
    if match:
        parts = match.group(1).split(".")
        out += [".".join(parts[:cut] + [target]) for cut in range(len(parts), 0, -1)]
    if modname and classname:
        out.append(f"{modname}.{classname}.{target}")
    if modname:
        out.append(f"{modname}.{target}")
        package = modname.rsplit(".", 1)[0]
        out.append(f"{package}.{target}")
    out.append(target)
    head = target.split(".")[0]
    for package, names in public_names().items():  # a public name's member: Likelihood.distribution
        if head in names:
            out.append(f"{package}.{target}")
    for package in filter(None, [modname, modname.rsplit(".", 1)[0] if modname else None]):
        try:
            out += [f"{m}.{target}" for m in modules(package)]
        except (ImportError, AttributeError):
            pass
    return out


def documented_name(app, path: str, obj) -> str | None:
    """The name of the full entry of the object ``path`` names, when it has one."""
    documented = app.env.pyrobnn_documented
    if id(obj) in documented:
        return documented[id(obj)]
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # a member of a documented object: its entry's name + the rest
        try:
            owner = lookup(".".join(parts[:cut]))
        except KeyError:
            continue
        if id(owner) in documented:
            return ".".join([documented[id(owner)], *parts[cut:]])
    qualname = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if qualname and module:
        return f"{module}.{qualname}"
    return None


def missing_reference(app, env, node, contnode):
    """A Python cross-reference Sphinx could not resolve: a link to the entry of the object it names when that
    has one under another name; plain code when the object exists without an entry; a warning when the name names
    nothing (the stale reference ``-W`` must catch)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    if node.get("reftype") == "mod" and target in env.pyrobnn_pages:
        page, _, anchor = env.pyrobnn_pages[target].partition("#")
        ref = nodes.reference("", "", internal=True, refuri=app.builder.get_relative_uri(
            node["refdoc"], page) + "#" + anchor)
        ref.append(contnode)
        return ref
    modname, classname = node.get("py:module"), node.get("py:class")
    domain = env.domains["py"] if hasattr(env.domains, "__getitem__") else env.get_domain("py")
    if target.startswith(("typing.", "~typing.")) or "[" in target:
        return contnode  # a printed annotation, not a name
    for path in candidates(target, modname, classname, node.source or ""):
        try:
            obj = lookup(path)
        except KeyError:
            continue
        name = documented_name(app, path, obj)
        if name and name in domain.objects and name != target:
            new = node.deepcopy()
            new["reftarget"] = name
            resolved = domain.resolve_xref(env, node["refdoc"], app.builder, "obj", name, new, contnode)
            if resolved is not None:
                return resolved
        return contnode
    return None  # Sphinx warns: "py:class reference target not found: ..." (nitpicky)


def register_aliases(app, env) -> None:
    """``pyrobnn.NormalGuide`` (and every other public name of an object with a full entry elsewhere) as an alias
    of that entry: it resolves in references and is listed in ``objects.inv``."""
    from sphinx.domains.python import ObjectEntry

    domain = env.domains["py"] if hasattr(env.domains, "__getitem__") else env.get_domain("py")
    documented = env.pyrobnn_documented
    for package, names in public_names().items():
        module = importlib.import_module(package)
        for name in names:
            alias = f"{package}.{name}"
            obj = getattr(module, name)
            full = documented.get(id(obj))
            if alias in domain.objects or not full or full not in domain.objects:
                continue
            entry_ = domain.objects[full]
            domain.objects[alias] = ObjectEntry(entry_.docname, entry_.node_id, entry_.objtype, True)


def builder_inited(app) -> None:
    srcdir = Path(app.srcdir)
    app.env.pyrobnn_documented = generate_api(srcdir)
    app.env.pyrobnn_pages = {}
    for package in [f"{ROOT}.{p}" for p in PACKAGES]:
        for modname in modules(package):
            app.env.pyrobnn_pages[modname] = f"{OUT}/api/{package}#{nodes.make_id(modname)}"
    # names documented in module pages (analysis has no __all__): pyrobnn.evaluate is pyrobnn.analysis.evaluate's
    for package, names in public_names().items():
        module = importlib.import_module(package)
        for name in names:
            obj = getattr(module, name)
            if kind_of(obj) != "data" and id(obj) not in app.env.pyrobnn_documented:
                app.env.pyrobnn_documented[id(obj)] = f"{obj.__module__}.{obj.__qualname__}"
    generate_cli(srcdir)
    check_docstrings(app)


def unwrap_annotated() -> None:
    """Show ``Annotated[T, tyro.conf.arg(...)]`` as ``T``: the metadata is for the command line (whose page shows
    it), not for a reader of the signature. Sphinx's two annotation printers are wrapped where they are used."""
    import typing

    import sphinx.util.typing as sphinx_typing

    originals = {name: getattr(sphinx_typing, name) for name in ("restify", "stringify_annotation")}

    def wrap(original):
        def printer(annotation, *args, **kwargs):
            if typing.get_origin(annotation) is typing.Annotated:
                annotation = annotation.__origin__
            return original(annotation, *args, **kwargs)
        printer.__wrapped__ = original
        return printer

    wrapped = {name: wrap(fn) for name, fn in originals.items()}
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("sphinx"):
            for name, original in originals.items():
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped[name])


def split_param_fields(app, what, name, obj, options, lines) -> None:
    """``:param x, y: text`` documents two parameters at once; reST would read ``x,`` as a type and ``y`` as the
    name. Written ``x,y`` it stays one field with both names."""
    for i, line in enumerate(lines):
        lines[i] = re.sub(r"^(\s*:param\s+)([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)(\s*:)",
                          lambda m: m.group(1) + re.sub(r"\s*,\s*", ",", m.group(2)) + m.group(3), line)


def escape_bars(app, what, name, obj, options, lines) -> None:
    """``|x|`` in prose is an absolute value (``|mu|/sigma``), not a reST substitution (the package defines none):
    escaped outside code, roles and math blocks. The docstrings of the command-line options are also tyro's
    ``--help`` text, so they stay plain."""
    in_math, math_indent = False, 0
    for i, line in enumerate(lines):
        indent_ = len(line) - len(line.lstrip())
        if in_math and line.strip() and indent_ <= math_indent:
            in_math = False
        if re.match(r"\s*\.\. math::", line):
            in_math, math_indent = True, indent_
            continue
        if in_math or line.lstrip().startswith(("|", "+")):
            continue
        parts = re.split(r"(`+[^`]*`+)", line)
        parts[::2] = [re.sub(r"(?<!\\)\|", r"\\|", part) for part in parts[::2]]
        lines[i] = "".join(parts)


def setup(app):
    unwrap_annotated()
    app.connect("autodoc-process-docstring", split_param_fields)
    app.connect("autodoc-process-docstring", escape_bars)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    app.connect("builder-inited", builder_inited)
    app.connect("missing-reference", missing_reference)
    app.connect("env-updated", register_aliases)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}

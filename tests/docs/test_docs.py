"""The documentation site, built as CI builds it (``make docs-ci``: Sphinx with warnings as errors, the tutorials run
at their CI size), and read back as a reader gets it.

- The build gives no warning: a broken cross-reference, a docstring that does not parse and a public name without a
  docstring each fail it (``docs/_ext/pyrobnn_reference.py``).
- Every name of ``pyrobnn.__all__`` and of each subpackage's ``__all__`` is in the inventory (``objects.inv``), and
  the entry it points to renders the signature and a docstring.
- Every tutorial ran and its figures are on its page.
- Every ``pyrobnn`` command in README.md and in the docs parses as written, and the short ones (``--help``,
  ``--version``, toy data) run as written, in order, in an empty folder.
"""

from __future__ import annotations

import html
import importlib
import os
import re
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.support import ROOT

DOCS = ROOT / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("[0-9][0-9]_*.py"))
PACKAGES = ["pyrobnn"] + [f"pyrobnn.{name}" for name in
                          ("data", "networks", "model", "guides", "handlers", "infer", "analysis", "studies", "cli")]

if "sphinx" not in sys.modules:
    try:
        import sphinx  # noqa: F401
    except ImportError:  # the docs extra: make venv installs it; CI must have it
        if os.environ.get("CI"):
            raise
        pytest.skip("Sphinx is not installed (pip install -e '.[docs]')", allow_module_level=True)


def inventory(site: Path) -> dict[str, tuple[str, str]]:
    """``objects.inv``: ``{name: (role, uri)}`` of the Python domain."""
    data = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    entries = {}
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        match = re.match(r"(.+?)\s+(py:\w+)\s+(-?\d+)\s+(\S*)\s+(.*)", line)
        if match:
            name, role, _, uri, _ = match.groups()
            entries[name] = (role, uri.replace("$", name))
    return entries


def public_names() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names += [f"{package}.{name}" for name in getattr(module, "__all__", [])]
    return names


# ----------------------------------------------------------------------------- the build


@pytest.mark.slow
def test_the_site_builds_without_a_warning(site):
    stderr = (site / "build-stderr.txt").read_text() if (site / "build-stderr.txt").exists() else ""
    assert "WARNING" not in stderr and "ERROR" not in stderr, stderr[-4000:]
    assert (site / "index.html").exists()


@pytest.mark.slow
def test_every_public_name_has_an_entry_with_its_signature_and_docstring(site):
    entries = inventory(site)
    missing = [name for name in public_names() if name not in entries]
    assert not missing, f"public names without an entry in the API reference: {missing}"
    pages: dict[str, str] = {}
    empty = []
    for name in public_names():
        role, uri = entries[name]
        page, _, anchor = uri.partition("#")
        text = pages.setdefault(page, (site / page).read_text())
        start = text.find(f'id="{anchor}"')
        assert start >= 0, f"{name}: no element #{anchor} in {page}"
        dt_end = text.find("</dt>", start)
        signature = re.sub(r"<[^>]+>", "", text[start:dt_end])
        dd = text[dt_end:text.find("</dd>", dt_end)]
        body = html.unescape(re.sub(r"<[^>]+>", "", dd)).strip()
        short = name.rsplit(".", 1)[1]
        if short not in html.unescape(signature) or not body:
            empty.append(name)
    assert not empty, f"entries without a signature or a docstring: {empty}"


@pytest.mark.slow
def test_the_top_level_names_resolve_to_their_full_entries(site):
    entries = inventory(site)
    assert entries["pyrobnn.NormalGuide"][1] == entries["pyrobnn.guides.NormalGuide"][1]
    assert entries["pyrobnn.fit"][1] == entries["pyrobnn.infer.fit"][1]
    assert entries["pyrobnn.evaluate"][1] == "generated/api/pyrobnn.analysis.html#pyrobnn.analysis.evaluate.evaluate"


@pytest.mark.slow
def test_the_cli_reference_lists_every_command_and_option(site):
    page = (site / "generated" / "cli.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    for command in ("train", "evaluate", "prune", "mcmc", "study", "study report"):
        assert f"pyrobnn {command}" in text, command
    for command, option in [("train", "--dataset"), ("train", "--prior.scale"), ("train", "--guide.rate"),
                            ("mcmc", "--num-chains"), ("study", "--vary"), ("evaluate", "--checkpoint")]:
        assert f'id="cmdoption-pyrobnn-{command}-{option.lstrip("-")}"' in page, (command, option)


@pytest.mark.slow
def test_every_tutorial_ran_and_its_figures_are_on_its_page(site):
    assert TUTORIALS, "no tutorials in docs/tutorials"
    for script in TUTORIALS:
        page = site / "auto_tutorials" / f"{script.stem}.html"
        assert page.exists(), f"{script.name} has no page"
        text = page.read_text()
        assert "sphx-glr-script-out" in text, f"{script.name}: no output on its page"
        figures = re.findall(r'src="(?:\.\./)?(_images/sphx_glr_[^"]+\.png)"', text)
        if "plt.show()" in script.read_text():
            assert figures, f"{script.name}: its figures are not on its page"
        for figure in figures:
            assert (site / figure).stat().st_size > 1000, figure


# ----------------------------------------------------------------------------- the commands


def commands_in(text: str) -> list[str]:
    """The ``pyrobnn ...`` command lines of shell code blocks (Markdown fences or reST ``::`` / code-block),
    continuation lines joined, comments dropped."""
    lines, out, joined = text.splitlines(), [], ""
    in_block = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("```"):
            in_block = stripped in ("```bash", "```sh", "```console", "```shell") if not in_block else False
            continue
        candidate = in_block or line.startswith("    ") or line.startswith("   ")
        if not candidate:
            continue
        if joined:
            joined += " " + stripped
        elif re.match(r"^(\$ )?(pyrobnn|python -m pyrobnn) ", stripped) or stripped in ("pyrobnn --version",):
            joined = stripped.removeprefix("$ ")
        else:
            continue
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip()
            continue
        out.append(re.sub(r"\s+#.*$", "", joined).strip())
        joined = ""
    return out


def documented_commands() -> list[tuple[str, str]]:
    sources = [ROOT / "README.md", *sorted(DOCS.glob("*.rst")), *sorted((DOCS / "guide").glob("*.rst")),
               *sorted((DOCS / "tutorials").glob("*.rst")), *TUTORIALS]
    return [(source.name, command) for source in sources for command in commands_in(source.read_text())]


TOYS = {"two-moons", "cubic", "sinusoid"}


def is_short(argv: list[str]) -> bool:
    """``--help``, ``--version``, or a toy data set's ``train`` (a few seconds)."""
    if "--help" in argv or "-h" in argv or argv[:1] in (["--version"], ["-V"]):
        return True
    dataset = argv[argv.index("--dataset") + 1] if "--dataset" in argv else None
    return argv[:1] == ["train"] and dataset in TOYS


def parse(argv: list[str]) -> None:
    """What ``pyrobnn ARGV`` would parse, without running it: options, choices and values."""
    from pyrobnn.__main__ import ALL_COMMANDS
    from pyrobnn.cli import _parse
    from pyrobnn.cli.methods import expand_method

    if argv[:1] in (["--version"], ["-V"]) or "--help" in argv:
        return
    command = ALL_COMMANDS[argv[0]]
    if command.parse is not None:
        if argv[1:2] != ["report"]:
            command.parse(argv[1:])
        return
    _parse(expand_method(argv), ALL_COMMANDS)


def test_the_documents_have_commands():
    commands = [command for _, command in documented_commands()]
    assert any(command.startswith("pyrobnn train") for command in commands)
    assert "pyrobnn --version" in commands


@pytest.mark.parametrize("source,command", documented_commands(), ids=lambda value: value[:60])
def test_every_documented_command_parses_as_written(source, command):
    argv = shlex.split(command)
    argv = argv[3:] if argv[:3] == ["python", "-m", "pyrobnn"] else argv[1:]
    try:
        parse(argv)
    except SystemExit as exit_:
        pytest.fail(f"{source}: `{command}` does not parse (exit {exit_.code})")


@pytest.mark.slow
def test_the_short_documented_commands_run_as_written(tmp_path):
    """In an empty folder, in the order the documents give them (a command that reads a run written by a command
    that was not run is not run either)."""
    ran, skipped = [], set()
    for source, command in documented_commands():
        if command in ran:  # the same command in two documents (README.md and the landing page): run once
            continue
        argv = shlex.split(command)
        argv = argv[3:] if argv[:3] == ["python", "-m", "pyrobnn"] else argv[1:]
        reads = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--checkpoint"]
        if reads and not all((tmp_path / r).exists() for r in reads):
            skipped.add(command)
            continue
        if not (is_short(argv) or reads):  # a command that reads a run the documents made before is short too
            continue
        result = subprocess.run([sys.executable, "-m", "pyrobnn", *argv], cwd=tmp_path, capture_output=True,
                                text=True, timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})
        assert result.returncode == 0, f"{source}: `{command}` failed:\n{result.stderr[-3000:]}"
        ran.append(command)
    assert "pyrobnn --version" in ran and any(command.startswith("pyrobnn train") for command in ran), ran
    assert any(command.startswith("pyrobnn evaluate") for command in ran), (ran, skipped)


@pytest.mark.slow
def test_the_tutorials_print_no_raw_float(site):
    """What a tutorial prints is formatted: no float with its last bits (``0.23000000417232513``)."""
    raw = {}
    for script in TUTORIALS:
        text = (site / "auto_tutorials" / f"{script.stem}.html").read_text()
        outputs = " ".join(re.findall(r'class="sphx-glr-script-out[^"]*".*?</pre>', text, re.S))
        found = re.findall(r"\d\.\d{7,}", html.unescape(re.sub(r"<[^>]+>", "", outputs)))
        if found:
            raw[script.name] = found[:5]
    assert not raw, f"tutorials print unformatted floats: {raw}"


@pytest.mark.slow
def test_the_results_page_is_a_page_with_headings_in_the_navigation(site):
    page = (site / "guide" / "results.html").read_text()
    assert len(re.findall(r"<h2>", page)) >= 10 and "<table" in page
    assert 'href="guide/results.html"' in (site / "index.html").read_text()
    ids = set(re.findall(r'id="([^"]+)"', page))
    links = re.findall(r'href="guide/results\.html#([^"]+)"', (site / "which_method.html").read_text())
    assert len(links) >= 30, len(links)
    assert not set(links) - ids, set(links) - ids

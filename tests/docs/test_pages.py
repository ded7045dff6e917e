"""What a newcomer reads first, checked against the code it describes (no build needed).

- The install page lists every extra of ``pyproject.toml`` with every package it installs.
- The command line's method list names every method of ``pyrobnn.methods.METHODS``.
- The changelog's entries are dated.
- Every tutorial checks its own claim as it runs (an ``assert`` at the top level of the script, so the site does
  not build while a method fails) and keeps its code within the site's column (what it prints is checked on the
  built site, ``test_docs.py``).
"""

from __future__ import annotations

import ast
import re
import sys

import pytest

from tests.support import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOCS = ROOT / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("[0-9][0-9]_*.py"))
CODE_WIDTH = 85
"""The widest code line the site's column shows without a scroll bar (``test_site_html.CODE_WIDTH``)."""


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def package(requirement: str) -> str:
    return re.split(r"[<>=!~;\s]", requirement, maxsplit=1)[0]


@pytest.mark.parametrize("extra", sorted(extras()))
def test_the_install_page_lists_every_extra_with_its_packages(extra):
    text = (DOCS / "install.rst").read_text()
    row = re.search(rf"\* - ``{re.escape(extra)}``\n((?:     .*\n)+)", text)
    assert row, f"install.rst: no row for the extra {extra!r}"
    missing = [package(r) for r in extras()[extra] if package(r) not in row.group(1)]
    assert not missing, f"install.rst, extra {extra!r}: {missing} not listed"


def test_the_install_page_says_how_to_get_the_code():
    text = (DOCS / "install.rst").read_text()
    assert "git clone" in text and "pip install -e ." in text and ".whl" in text


def test_the_command_line_guide_names_every_method():
    from pyrobnn.methods import METHODS

    text = (DOCS / "guide" / "command_line.rst").read_text()
    listed = set(re.findall(r"``([\w-]+)``", text))
    families = {"ibnn": "ibnn-K", "ensemble": "ensemble-M", "multiswag": "multiswag-M"}
    missing = [name for name in METHODS
               if name not in listed and families.get(name.rsplit("-", 1)[0]) not in listed]
    assert not missing, f"command_line.rst's --method list lacks {missing}"


def test_every_changelog_entry_is_dated():
    headings = re.findall(r"^(.+)\n-{3,}$", (DOCS / "changelog.rst").read_text(), re.M)
    assert headings and all(re.search(r"\(\d{4}-\d{2}-\d{2}\)$", h) for h in headings), headings


# ----------------------------------------------------------------------------- tutorials


def top_level_asserts(script) -> list[ast.Assert]:
    tree = ast.parse(script.read_text())
    found = []
    for node in tree.body:
        found += [n for n in ast.walk(node) if isinstance(n, ast.Assert)] if isinstance(node, (ast.For, ast.If,
                                                                                               ast.With)) else []
        if isinstance(node, ast.Assert):
            found.append(node)
    return found


OWNED_ELSEWHERE = {"11_bayesian_finetuning.py": "tutorial 11 is reworked by the pretrained/LoRA work of issue 57"}
"""Tutorials this file's checks wait for, and why (an expected failure until they pass, then an unexpected pass)."""


@pytest.mark.parametrize("script", TUTORIALS, ids=lambda path: path.stem)
def test_every_tutorial_checks_its_claim_as_it_runs(script):
    if script.name in OWNED_ELSEWHERE and not top_level_asserts(script):
        pytest.xfail(OWNED_ELSEWHERE[script.name])
    assert top_level_asserts(script), f"{script.name}: no assert of its own claim at the script's top level"


@pytest.mark.parametrize("script", TUTORIALS, ids=lambda path: path.stem)
def test_the_code_of_a_tutorial_fits_the_column(script):
    lines = script.read_text().splitlines()
    docstring_end = [i for i, line in enumerate(lines) if line.startswith('"""')][1]
    wide, in_text = [], False
    for number, line in enumerate(lines[docstring_end + 1:], docstring_end + 2):
        if line.startswith("# %%"):
            in_text = True  # sphinx-gallery renders the comment lines after it as prose, which wraps
            continue
        in_text = in_text and line.startswith("#")
        if not in_text and len(line) > CODE_WIDTH:
            wide.append(number)
    if script.name in OWNED_ELSEWHERE and wide:
        pytest.xfail(OWNED_ELSEWHERE[script.name])
    assert not wide, f"{script.name}: code lines wider than {CODE_WIDTH} characters at {wide}"

"""What a reader copies and scans on the built site (``make docs-ci``), and the summaries of the API landing table.

- A flag copied from the command-line reference works in a shell: ``--option`` is two ASCII hyphens, with no
  en-dash or em-dash before an option name (Sphinx's smart quotes would make ``--`` an en-dash), and ``tv:NAME``
  is text, not a link.
- Every row of the API landing table (``generated/api/pyrobnn.html``) has a summary: the first sentence of the
  name's docstring (``first_sentence`` of ``docs/_ext/pyrobnn_reference.py``), unit-tested here on the sentences
  that used to come out blank or cut.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest

import pyrobnn
from tests.support import ROOT

pytest.importorskip("sphinx")
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
from pyrobnn_reference import SUMMARY_LENGTH, first_sentence  # noqa: E402

DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"  # hyphen, non-breaking hyphen, figure, en, em, bar, minus


def documented(text: str):
    """An object whose docstring is ``text``."""
    return type("Documented", (), {"__doc__": text})


@pytest.mark.parametrize("doc,summary", [
    # a ``|`` (a conditional in math, an absolute value in prose) is kept, escaped outside code
    ("Pyro model :math:`p(y_n | x_n, w)` around any ``nn.Module``.\n\nMore.",
     "Pyro model :math:`p(y_n | x_n, w)` around any ``nn.Module``."),
    ("The prior :math:`p(w) \\propto 1/|w|`, or 1/|w| in prose.", "The prior :math:`p(w) \\propto 1/|w|`, or "
                                                                  "1/\\|w\\| in prose."),
    # abbreviations end no sentence
    ("Scale-mixture prior of Blundell et al. (2015) :math:`\\pi`. Two.",
     "Scale-mixture prior of Blundell et al. (2015) :math:`\\pi`."),
    ("A prior (Trinh et al. 2020, eq. 1 and 21) on nodes. The rest.", "A prior (Trinh et al. 2020, eq. 1 and 21) on "
                                                                      "nodes."),
    ("Dropout :math:`w = \\theta(1 + \\epsilon)`, i.e. a Gaussian. More.",
     "Dropout :math:`w = \\theta(1 + \\epsilon)`, i.e. a Gaussian."),
    ("Weights, e.g. a bias. More.", "Weights, e.g. a bias."),
    # a period inside code or math ends no sentence
    ("Calls ``f(x). g`` once. More.", "Calls ``f(x). g`` once."),
    # a first paragraph that runs into a list or an equation ends with a period
    ("MC dropout: weights with Bernoulli masks,\n\n.. math:: q(W)", "MC dropout: weights with Bernoulli masks."),
    ("Priors on nodes:\n\n- one", "Priors on nodes."),
    ("No period at all", "No period at all"),
])
def test_first_sentence(doc, summary):
    assert first_sentence(documented(doc)) == summary


def test_a_long_first_sentence_is_cut_at_its_last_clause_before_the_limit():
    clause = "the metric of its mean (an RMSE, an NLL, an MAE), "
    doc = "Metrics of the posterior predictive: " + clause * 6 + "and the log density."
    summary = first_sentence(documented(doc))
    assert summary.endswith(" ...") and len(summary) <= SUMMARY_LENGTH + 4
    kept = summary.removesuffix(" ...")
    assert doc.startswith(kept) and doc[len(kept)] in ",;:"
    assert kept.count("(") == kept.count(")")  # not cut inside the parentheses


def test_every_top_level_name_has_a_summary():
    """No ``Convenient wrapper of ...``: the handlers' docstrings are their own."""
    for name in pyrobnn.__all__:
        if name == "__version__":
            continue
        summary = first_sentence(getattr(pyrobnn, name))
        assert summary, name
        assert len(summary) <= SUMMARY_LENGTH + 4, (name, summary)
        assert summary.endswith((".", " ...")), (name, summary)
        assert summary.count("`") % 2 == 0, (name, summary)
        assert "Convenient wrapper" not in summary, (name, summary)


# ----------------------------------------------------------------------------- the guide pages' sources

PAGES = [*sorted((ROOT / "docs").glob("*.rst")), *sorted((ROOT / "docs" / "guide").glob("*.rst"))]
CODE_WIDTH = 85
"""The widest code line that fits the column of the site's theme at 1280 px, without a scroll bar."""

UNFOLLOWABLE = {
    "RESULTS.md named as a page (link :doc:`results`)": re.compile(r"(?<!``)RESULTS\.md"),
    "a test file (say what the test suite checks)": re.compile(r"``tests/[\w/]+\.py``"),
    "a commit hash (the results page has the commits)": re.compile(r"\b(?:[Aa]t|[Rr]erun at) [0-9a-f]{7,40}\b"),
    "a paper by its number in the project's list (cite it)": re.compile(r"\b[Pp]apers? 00\d(?!\s+on CIFAR)"),
}
"""What a reader of the site cannot follow; the contributors' pages (the layout of the repository's folders, and
how to work in it) excepted."""


def code_blocks(page: Path) -> list[str]:
    """The Python and shell code blocks of a reST page (not the ``text`` blocks that show a program's output)."""
    from docutils import nodes
    from docutils.core import publish_doctree

    tree = publish_doctree(page.read_text(), settings_overrides={"report_level": 5, "halt_level": 5})
    # a directive docutils does not know (Sphinx's, the site's own) comes back whole as a literal block inside
    # its error message: not code a reader sees
    return [block.astext() for block in tree.findall(nodes.literal_block)
            if "text" not in block["classes"] and not isinstance(block.parent, nodes.system_message)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_code_of_the_guides_fits_the_column(page):
    wide = [line for block in code_blocks(page) for line in block.splitlines() if len(line) > CODE_WIDTH]
    assert not wide, f"{page.name}: code lines wider than {CODE_WIDTH} characters: {wide}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in ("layout.rst", "contributing.rst")],
                         ids=lambda page: page.name)
def test_the_guides_name_nothing_the_site_cannot_follow(page):
    text = page.read_text()
    found = {what: pattern.findall(text) for what, pattern in UNFOLLOWABLE.items()}
    assert not any(found.values()), f"{page.name}: {found}"


# ----------------------------------------------------------------------------- the built site


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


OPTIONS = ["dataset", "method", "epochs", "num-chains", "prior.scale", "guide.rate", "vary", "checkpoint", "model"]
"""Options of the commands that the reference must print as they are typed."""

ALL_OPTIONS = {option.lstrip("-") for option in re.findall(
    r"--[a-z][\w.-]*", (ROOT / "docs" / "guide" / "command_line.rst").read_text())} | set(OPTIONS)
"""Option names as the guide writes them (an en-dash before a word that is not an option is prose)."""


@pytest.mark.slow
def test_every_flag_of_the_cli_reference_is_ascii_hyphens(site):
    page = (site / "generated" / "cli.html").read_text()
    text = text_of(page)
    dashed = re.findall(rf"[{DASHES}]-?[A-Za-z][\w.-]*", text)
    assert not dashed, f"cli.html: option names after a dash that is not ASCII: {dashed[:10]}"
    for option in OPTIONS:
        assert f"--{option}" in text, option
    assert "tv:NAME" in text and not re.search(r'href="tv:', page), "tv:NAME renders as a link"
    for path in sorted((site / "generated" / "api").glob("pyrobnn*.html")):  # the options in docstrings
        found = re.findall(rf"[{DASHES}]-?[a-z][\w.-]*", text_of(path.read_text()))
        flags = [flag for flag in found if flag.lstrip(DASHES + "-").rstrip(".") in ALL_OPTIONS]
        assert not flags, (path.name, flags[:10])


@pytest.mark.slow
def test_every_row_of_the_api_landing_table_has_a_summary(site):
    page = (site / "generated" / "api" / "pyrobnn.html").read_text()
    table = page[page.index("<table"):page.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    names = [name for name in pyrobnn.__all__ if name != "__version__"]
    assert len(rows) == len(names)
    for row in rows:
        cells = [text_of(cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        assert len(cells) == 2 and cells[1], cells
        assert "Convenient wrapper" not in cells[1], cells

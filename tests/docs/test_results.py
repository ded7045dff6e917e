"""The measured tables (``results/*.json``), RESULTS.md, and the advice the site computes from them.

- Every measured row carries its command, commit, machine and wall time; every figure parses; a figure without a
  standard error says why; a published figure names its source.
- RESULTS.md's rendered tables are what ``results/*.json`` renders (``python docs/_ext/results_data.py --write``),
  and every figure of a table that RESULTS.md does not render is written in the section the table names.
- Every claim of the pages' ``advice`` holds against its rows, every ``:result:`` names a figure that exists and
  every ``:results:`` a section of RESULTS.md; the method chooser's prose holds no figure typed by hand.
- A claim its row contradicts fails: the contradictions the docs review found (``which_method.rst`` at a6ca7fd)
  are each refuted by the rows, and a page with one of them does not build.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import results_data  # noqa: E402

DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.rst")), *sorted((DOCS / "guide").glob("*.rst"))]
TABLES = results_data.load()
ROWS = results_data.rows_of(TABLES)


def sections(markdown: str) -> dict[str, str]:
    """``{heading text: the text of its section}`` of a Markdown file (a section runs to the next heading)."""
    parts = re.split(r"^(#{1,6} .*)$", markdown, flags=re.M)
    out = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        title = re.sub(r"[`*]", "", heading.lstrip("#")).strip()
        out[title] = body
    return out


RESULTS_SECTIONS = sections(results_data.RESULTS_MD.read_text())


# ----------------------------------------------------------------------------- the files


@pytest.mark.parametrize("path", sorted(ROWS), ids=str)
def test_every_row_says_where_it_comes_from(path):
    row = ROWS[path]
    if row.published:
        assert row.data.get("source"), f"{path}: a published row names its source"
        return
    for key in results_data.PROVENANCE:
        assert row.provenance(key).strip(), f"{path}: no {key}"
    assert row.provenance("command").startswith(("pyrobnn ", "python ")), row.provenance("command")
    assert re.fullmatch(r"[0-9a-f]{7,40}", row.provenance("commit")), row.provenance("commit")
    if any(value.se is None for value in row.values.values()):
        assert row.no_se, f"{path}: a figure without a standard error, and no 'no_se' saying why"


def test_every_section_the_tables_name_is_a_heading_of_results_md():
    named = {row.section for row in ROWS.values()}
    assert not named - set(RESULTS_SECTIONS), named - set(RESULTS_SECTIONS)


def test_a_figure_parses_with_and_without_its_standard_error():
    assert results_data.Value.parse("\u22122.438 \u00b1 0.054") == results_data.Value("\u22122.438 \u00b1 0.054",
                                                                                      -2.438, 0.054)
    assert results_data.Value.parse("1,051").mean == 1051 and results_data.Value.parse("98.86").se is None
    with pytest.raises(ValueError, match="MEAN ± SE"):
        results_data.Value.parse("failed after training")


# ----------------------------------------------------------------------------- RESULTS.md


def test_results_md_renders_its_tables_from_the_files():
    text = results_data.RESULTS_MD.read_text()
    assert len(results_data.blocks(text)) >= 7
    assert results_data.render_results_md(text, TABLES) == text, \
        "RESULTS.md's tables differ from results/*.json: python docs/_ext/results_data.py --write"


def test_an_edited_figure_is_a_difference():
    text = results_data.RESULTS_MD.read_text()
    edited = text.replace("| map | 0.9091 ± 0.0018", "| map | 0.9191 ± 0.0018", 1)
    assert edited != text and results_data.render_results_md(edited, TABLES) == text


@pytest.mark.parametrize("path", sorted(ROWS), ids=str)
def test_every_figure_is_written_in_its_section_of_results_md(path):
    row = ROWS[path]
    section = RESULTS_SECTIONS[row.section]
    missing = [value.text for value in row.values.values() if value.text not in section]
    assert not missing, f"{path}: {missing} not in RESULTS.md's section {row.section!r}"


# ----------------------------------------------------------------------------- the pages


def advice_blocks(text: str) -> list[tuple[str, list[str], list[str]]]:
    """``(title, rests-on rows, claims)`` of each ``.. advice::`` of a reST page."""
    found = []
    for match in re.finditer(r"^\.\. advice:: (.+)\n((?:   .*\n|\n)+)", text, re.M):
        body = match.group(2)
        options = re.split(r"^   :([\w-]+):", body, flags=re.M)
        values = {options[i]: options[i + 1] for i in range(1, len(options) - 1, 2)}
        claims_text = values.get("claims", "").split("\n\n")[0]
        claims = [line.strip() for line in claims_text.splitlines() if line.strip()]
        found.append((match.group(1), values.get("rests-on", "").split(), claims))
    return found


ADVICE = [(page.name, *block) for page in PAGES for block in advice_blocks(page.read_text())]


def test_the_method_chooser_has_its_advice():
    titles = [title for page, title, _, _ in ADVICE if page == "which_method.rst"]
    assert len(titles) >= 8, titles
    assert all(claims for _, _, _, claims in ADVICE)


@pytest.mark.parametrize("page,title,rests_on,claims", ADVICE, ids=lambda v: v[:50] if isinstance(v, str) else "")
def test_every_claim_holds_against_its_rows(page, title, rests_on, claims):
    assert rests_on and all(path in ROWS for path in rests_on), rests_on
    for claim in claims:
        holds, what = results_data.check(claim, ROWS)
        assert holds, f"{page}, {title!r}: '{claim}' is contradicted: {what}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_figure_and_section_a_page_cites_exists(page):
    text = re.sub(r"``.*?``", "", page.read_text(), flags=re.S)  # a role shown as code is not a citation
    for target in re.findall(r":result:`([^`]+)`", text):
        path, _, metric = target.rpartition("/")
        assert path in ROWS and metric in ROWS[path].values, f"{page.name}: :result:`{target}`"
    for target in re.findall(r":results:`([^`]+)`", text, re.S):
        target = " ".join(target.split())
        section = target[:-1].rpartition(" <")[2] if target.endswith(">") else target
        assert section in RESULTS_SECTIONS, f"{page.name}: :results:`{target}` names no section of RESULTS.md"


PROSE_FIGURE = re.compile(r"(?<![\w.\-/])\d+\.\d+")
CRITERIA = {"1.96": "the normal quantile of a 95 % interval", "1.01": "the R-hat criterion a claim checks"}
"""Decimals in the prose that are not measured figures."""


@pytest.mark.parametrize("name", ["which_method.rst", "gotchas.rst"])
def test_the_advice_pages_type_no_measured_figure_by_hand(name):
    """Their figures come from rows (``:result:``); what is left once roles, code and options are removed is prose,
    with no decimal figure in it (a setting such as 1.41 is code: ``--prior.scale 1.41``)."""
    text = (DOCS / name).read_text()
    text = re.sub(r":\w+:`[^`]*`", "", text, flags=re.S)
    text = re.sub(r"``[^`]*``", "", text, flags=re.S)
    text = re.sub(r"^   :claims:\n(?:      .*\n)+", "", text, flags=re.M)
    text = re.sub(r"^\.\. [\w-]+::.*$", "", text, flags=re.M)
    figures = [figure for figure in PROSE_FIGURE.findall(text) if figure not in CRITERIA]
    assert not figures, f"{name}: figures typed by hand (cite them with :result:): {figures}"


# ----------------------------------------------------------------------------- contradicted claims fail

CONTRADICTED = [
    # "ensemble-5: the best accuracy, NLL and ECE": MAP's ECE is lower
    "best ece among mnist-ivon-short/*, mnist-baselines-short/*: mnist-baselines-short/ensemble-5",
    # "NUTS: the best UCI log-likelihoods": not on Yacht (MC dropout's mean is above it, and the noise model's far)
    "best log_likelihood among uci-20-splits/yacht/*: uci-20-splits/yacht/nuts-quick",
    "better log_likelihood: uci-20-splits/yacht/nuts-quick > uci-20-splits/yacht/mcdropout",
    # the superseded CIFAR-10 run: "the ensemble has the best accuracy", "flipout's corrupted ECE below MAP's"
    "best accuracy among cifar10-lenet/*: cifar10-lenet/ensemble-5",
    "better corrupted_ece: cifar10-lenet/bbb-flipout > cifar10-lenet/det",
    # "Laplace: second on the MNIST study": worse than MAP in NLL and ECE
    "better nll: mnist-baselines-short/laplace > mnist-ivon-short/map",
    "better ece: mnist-baselines-short/laplace > mnist-ivon-short/map",
    # "BLoB: a lower NLL and ECE than MAP-LoRA": within the paired intervals
    "paired-beyond nll: lora-imdb/blob",
    "paired-beyond ece: lora-imdb/blob",
]


@pytest.mark.parametrize("claim", CONTRADICTED)
def test_a_claim_its_rows_contradict_does_not_hold(claim):
    holds, what = results_data.check(claim, ROWS)
    assert not holds, what


@pytest.mark.parametrize("claim,error", [
    ("best ece: mnist-ivon-short/map", "among"),
    ("better ece: mnist-ivon-short/nope > mnist-ivon-short/map", "no row"),
    ("clearly-better accuracy: cifar10-lenet/det > cifar10-lenet/bbb", "no standard error"),
    ("better temperature: mnist-calibration/bbb > mnist-calibration/laplace", "says no 'better'"),
    ("sometimes ece: mnist-ivon-short/map", "unknown kind"),
])
def test_a_claim_that_cannot_be_checked_is_an_error(claim, error):
    with pytest.raises(results_data.ClaimError, match=error):
        results_data.check(claim, ROWS)


def test_a_page_with_a_contradicted_claim_does_not_build(tmp_path):
    """The ``advice`` directive checks its claims as Sphinx reads the page: with ``-W`` a contradicted one stops the
    build, and names the claim and the figures that refute it."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    source = tmp_path / "src"
    (source / "guide").mkdir(parents=True)
    (source / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(DOCS / '_ext')!r})\n"
                                    "extensions = ['myst_parser', 'pyrobnn_results']\n")
    # the results page the advice links to, as the site has it
    (source / "guide" / "results.md").write_text("---\norphan: true\n---\n" + results_data.RESULTS_MD.read_text())
    page = """
        Page
        ====

        .. advice:: The best calibrated: the deep ensemble
           :rests-on: mnist-baselines-short/ensemble-5
           :claims:
              {claim}

           Text.
        """
    for claim, builds in [(CONTRADICTED[0], False),
                          ("best ece among mnist-ivon-short/*, mnist-baselines-short/*: mnist-ivon-short/map", True)]:
        (source / "index.rst").write_text(textwrap.dedent(page.format(claim=claim)))
        result = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", "-E", str(source),
                                 str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
        assert (result.returncode == 0) == builds, result.stderr
        if not builds:
            assert "is contradicted by its rows" in result.stderr and "0.0374 ± 0.0013" in result.stderr, \
                result.stderr

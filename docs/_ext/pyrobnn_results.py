"""The site's figures from the measured tables (``results/*.json``, read by ``results_data.py``), each linked to its
section of the results page (``guide/results``, ``RESULTS.md`` rendered by MyST).

- ``:result:`TABLE/ROW/METRIC``` prints the figure as the row records it (``0.0374 ± 0.0013``), linked to the row's
  section of the results page.
- ``:results:`Section title``` (or ``:results:`text <Section title>```) links to a section of the results page.
- ``.. results-table:: PATTERN [PATTERN ...]`` renders the rows the patterns match (``:metrics:`` picks columns),
  with each run's command, commit, machine and wall time under it.
- ``.. results-command:: TABLE/ROW`` shows the command behind a row, as a shell block.
- ``.. advice:: Title`` is a recommendation: its text, the rows it rests on (``:rests-on:``, linked) and its claims
  (``:claims:``, one a line, ``results_data.check``), each checked when the site is built: a claim its row
  contradicts is a warning, so the build (``-W``) fails.

Every section of the results page is a label ``results:<its title>`` (what the roles point at).
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.util import logging
from sphinx.util.nodes import clean_astext

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_data  # noqa: E402

logger = logging.getLogger(__name__)
RESULTS_PAGE = "guide/results"
_TABLES: dict | None = None


def tables() -> dict:
    global _TABLES
    if _TABLES is None:
        _TABLES = results_data.load()
    return _TABLES


def rows() -> dict:
    return results_data.rows_of(tables())


def label(section: str) -> str:
    return nodes.fully_normalize_name(f"results:{section}")


def register_sections(app, document) -> None:
    """Every section of the results page becomes the label ``results:<title>``."""
    if app.env.current_document.docname != RESULTS_PAGE:
        return
    domain = app.env.domains.standard_domain
    for section in document.findall(nodes.section):
        title = clean_astext(section[0])
        name = label(title)
        domain.anonlabels[name] = RESULTS_PAGE, section["ids"][0]
        domain.labels[name] = RESULTS_PAGE, section["ids"][0], title


def link(section: str, text: str, rawtext: str = "") -> addnodes.pending_xref:
    """A reference to the section ``section`` of the results page, showing ``text``."""
    node = addnodes.pending_xref(rawtext, refdomain="std", reftype="ref", reftarget=label(section), refexplicit=True,
                                 refwarn=True)
    node += nodes.inline(text, text, classes=["result"])
    return node


def result_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    path, _, metric = text.strip().rpartition("/")
    row = rows().get(path)
    if row is None or metric not in row.values:
        message = f":result:`{text}`: no row {path!r} with {metric!r} in results/*.json"
        return [nodes.literal(rawtext, text)], [inliner.reporter.warning(message, line=lineno)]
    return [link(row.section, row.values[metric].text, rawtext)], []


def results_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    text = " ".join(text.split())
    shown, section = text, text
    if text.endswith(">") and " <" in text:
        shown, _, section = text[:-1].rpartition(" <")
    return [link(section.strip(), shown.strip(), rawtext)], []


def _escape(text: str) -> str:
    return text.replace("*", "\\*").replace("`", "\\`").replace("|", "\\|")


def provenance(table_or_row, rst: bool = True) -> str:
    """``command`` at commit, machine, wall: the run behind a table or a row, as reST."""
    get = table_or_row.provenance if hasattr(table_or_row, "provenance") else table_or_row.data.get
    if getattr(table_or_row, "published", False):
        return _escape(table_or_row.data["source"])
    return f"``{get('command')}`` at {get('commit')}, {_escape(get('machine'))}, {_escape(get('wall'))}"


class ResultsTable(Directive):
    """The rows the argument's patterns match, as a table whose figures keep their standard errors."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"metrics": directives.unchanged_required, "caption": directives.unchanged}
    has_content = False

    def run(self):
        found = []
        for pattern in self.arguments[0].split():
            matched = [row for path, row in rows().items() if results_data.fnmatch.fnmatchcase(path, pattern)]
            if not matched:
                raise self.error(f"results-table: no row matches {pattern!r} in results/*.json")
            found += [row for row in matched if row not in found]
        metrics = self.options.get("metrics", "").split() or list(found[0].table.metrics)
        layout = found[0].table.data.get("layout")
        lines = [".. list-table:: " + self.options.get("caption", ""), "   :header-rows: 1", ""]
        if layout and all(row.table is found[0].table for row in found):
            lines += self._pivot(found, metrics, layout)
        else:
            lines += self._flat(found, metrics)
        runs, notes = {}, {}
        for row in found:
            runs.setdefault(provenance(row), []).append(row)
            if row.no_se and any(v.se is None for v in row.values.values()):
                notes.setdefault(row.no_se, []).append(row)
        lines.append("")
        for text, members in runs.items():
            sections = dict.fromkeys(row.section for row in members)
            where = ", ".join(f":results:`{s}`" for s in sections)
            names = ", ".join(dict.fromkeys(row.data.get("column", row.label) for row in members))
            lines.append(f"- {_escape(names)}: {text} ({where}).")
        for reason, members in notes.items():
            names = ", ".join(dict.fromkeys(row.data.get("column", row.label) for row in members))
            lines.append(f"- No standard error for {_escape(names)}: {_escape(reason)}.")
        container = nodes.container(classes=["results-table"])
        self.state.nested_parse(StringList(lines, source="results-table"), self.content_offset, container)
        return [container]

    @staticmethod
    def _cell(row, metric: str, bold: bool = False) -> str:
        value = row.values.get(metric)
        if value is None:
            return ""
        text = _escape(value.text)
        return f"**{text}**" if bold else text

    def _flat(self, found, metrics):
        lines = ["   * - method"] + [f"     - {_escape(found[0].table.metrics[m].get('label', m))}" for m in metrics]
        best = {m: results_data._best_paths(found[0].table, m, found) for m in metrics
                if found[0].table.metrics.get(m, {}).get("better")}
        for row in found:
            lines.append(f"   * - {_escape(row.label)}")
            lines += [f"     - {self._cell(row, m, row.path in best.get(m, ()))}" for m in metrics]
        return lines

    def _pivot(self, found, metrics, layout):
        columns = list(dict.fromkeys(row.data["column"] for row in found))
        groups = list(dict.fromkeys(row.data["group"] for row in found))
        lines = [f"   * - {_escape(layout['group'])}"] + [f"     - {_escape(c)}" for c in columns]
        for group in groups:
            members = {row.data["column"]: row for row in found if row.data["group"] == group}
            best = set()
            if layout.get("bold") in metrics:
                best = results_data._best_paths(found[0].table, layout["bold"], list(members.values()))
            lines.append(f"   * - {_escape(group)}")
            for column in columns:
                row = members.get(column)
                cell = " / ".join(self._cell(row, m, m == layout.get("bold") and row.path in best)
                                  for m in metrics) if row else "not run"
                lines.append(f"     - {cell}")
        return lines


def wrapped(command: str, width: int = 85) -> list[str]:
    """A command line cut at its options into lines of at most ``width`` characters, continued with ``\\``."""
    lines, current = [], ""
    for word in command.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and len(candidate) + 2 > width and word.startswith("-"):
            lines.append(current + " \\")
            current = "    " + word
        else:
            current = candidate
    return lines + [current]


class ResultsCommand(Directive):
    """The command behind a row, as a shell block (``&&`` starts a new command), its commit and wall time under it."""

    required_arguments = 1
    has_content = False

    def run(self):
        row = rows().get(self.arguments[0])
        if row is None:
            raise self.error(f"results-command: no row {self.arguments[0]!r} in results/*.json")
        code = [line for part in row.provenance("command").split(" && ") for line in wrapped(part)]
        block = nodes.literal_block("\n".join(code), "\n".join(code), language="bash")
        note = nodes.container(classes=["results-command"])
        text = (f"Commit {row.provenance('commit')}, {_escape(row.provenance('machine'))}, "
                f"{_escape(row.provenance('wall'))}: :results:`{row.section}`.")
        self.state.nested_parse(StringList([text], source="results-command"), self.content_offset, note)
        return [block, note]


class Advice(Directive):
    """A recommendation, the rows it rests on, and its claims, checked against them."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"rests-on": directives.unchanged_required, "claims": directives.unchanged_required}
    has_content = True

    def run(self):
        known = rows()
        container = nodes.container(classes=["advice"])
        title = nodes.paragraph(classes=["advice-title"])
        title_nodes, messages = self.state.inline_text(self.arguments[0], self.lineno)
        title += nodes.strong("", "", *title_nodes)
        container += title
        self.state.nested_parse(self.content, self.content_offset, container)
        rested = []
        for path in self.options["rests-on"].split():
            if path not in known:
                raise self.error(f"advice: :rests-on: names {path!r}, which no results/*.json holds")
            row = known[path]
            rested.append(f":results:`{_escape(row.label)}, {_escape(row.table.title)} <{row.section}>`")
        checked = []
        for claim in filter(None, (line.strip() for line in self.options["claims"].splitlines())):
            try:
                holds, what = results_data.check(claim, known)
            except results_data.ClaimError as error:
                raise self.error(f"advice {self.arguments[0]!r}: {error}") from None
            if not holds:
                logger.warning(f"advice {self.arguments[0]!r}: the claim '{claim}' is contradicted by its rows: {what}",
                               location=(self.state.document.settings.env.docname, self.lineno))
            checked.append(_escape(what))
        lines = ["Rests on: " + "; ".join(rested) + ".", "",
                 "Checked against those rows when this page is built: " + "; ".join(checked) + "."]
        footer = nodes.container(classes=["advice-rows"])
        self.state.nested_parse(StringList(lines, source="advice"), self.content_offset, footer)
        container += footer
        return [container, *messages]


def setup(app):
    app.add_role("result", result_role)
    app.add_role("results", results_role)
    app.add_directive("results-table", ResultsTable)
    app.add_directive("advice", Advice)
    app.add_directive("results-command", ResultsCommand)
    app.connect("doctree-read", register_sections)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

"""The measured tables behind the documentation's advice: ``results/*.json`` at the repository's root.

Each file holds tables; a table is one command's run (its ``command``, ``commit``, ``machine``, ``wall`` and the
``section`` of ``RESULTS.md`` that describes it), and each of its rows a method's figures, written as ``RESULTS.md``
prints them: ``"0.9091 ± 0.0018"`` (mean ± standard error), or ``"98.11"`` where no standard error was measured (the
row's or table's ``no_se`` says why). A row may carry its own ``command``, ``commit``, ``wall`` and ``section`` (a
column of a table that another run produced), or a ``source`` instead when it is a published figure. ``differences``
holds the row's paired difference to the table's baseline, as the study's report prints it (``*``: its 95 %
interval excludes 0).

Three readers share this module, so a figure has one place:

- ``RESULTS.md``: its tables between ``<!-- results: TABLE -->`` and ``<!-- end results -->`` are rendered from the
  files (``python docs/_ext/results_data.py --write`` rewrites them; a test checks that they agree).
- the site (``pyrobnn_results.py``): the ``:result:`` role prints a figure from its row, linked to its section of
  the results page; ``results-table`` renders a table; ``advice`` renders a recommendation with the rows it rests
  on, and checks its claims against them.
- the tests (``tests/docs/test_results.py``): every claim of the pages holds, and a contradicted one fails.

A claim, one a line: ``KIND METRIC[ among PATTERN[, PATTERN ...]]: OPERANDS``. An operand is a row's path,
``TABLE/ROW`` (``mnist-ivon-short/map``), optionally ``@OTHER_METRIC``; a pattern is a glob over row paths
(published rows are left out of a pattern's matches). A metric's ``better`` (``higher`` or ``lower``) says which way
is better.

- ``best METRIC among PATTERNS: ROW``, ``worst ...``: the row's mean is the best (worst) of the rows matched;
- ``better METRIC: A > B``: A's mean is better than B's;
- ``clearly-better METRIC: A > B``: by more than 1.96 standard errors of the difference (the two standard errors
  combined as independent); ``within-error METRIC: A ~ B``: by at most that (both need standard errors);
- ``paired-noise METRIC: ROW``, ``paired-beyond METRIC: ROW``: the row's paired difference to its table's baseline
  has an interval that holds 0 (no ``*``), or one that excludes it;
- ``at-most METRIC: ROW <= NUMBER``, ``at-least METRIC: ROW >= NUMBER`` (``ROW`` may be a pattern: every row it
  matches);
- ``ratio METRIC: A / B = NUMBER``: the ratio of the means, to the digits the number is written with.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
RESULTS_MD = ROOT / "RESULTS.md"
PROVENANCE = ("command", "commit", "machine", "wall")
"""What every measured row carries (its own, or its table's)."""
Z95 = 1.96


def number(text: str) -> float:
    """A figure as ``RESULTS.md`` writes it: a Unicode minus, thousands commas, a ``%`` or a trailing ``*``."""
    cleaned = text.replace("\u2212", "-").replace(",", "").replace("%", "").replace("*", "").strip()
    return float(cleaned)


@dataclass(frozen=True)
class Value:
    """A figure: its text as written, its mean and its standard error (None where none was measured)."""

    text: str
    mean: float
    se: float | None

    @classmethod
    def parse(cls, text: str) -> Value:
        mean, _, se = text.partition("±")
        try:
            return cls(text, number(mean), number(se) if se.strip() else None)
        except ValueError:
            raise ValueError(f"not a figure: {text!r} (write 'MEAN' or 'MEAN ± SE')") from None


@dataclass(eq=False)
class Row:
    """One row of a table: ``path`` is ``TABLE/ROW``."""

    path: str
    label: str
    values: dict[str, Value]
    differences: dict[str, str]
    table: Table
    data: dict

    def provenance(self, key: str) -> str:
        """The row's ``command``, ``commit``, ``machine``, ``wall`` or ``section``: its own, else its table's."""
        if self.published:
            return self.data.get(key, "")
        return self.data.get(key, self.table.data.get(key, ""))

    @property
    def published(self) -> bool:
        return bool(self.data.get("published"))

    @property
    def section(self) -> str:
        return self.data.get("section", self.table.section)

    @property
    def no_se(self) -> str:
        """Why some of its figures have no standard error (empty when all have one)."""
        return self.data.get("no_se", self.table.data.get("no_se", ""))


@dataclass(eq=False)
class Table:
    id: str
    title: str
    section: str
    metrics: dict[str, dict]
    data: dict
    source: Path
    rows: dict[str, Row] = field(default_factory=dict)


def load(folder: Path = RESULTS) -> dict[str, Table]:
    """Every table of ``folder/*.json``, by id; a malformed file raises ValueError naming it and the fix."""
    tables: dict[str, Table] = {}
    for path in sorted(folder.glob("*.json")):
        for data in json.loads(path.read_text())["tables"]:
            if data["id"] in tables:
                raise ValueError(f"{path.name}: table id {data['id']!r} is also in {tables[data['id']].source.name}")
            table = Table(data["id"], data["title"], data["section"], data["metrics"], data, path)
            for row_data in data["rows"]:
                values = {}
                for metric, text in row_data["values"].items():
                    if metric not in table.metrics:
                        raise ValueError(f"{path.name}: {table.id}/{row_data['id']} has {metric!r}, which the table's "
                                         f"'metrics' does not declare")
                    values[metric] = Value.parse(text)
                row = Row(f"{table.id}/{row_data['id']}", row_data.get("label", row_data.get("column", row_data["id"])),
                          values, row_data.get("differences", {}), table, row_data)
                table.rows[row_data["id"]] = row
            tables[table.id] = table
    return tables


def rows_of(tables: dict[str, Table]) -> dict[str, Row]:
    """Every row by its path ``TABLE/ROW``."""
    return {row.path: row for table in tables.values() for row in table.rows.values()}


# ----------------------------------------------------------------------------- claims


class ClaimError(ValueError):
    """A claim that does not parse, or names a row or a metric that does not exist."""


@dataclass(frozen=True)
class Operand:
    row: Row
    metric: str

    @property
    def value(self) -> Value:
        if self.metric not in self.row.values:
            raise ClaimError(f"{self.row.path} has no {self.metric!r}")
        return self.row.values[self.metric]

    def __str__(self) -> str:
        return f"{self.row.path}@{self.metric}"


def _direction(row: Row, metric: str) -> int:
    better = row.table.metrics.get(metric, {}).get("better")
    if better not in ("higher", "lower"):
        raise ClaimError(f"{row.table.id}: metric {metric!r} says no 'better' (higher or lower), so none is best")
    return 1 if better == "higher" else -1


def _operand(rows: dict[str, Row], text: str, metric: str) -> Operand:
    path, _, other = text.strip().partition("@")
    if path not in rows:
        raise ClaimError(f"no row {path!r} in results/*.json")
    return Operand(rows[path], other or metric)


def _matches(rows: dict[str, Row], patterns: str) -> list[Row]:
    found = {path: row for pattern in patterns.split(",") for path, row in rows.items()
             if fnmatch.fnmatchcase(path, pattern.strip()) and (not row.published or path == pattern.strip())}
    if not found:
        raise ClaimError(f"no row matches {patterns!r}")
    return list(found.values())


def _gap(a: Operand, b: Operand) -> tuple[float, float]:
    """(how much better A is than B, in the metric's direction; 1.96 standard errors of that difference)."""
    va, vb = a.value, b.value
    if va.se is None or vb.se is None:
        missing = a if va.se is None else b
        raise ClaimError(f"{missing} has no standard error ({missing.row.no_se or 'none recorded'}): "
                         f"claim an order ('better'), not a margin")
    return _direction(a.row, a.metric) * (va.mean - vb.mean), Z95 * math.hypot(va.se, vb.se)


CLAIM = re.compile(r"^(?P<kind>[a-z-]+)\s+(?P<metric>\w+)(?:\s+among\s+(?P<among>[^:]+))?\s*:\s*(?P<rest>.+)$")


def check(claim: str, rows: dict[str, Row]) -> tuple[bool, str]:
    """Evaluate one claim against the rows: ``(holds, what was compared)``. Raises ClaimError when it does not
    parse or names what does not exist."""
    match = CLAIM.match(claim.strip())
    if not match:
        raise ClaimError(f"not a claim: {claim!r} (KIND METRIC[ among PATTERNS]: OPERANDS)")
    kind, metric, among, rest = match["kind"], match["metric"], match["among"], match["rest"].strip()
    if kind in ("best", "worst"):
        if not among:
            raise ClaimError(f"{claim!r}: 'best' and 'worst' need 'among PATTERNS'")
        target = _operand(rows, rest, metric)
        field_ = [Operand(row, target.metric) for row in _matches(rows, among) if target.metric in row.values]
        sign = _direction(target.row, target.metric) * (1 if kind == "best" else -1)
        top = max(field_, key=lambda o: sign * o.value.mean)
        holds = sign * target.value.mean >= sign * top.value.mean
        return holds, f"{target} = {target.value.text}; the {kind} of {len(field_)} rows is {top} = {top.value.text}"
    if kind in ("better", "clearly-better", "within-error"):
        sep = "~" if kind == "within-error" else ">"
        if sep not in rest:
            raise ClaimError(f"{claim!r}: write 'A {sep} B'")
        a, b = (_operand(rows, side, metric) for side in rest.split(sep))
        if kind == "better":
            gap = _direction(a.row, a.metric) * (a.value.mean - b.value.mean)
            return gap > 0, f"{a} = {a.value.text} against {b} = {b.value.text}"
        gap, margin = _gap(a, b)
        holds = gap > margin if kind == "clearly-better" else abs(gap) <= margin
        return holds, (f"{a} = {a.value.text} against {b} = {b.value.text}: difference {gap:+.4g}, "
                       f"1.96 s.e. {margin:.4g}")
    if kind in ("paired-noise", "paired-beyond"):
        target = _operand(rows, rest, metric)
        difference = target.row.differences.get(target.metric)
        if difference is None:
            raise ClaimError(f"{target}: the row records no paired difference")
        beyond = difference.rstrip().endswith("*")
        return beyond == (kind == "paired-beyond"), f"{target}: paired difference {difference}"
    if kind in ("at-most", "at-least"):
        sep = "<=" if kind == "at-most" else ">="
        if sep not in rest:
            raise ClaimError(f"{claim!r}: write 'ROW {sep} NUMBER'")
        side, bound = rest.split(sep)
        bound_value = number(bound)
        name, _, other = side.strip().partition("@")
        targets = [Operand(row, other or metric) for row in _matches(rows, name)]
        worst = [o for o in targets if (o.value.mean > bound_value if sep == "<=" else o.value.mean < bound_value)]
        described = ", ".join(f"{o} = {o.value.text}" for o in targets)
        return not worst, f"{described} against {sep} {bound.strip()}"
    if kind == "ratio":
        if "/" not in rest or "=" not in rest:
            raise ClaimError(f"{claim!r}: write 'A / B = NUMBER'")
        pair, written = rest.split("=")
        # the row paths hold slashes: the operands are split at the ' / ' with spaces
        if " / " not in pair:
            raise ClaimError(f"{claim!r}: separate the two rows with ' / ' (spaces around the slash)")
        a, b = (_operand(rows, side, metric) for side in pair.split(" / "))
        ratio = a.value.mean / b.value.mean
        decimals = len(written.strip().partition(".")[2])
        holds = abs(ratio - number(written)) <= 0.5 * 10 ** -decimals + 1e-12
        return holds, f"{a} / {b} = {a.value.text} / {b.value.text} = {ratio:.4g}, written {written.strip()}"
    raise ClaimError(f"{claim!r}: unknown kind {kind!r} (best, worst, better, clearly-better, within-error, "
                     f"paired-noise, paired-beyond, at-most, at-least, ratio)")


# ----------------------------------------------------------------------------- RESULTS.md


def _cell(row: Row, metric: str, bold: bool = False) -> str:
    value = row.values.get(metric)
    if value is None:
        return ""
    text = f"**{value.text}**" if bold else value.text
    difference = row.differences.get(metric)
    return f"{text} ({difference})" if difference else text


def _best_paths(table: Table, metric: str, rows: list[Row]) -> set[str]:
    measured = [row for row in rows if metric in row.values and not row.published]
    if not measured:
        return set()
    sign = _direction(measured[0], metric)
    top = max(sign * row.values[metric].mean for row in measured)
    return {row.path for row in measured if sign * row.values[metric].mean == top}


def markdown(table: Table) -> str:
    """The table as ``RESULTS.md`` prints it: a Markdown table, then its provenance line."""
    rows = list(table.rows.values())
    layout = table.data.get("layout")
    lines = []
    if layout:  # groups down, columns across: one cell holds the metrics of ``layout["cell"]``
        columns = list(dict.fromkeys(row.data["column"] for row in rows))
        groups = list(dict.fromkeys(row.data["group"] for row in rows))
        lines.append("| " + " | ".join([layout["group"], *columns]) + " |")
        lines.append("|" + "---|" * (len(columns) + 1))
        for group in groups:
            members = {row.data["column"]: row for row in rows if row.data["group"] == group}
            bold = _best_paths(table, layout.get("bold", ""), list(members.values())) if layout.get("bold") else set()
            cells = []
            for column in columns:
                row = members.get(column)
                if row is None:
                    cells.append("left out")
                    continue
                cells.append(" / ".join(_cell(row, m, bold=(m == layout.get("bold") and row.path in bold))
                                        for m in layout["cell"]))
            lines.append("| " + " | ".join([group, *cells]) + " |")
    else:
        metrics = list(table.metrics)
        bold = {metric: _best_paths(table, metric, rows) for metric in table.data.get("bold", [])}
        lines.append("| " + " | ".join(["method", *(table.metrics[m].get("label", m) for m in metrics)]) + " |")
        lines.append("|" + "---|" * (len(metrics) + 1))
        for row in rows:
            cells = [_cell(row, m, bold=row.path in bold.get(m, ())) for m in metrics]
            lines.append("| " + " | ".join([row.label, *cells]) + " |")
    notes = [table.data.get("statistic", "")]
    if table.data.get("bold") and not layout:
        notes.append("bold: the best of a column")
    if table.data.get("difference"):
        notes.append("in parentheses: " + table.data["difference"])
    if table.data.get("no_se"):
        notes.append(table.data["no_se"])
    own = tuple(table.data.get(k, "") for k in PROVENANCE)
    lines += ["", "*" + "; ".join(n for n in notes if n) + ".*", "",
              f"*Rendered from `{table.source.relative_to(ROOT).as_posix()}` (table `{table.id}`): `{own[0]}` at "
              f"{own[1]}, {own[2]}, {own[3]}.*"]
    others: dict[tuple, dict[str, list[str]]] = {}
    for row in rows:  # the columns another run produced, and the published figures
        key = ("source", row.data["source"]) if row.published else tuple(row.provenance(k) for k in PROVENANCE)
        if row.published or key != own:
            groups = others.setdefault(key, {}).setdefault(row.data.get("column", row.label), [])
            if "group" in row.data:
                groups.append(row.data["group"])
    for key, columns in others.items():
        every = {row.data.get("group") for row in rows}
        what = ", ".join(column + ("" if set(groups) == every or not groups else f" ({', '.join(groups)})")
                         for column, groups in columns.items())
        if key[0] == "source":
            lines.append(f"- {what}: {key[1]}.")
        else:
            command, commit, machine, wall = key
            lines.append(f"- {what}: `{command}` at {commit}, {machine}, {wall}.")
    return "\n".join(lines)


START = re.compile(r"<!-- results: (?P<id>[\w.-]+) -->\n")
END = "<!-- end results -->"


def _blocks(text: str) -> list[tuple[str, int, int]]:
    """``(table id, start of the body, end of the body)`` of each block ``<!-- results: ID -->`` ... ``<!-- end
    results -->``; a block without its end raises ValueError."""
    found = []
    for match in START.finditer(text):
        end = text.find(END, match.end())
        following = START.search(text, match.end())
        if end < 0 or (following and following.start() < end):
            raise ValueError(f"RESULTS.md: the block of table {match['id']!r} has no '{END}' line before the next "
                             f"block")
        found.append((match["id"], match.end(), end))
    return found


def render_results_md(text: str, tables: dict[str, Table]) -> str:
    """``text`` with every block ``<!-- results: ID -->`` ... ``<!-- end results -->`` rendered from its table."""
    out, position = [], 0
    for table_id, body_start, body_end in _blocks(text):
        if table_id not in tables:
            raise ValueError(f"RESULTS.md names table {table_id!r}, which no results/*.json holds")
        out += [text[position:body_start], "\n", markdown(tables[table_id]), "\n\n"]
        position = body_end
    return "".join(out) + text[position:]


def blocks(text: str) -> list[str]:
    """The table ids that ``RESULTS.md`` renders."""
    return [table_id for table_id, _, _ in _blocks(text)]


if __name__ == "__main__":
    tables = load()
    current = RESULTS_MD.read_text()
    rendered = render_results_md(current, tables)
    if "--write" in sys.argv[1:]:
        RESULTS_MD.write_text(rendered)
        print(f"RESULTS.md: {len(blocks(rendered))} tables rendered from results/*.json")
    else:
        print("RESULTS.md agrees with results/*.json" if rendered == current else
              "RESULTS.md differs from results/*.json: python docs/_ext/results_data.py --write")
        sys.exit(0 if rendered == current else 1)

"""Sphinx configuration of pyrobnn's documentation (``make docs``; ``make docs-check`` is CI's build).

The API and command-line pages are generated at each build (``_ext/pyrobnn_reference.py``); the tutorials are
scripts in ``tutorials/`` that sphinx-gallery runs and renders with their output. ``PYROBNN_TUTORIAL_SIZE=ci`` runs
them at their CI size (seconds each); the default is the size a reader runs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE / "tutorials"))  # the tutorials' own helpers, if any

import pyrobnn  # noqa: E402

project = "pyrobnn"
author = "the pyrobnn authors"
copyright = "the pyrobnn authors"
release = pyrobnn.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
    "pyrobnn_reference",
    "pyrobnn_results",
]

# RESULTS.md is a page of the site (guide/results.md includes it): MyST reads its Markdown, and every heading down to
# ### gets an anchor that links can point at (pyrobnn_results.py registers each as a label).
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_heading_anchors = 3

# The docstrings are plain reST (roles, :math:, field-free prose): autodoc reads them as they are.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False
autosummary_generate = False
autosummary_imported_members = True
python_maximum_signature_line_length = 96
add_module_names = False
toc_object_entries_show_parents = "hide"

# Every reference must name something that exists (``pyrobnn_reference.missing_reference`` renders references to
# existing objects without an entry, torch's and Pyro's included, as code; there is no network for their
# inventories). The build runs with -W: a broken reference, a docstring that does not parse and a public name
# without a docstring each fail it.
nitpicky = True
# ``--option`` stays two hyphens (smart quotes would print an en-dash, and a flag copied from the page would fail).
smartquotes = False
nitpick_ignore_regex = [
    # annotation fragments that are not names (``Literal['a', 'b']`` values, string forward references)
    ("py:class", r"^['\"].*"),
    ("py:class", r"^-?\d.*"),
    ("py:class", r"^(True|False|None|Ellipsis|\.\.\.)$"),
]

exclude_patterns = ["_build", "tutorials/*", "**/*.ipynb", "auto_tutorials/*.py", "auto_tutorials/*.zip",
                    "auto_tutorials/*.json"]
templates_path = []
html_static_path = ["_static"]

# Math: MathJax from the site itself when the docs extra brought its files (jupyter-server-mathjax's MathJax 2), so
# the pages read offline too; else from its CDN.
_mathjax = importlib.util.find_spec("jupyter_server_mathjax")
if _mathjax is not None:
    _static = Path(next(iter(_mathjax.submodule_search_locations))) / "static"
    if (_static / "MathJax.js").exists():
        html_static_path.append(str(_static))
        mathjax_path = "MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
        mathjax2_config = {"tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                                       "processEscapes": True, "ignoreClass": "document",
                                       "processClass": "math|output_area"},
                           "showMathMenu": False, "messageStyle": "none"}
html_css_files = ["pyrobnn.css"]

html_theme = "furo"
html_title = f"pyrobnn {release}"
html_theme_options = {
    "source_repository": None,
    "navigation_with_keys": True,
}
html_show_sourcelink = False
html_copy_source = False

SIZE = os.environ.get("PYROBNN_TUTORIAL_SIZE", "full")
# sphinx-gallery reruns a tutorial only when its source changed: a build of the other size reruns them all.
_stamp = HERE / "auto_tutorials" / ".size"
if not _stamp.exists() or _stamp.read_text() != SIZE:
    for _md5 in _stamp.parent.glob("*.md5"):
        _md5.unlink()
    _stamp.parent.mkdir(exist_ok=True)
    _stamp.write_text(SIZE)

sphinx_gallery_conf = {
    "examples_dirs": "tutorials",
    "gallery_dirs": "auto_tutorials",
    "filename_pattern": r"/\d\d_",          # run every tutorial
    "ignore_pattern": r"/_",                 # helpers
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "image_scrapers": ("matplotlib",),
    "matplotlib_animations": False,
    "reset_modules": ("matplotlib", "gallery_reset.reset"),
    "reset_modules_order": "before",
    "capture_repr": (),
    "min_reported_time": 1,
    "show_memory": False,
    "show_signature": False,
    "only_warn_on_example_error": False,
    "abort_on_example_error": False,
    "plot_gallery": "True",
    "doc_module": (),
    "backreferences_dir": None,
    "first_notebook_cell": None,
    # no sg_execution_times page: it loads jQuery and DataTables from a CDN (each page keeps its running time)
    "write_computation_times": False,
}


def _strip_ansi(app, what, name, obj, options, lines):
    """Docstrings written for a terminal keep no colour codes."""
    for i, line in enumerate(lines):
        lines[i] = re.sub(r"\x1b\[[0-9;]*m", "", line)


def setup(app):
    app.connect("autodoc-process-docstring", _strip_ansi)

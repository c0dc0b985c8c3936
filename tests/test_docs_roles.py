"""The API pages render the docstrings' Sphinx roles and literal markers (a MkDocs hook,
docs/sphinx_roles.py, listed in mkdocs.yml)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _hook():
    spec = importlib.util.spec_from_file_location("sphinx_roles", ROOT / "docs/sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_roles_become_code_and_literal_markers_a_colon():
    render = _hook().render
    assert render("<p>see :mod:<code>sfg.round.kernel</code> and :func:<code>replay</code></p>") \
        == "<p>see <code>sfg.round.kernel</code> and <code>replay</code></p>"
    assert render("<p>via :class:<code>~sfg.net.world.Trainer</code>)</p>") \
        == "<p>via <code>Trainer</code>)</p>"
    assert render("<p>Example::</p>") == "<p>Example:</p>"
    # text that is not a role stays as it is
    for html in ("<p>ratio 1:2 <code>x</code></p>", "<pre><code>a::b\n</code></pre>",
                 "<p>key:<code>v</code></p>"):
        assert render(html) == html


def test_the_site_runs_the_hook_and_no_docstring_role_would_stay_raw():
    """mkdocs.yml lists the hook; every role written in a docstring is one it renders."""
    import re

    assert "- docs/sphinx_roles.py" in (ROOT / "mkdocs.yml").read_text()
    roles = set()
    for path in (ROOT / "src/sfg").rglob("*.py"):
        roles.update(re.findall(r":(?:py:)?([a-z]+):`", path.read_text()))
    assert roles <= set(_hook().ROLES), roles - set(_hook().ROLES)

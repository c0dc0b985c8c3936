"""MkDocs hook: the docstrings are written with Sphinx roles (``:mod:`sfg.round.kernel```,
``:class:`~sfg.net.world.Trainer```) and literal-block markers (``Example::``), which
mkdocstrings' sphinx style leaves as text. After a page is rendered, each role becomes the
code it wraps (``~`` keeps the last name, as in Sphinx) and a paragraph's closing ``::``
becomes ``:`` (the indented block after it is already code)."""

from __future__ import annotations

import re

ROLES = ("mod", "func", "class", "data", "meth", "attr", "exc", "obj", "const", "ref")

_ROLE = re.compile(r":(?:py:)?(?:" + "|".join(ROLES) + r"):<code>(~?)([^<]*)</code>")
_LITERAL = re.compile(r"::</p>")


def _code(m: re.Match) -> str:
    tilde, target = m.group(1), m.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def render(html: str) -> str:
    """``html`` with the Sphinx roles and literal markers rendered (see the module)."""
    return _LITERAL.sub(":</p>", _ROLE.sub(_code, html))


def on_page_content(html: str, **kwargs) -> str:
    return render(html)

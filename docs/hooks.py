"""MkDocs hook: docstrings' Sphinx roles show as the code they name.

The reference pages made from the code are written by ``python docs/generate.py`` (run it before a build);
tests/test_docs_site.py checks the committed ones are current.
"""

import re

#: A Sphinx cross-reference role left in a rendered docstring (``:func:`create``` becomes ``:func:<code>create</code>``).
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const|term):<code>(~?)([^<]*)</code>")


def on_page_content(html, page, config, files):
    """Show docstrings' Sphinx roles as the code they name (``:func:`create``` as ``create``)."""
    return ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)

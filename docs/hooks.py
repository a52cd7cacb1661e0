"""MkDocs hooks: docstrings' Sphinx roles show as the code they name; a figure opens full size when clicked.

The reference pages made from the code are written by ``python docs/generate.py`` (run it before a build);
tests/test_docs_site.py checks the committed ones are current.
"""

import re

#: A Sphinx cross-reference role left in a rendered docstring (``:func:`create``` becomes ``:func:<code>create</code>``).
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const|term):<code>(~?)([^<]*)</code>")
#: A figure not already inside a link.
FIGURE = re.compile(r'(?<!">)(<img [^>]*src="([^"]+)"[^>]*>)(?!</a>)')


def on_page_content(html, page, config, files):
    """Roles as code, and every figure a link to its full-size file (a wide figure is small on a phone)."""
    html = ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)
    return FIGURE.sub(r'<a href="\2">\1</a>', html)

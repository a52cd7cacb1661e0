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
#: A list item's marker at the start of a line: "- ", "* " or "1. ".
ITEM = re.compile(r"^(?:[-*]|\d+\.) ")


def github_lists(markdown: str) -> str:
    """Lists as GitHub reads them, for Python-Markdown: an item may follow a paragraph or an item's continuation line
    directly (a blank line goes before it), and an item's continuation (text, code blocks, sub-items) is indented
    by its marker's width (2 or 3), not 4."""
    out, width, fenced = [], 0, False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced, width = not fenced, 0
        elif not fenced and (mark := ITEM.match(line)):
            if out and out[-1].strip() and not ITEM.match(out[-1]):
                out.append("")                     # an item right after a paragraph or continuation line
            width = mark.end()
        elif not fenced and width and (not line.strip() or line.startswith(" " * width)):
            line = " " * (4 - width) + line if line.strip() else line
        elif not fenced:
            width = 0
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    """Read the pages' lists as GitHub does (they are written for it too)."""
    return github_lists(markdown)

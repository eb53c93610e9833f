"""Every relative link and image in the project's Markdown points at a file that exists.

`mkdocs build --strict` checks the site's page links and anchors, but not images, nor the Markdown outside
`docs/` (the README, the benchmarks page, the changelog) that GitHub renders.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The project's own Markdown: the top-level files, the docs site and the benchmarks page (a walk of the whole tree
# would also read the Markdown of installed packages in a virtual environment).
FOLDERS = ("docs", "benchmarks")
# [text](target) and ![alt](target), the target up to a space (a title) or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown_files() -> list[str]:
    found = [os.path.join(ROOT, n) for n in os.listdir(ROOT) if n.endswith(".md")]
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            found += [os.path.join(dirpath, n) for n in filenames if n.endswith(".md")]
    return sorted(found)


def _relative_targets(path: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code blocks that names a file of the repository."""
    out, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL (http:, mailto:) or an anchor on the same page
                out.append((number, target.split("#", 1)[0]))
    return out


def test_markdown_links_and_images_resolve():
    files = _markdown_files()
    assert any(f.endswith(os.path.join("docs", "index.md")) for f in files), "the docs were not found"
    checked, missing = 0, []
    for path in files:
        for number, target in _relative_targets(path):
            checked += 1
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
            if not os.path.exists(resolved):
                missing.append(f"{os.path.relpath(path, ROOT)}:{number}: {target}")
    assert checked > 50, f"only {checked} links found: the link pattern no longer matches the docs"
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)

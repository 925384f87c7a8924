"""Generated blocks in a markdown file: the text between a begin and an end marker, rewritten from data.

docs/benchmarks.md holds tables that are a command's output (the power table; a sweep's reading); each lives
between two HTML comments, the first naming the block and the command that writes it, so `--update-docs`
rewrites exactly it and a test can compare it with what the command gives now. A block is found by its name;
the rest of its begin line is left as written.
"""

from __future__ import annotations

from pathlib import Path


def markers(name: str, command: str) -> tuple[str, str]:
    """The begin and end lines of the block `name`, the begin one naming the command that writes it."""
    return f"<!-- {name}: begin ({command}) -->", f"<!-- {name}: end -->"


def _split(text: str, name: str) -> tuple[str, str, str] | None:
    """(everything up to and including the begin line, the block, the end line and after); None without both."""
    begin, end = f"<!-- {name}: begin", f"<!-- {name}: end -->"
    start = text.find(begin)
    if start < 0:
        return None
    line_end = text.find("-->", start)
    stop = text.find(end, line_end)
    if line_end < 0 or stop < 0:
        return None
    head_end = line_end + len("-->")
    return text[:head_end], text[head_end:stop], text[stop:]


def update(docs: str | Path, name: str, content: str, command: str) -> bool:
    """Replace the block `name` (ValueError giving the lines to add when absent); True if the file changed."""
    docs = Path(docs)
    text = docs.read_text()
    parts = _split(text, name)
    if parts is None:
        begin, end = markers(name, command)
        raise ValueError(f"{docs}: no markers for this table; add the lines\n{begin}\n{end}\nwhere it belongs")
    head, _, tail = parts
    new = f"{head}\n{content}\n{tail}"
    if new != text:
        docs.write_text(new)
    return new != text


def read(docs: str | Path, name: str) -> str:
    """The block `name` as it stands in the file (ValueError when it has none)."""
    parts = _split(Path(docs).read_text(), name)
    if parts is None:
        raise ValueError(f"{docs}: no block {name!r}")
    return parts[1].strip()

"""The documentation's references resolve inside the repository.

- every "docs/design.md invariant N" (in code and docs) and "design invariant N" (in a
  README) names an invariant docs/design.md has;
- nothing cites the design document that used to live outside the repository;
- every relative link in the repository's markdown reaches a file, and its #anchor a
  heading of that file;
- every repository path a README or a docs/ page names in backticks exists;
- every `spendbus ...` command the markdown shows exists, with the options it gives;
- every module of a folder that has a README is in that README's module map;
- every `FILE.md, "Section"` reference names a heading (or bold lead) the file has.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
#: directories that are not the project's own text (environments, build output, caches)
SKIPPED_DIRS = frozenset(
    {".git", ".venv", "build", "dist", "node_modules", "__pycache__", ".spendbus", ".hypothesis"}
)
SKIPPED_PATHS = frozenset({ROOT / "bench" / "results"})

CITATION = re.compile(
    r"(?:docs/design\.md(?:\]\([^)]*\))?,?|\bdesign)\s+invariants?\s+(\d+(?:(?:, | and | or )\d+)*)",
    re.IGNORECASE,
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]+`")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
PATH_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sql", ".avsc", ".json", ".jsonl", ".toml", ".png")


def project_files(*suffixes: str) -> Iterator[Path]:
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for entry in sorted(folder.iterdir()):
            if entry.is_dir():
                if (
                    entry.name not in SKIPPED_DIRS
                    and not entry.name.endswith(".egg-info")
                    and entry not in SKIPPED_PATHS
                ):
                    stack.append(entry)
            elif entry.suffix in suffixes:
                yield entry


def markdown_files() -> list[Path]:
    return list(project_files(".md"))


def without_code(text: str) -> str:
    """The markdown with fenced blocks blanked (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def design_invariants() -> set[int]:
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("\n## Invariants\n", 1)[1].split("\n## ", 1)[0]
    return {int(n) for n in re.findall(r"^### (\d+)\. ", section, re.MULTILINE)}


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(without_code(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_design_document_numbers_its_invariants_in_order() -> None:
    numbers = design_invariants()
    assert numbers, "docs/design.md has no '### N. ' invariant under '## Invariants'"
    assert sorted(numbers) == list(range(1, max(numbers) + 1))


def test_every_design_citation_names_an_existing_invariant() -> None:
    known = design_invariants()
    wrong = []
    cited = 0
    for path in project_files(".py", ".md"):
        if path == DESIGN or path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        for match in CITATION.finditer(text):
            for number in re.findall(r"\d+", match.group(1)):
                cited += 1
                if int(number) not in known:
                    line = text.count("\n", 0, match.start()) + 1
                    wrong.append(f"{rel(path)}:{line}: {match.group(0)!r}")
    assert cited > 10, "the citations were not found: is the pattern still the one in use?"
    assert not wrong, "citations of invariants docs/design.md does not have:\n" + "\n".join(wrong)


def test_nothing_cites_a_design_document_outside_the_repository() -> None:
    outside = "DESIGN" + ".md"  # spelt apart so this file does not match itself
    stale = [
        f"{rel(path)}:{n}"
        for path in project_files(".py", ".md", ".toml", ".yaml", ".yml", ".cfg")
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if outside in line or "../shared/" in line
    ]
    assert not stale, f"{outside} or ../shared/ cited: " + ", ".join(stale)


def test_every_relative_link_in_the_markdown_resolves() -> None:
    broken = []
    for path in markdown_files():
        text = INLINE_CODE.sub("", without_code(path.read_text(encoding="utf-8")))
        for match in LINK.finditer(text):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            line = text.count("\n", 0, match.start()) + 1
            where = f"{rel(path)}:{line}: ({target})"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif not resolved.is_relative_to(ROOT):
                broken.append(f"{where}: outside the repository")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: no heading #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def cited_paths(path: Path) -> Iterator[tuple[int, str]]:
    """(line, token) of each backticked token of a markdown file that names a file or
    folder of the repository: a module name (``counting.py``), or a path whose first
    segment is a top-level entry of the repository or an entry beside the markdown file.
    What benchmarks write (``bench/results/``) is not kept, so not checked."""
    text = without_code(path.read_text(encoding="utf-8"))
    for match in INLINE_CODE.finditer(text):
        token = match.group(0)[1:-1]
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*/?", token):
            continue
        if "/" not in token:
            if not re.fullmatch(r"\w+\.py", token):
                continue  # a bare name is a path only as a module
        elif token.startswith("bench/results"):
            continue
        elif not (
            (ROOT / token.split("/", 1)[0]).exists()
            or (path.parent / token.split("/", 1)[0]).exists()
        ):
            continue  # text/event-stream, input/output...
        elif not (token.endswith("/") or token.endswith(PATH_SUFFIXES) or "." not in token):
            continue
        yield text.count("\n", 0, match.start()) + 1, token


def test_every_path_the_readmes_and_docs_name_exists() -> None:
    """A path resolves from the repository's root or the page's folder; a module name
    (test and module file names are unique enough to find) anywhere in the tree."""
    pages = [p for p in markdown_files() if p.name == "README.md" or p.parent == ROOT / "docs"]
    pages += [ROOT / "CONTRIBUTING.md"]
    modules = {p.name for p in project_files(".py")}
    missing = []
    checked = 0
    for page in pages:
        for line, token in cited_paths(page):
            checked += 1
            found = (ROOT / token).exists() or (page.parent / token).exists()
            if not found and "/" not in token:
                found = token in modules
            if not found:
                missing.append(f"{rel(page)}:{line}: `{token}`")
    assert checked > 100, "no paths were found: is the pattern still the one in use?"
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def command_mentions(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line, words) of each `spendbus <command> ...` a markdown file shows, in backticks
    or in a code block (what follows a `#` on a code line is a comment)."""
    text = path.read_text(encoding="utf-8")
    spans = [(m.start(), m.group(0)[1:-1]) for m in INLINE_CODE.finditer(without_code(text))]
    for block in FENCE.finditer(text):
        offset = block.start()
        for line in block.group(0).splitlines():
            spans.append((offset, line.split("#", 1)[0]))
            offset += len(line) + 1
    for start, span in spans:
        for match in re.finditer(r"(?:^|[\s(`|&;])(?:\.venv/bin/)?spendbus +([^`|;&)]*)", span):
            if words := match.group(1).split():
                yield text.count("\n", 0, start) + 1, words


def test_every_command_the_docs_show_exists_with_its_options() -> None:
    """`spendbus budgets raise ... --until 2d` in a README runs: each subcommand exists and
    each --option is one of its command's (click's own resolution; nothing is run)."""
    import click

    from spendbus.cli import cli

    wrong = []
    checked = 0
    for page in markdown_files():
        for line, words in command_mentions(page):
            command: click.Command = cli
            path = ["spendbus"]
            rest = list(words)
            while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
                sub = command.get_command(click.Context(command), rest[0])
                if sub is None:
                    break
                command, path = sub, [*path, rest.pop(0)]
            where = f"{rel(page)}:{line}: `{' '.join(path)}"
            if isinstance(command, click.Group) and rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
                # a lower-case word is a subcommand; `ingest FILE.jsonl` is an argument
                wrong.append(f"{where} {rest[0]}`: no such command")
                continue
            if len(path) == 1:
                continue
            checked += 1
            known = {"--help", "-h"}
            for param in command.params:
                known |= set(getattr(param, "opts", [])) | set(getattr(param, "secondary_opts", []))
            for word in rest:
                option = word.split("=", 1)[0]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", option) and option not in known:
                    wrong.append(f"{where}` has no {option}")
    assert checked > 30, "no commands were found: is the pattern still the one in use?"
    assert not wrong, "commands the docs show that the CLI lacks:\n" + "\n".join(sorted(set(wrong)))


def test_every_module_is_in_its_folders_readme() -> None:
    """A folder with a README maps its modules: each one's file name is in it (a module
    added, moved or split updates the map in the same commit)."""
    unmapped = []
    for readme in markdown_files():
        if readme.name != "README.md" or readme.parent == ROOT:
            continue
        text = readme.read_text(encoding="utf-8")
        for module in sorted(readme.parent.glob("*.py")):
            if module.name != "__init__.py" and module.name not in text:
                unmapped.append(rel(module))
    assert not unmapped, "modules missing from their folder's README map: " + ", ".join(unmapped)


SECTION = re.compile(r"((?:[\w.-]+/)*[\w-]+\.md)`?\)?(?:,| \(|: ) ?\(?\"([^\"\n]{3,80})\"")


def heading_texts(path: Path) -> list[str]:
    """The headings of a markdown file, and the bold leads of its paragraphs (the
    history files name their steps so), as plain lower-case text."""
    text = without_code(path.read_text(encoding="utf-8"))
    found = [h for _, h in HEADING.findall(text)]
    found += [" ".join(b.split()) for b in re.findall(r"^\*\*([^*]+)\*\*", text, re.MULTILINE)]
    return [re.sub(r"[`*]", "", h).strip().lower() for h in found]


def test_every_quoted_section_of_a_document_is_one_of_its_headings() -> None:
    """`aggregator/README.md, "Several workers"` in a comment or a page names a heading that
    file has (the start of it: "Rate limits" for "Rate limits (`rate:`)")."""
    wrong = []
    checked = 0
    for path in project_files(".py", ".md"):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        for match in SECTION.finditer(text):
            name, section = match.group(1), match.group(2)
            target = next(
                (p for p in (ROOT / name, path.parent / name) if p.is_file()),
                None,
            )
            if target is None:
                continue  # not a file of the repository: the link and path tests judge it
            checked += 1
            wanted = re.sub(r"[`*]", "", section).strip().lower()
            if not any(h.startswith(wanted) for h in heading_texts(target)):
                line = text.count("\n", 0, match.start()) + 1
                wrong.append(f'{rel(path)}:{line}: {name}, "{section}"')
    assert checked > 5, "no section references were found: is the pattern still the one in use?"
    assert not wrong, "sections cited that their document does not have:\n" + "\n".join(wrong)

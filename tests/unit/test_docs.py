"""The documentation holds together: every fenced code block of README.md and docs/** is of a
kind the tests run (or visibly annotated why not), every TOML example loads through the real
config loader and builds its listeners and jobs, and the generated reference covers every
configuration key, subcommand and metric of the code.

The Python and shell examples run against real servers in
``tests/integration/test_docs_examples.py``; ``make docs-check`` builds the site strictly.

Annotations are HTML comments on the line before a block (invisible on the site, visible in
the source):

* ``<!-- docs-test: file: NAME -->``: the block is a file the reader saves (``mylisteners.py``);
  the other blocks of its page run beside it.
* ``<!-- docs-test: skip: REASON -->``: not run, for the reason given (kept rare: each is listed
  by :func:`test_skipped_blocks_say_why`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n]*$")
ANNOTATION = re.compile(r"<!-- docs-test: (?P<kind>file|skip): (?P<arg>.+?) -->")
#: What each block language is, for the tests: run (python, sh, toml), parsed (yaml, json) or
#: shown (text: output, diagrams, synopses).
KINDS = {
    "python": "python",
    "py": "python",
    "sh": "sh",
    "bash": "sh",
    "shell": "sh",
    "toml": "toml",
    "yaml": "yaml",
    "yml": "yaml",
    "json": "json",
    "text": "text",
    "console": "text",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    code: str
    #: ``("file", NAME)``, ``("skip", REASON)`` or ``None``.
    annotation: tuple[str, str] | None

    @property
    def kind(self) -> str | None:
        return KINDS.get(self.lang)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.annotation is None

    @property
    def file_name(self) -> str | None:
        return self.annotation[1] if self.annotation and self.annotation[0] == "file" else None


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(page: Path) -> list[Block]:
    """The page's fenced code blocks, in order, with their annotations."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        code = textwrap.dedent("\n".join(line[indent:] for line in lines[i + 1 : end]))
        before = lines[i - 1].strip() if i else ""
        note = ANNOTATION.fullmatch(before)
        annotation = (note.group("kind"), note.group("arg")) if note else None
        found.append(Block(page, i + 1, opening.group("lang"), code + "\n", annotation))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks_of(page)]


def page_files(page: Path) -> dict[str, str]:
    """The files a page asks the reader to save: name -> text."""
    return {b.file_name: b.code for b in blocks_of(page) if b.file_name}


def reference() -> ModuleType:
    """The MkDocs hook that generates the reference tables (docs/hooks/reference.py)."""
    path = ROOT / "docs" / "hooks" / "reference.py"
    spec = importlib.util.spec_from_file_location("docs_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_reference", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_extractor_finds_blocks_and_their_annotations(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- docs-test: file: mine.py -->\n```python\nx = 1\n```\n\n"
        "- item\n\n  ```toml\n  a = 1\n  ```\n\n````text\n```\n````\n",
        encoding="utf-8",
    )
    found = blocks_of(page)
    assert [(b.lang, b.code, b.annotation) for b in found] == [
        ("python", "x = 1\n", ("file", "mine.py")),
        ("toml", "a = 1\n", None),
        ("text", "```\n", None),
    ]


def test_every_block_is_of_a_kind_the_tests_know() -> None:
    unknown = [f"{b.where} ({b.lang or 'no language'})" for b in all_blocks() if b.kind is None]
    assert not unknown, f"give these blocks a language of {sorted(KINDS)}: {unknown}"


def test_the_docs_have_examples_of_every_kind() -> None:
    """A sanity check on the extractor: a change that found no blocks would pass the rest."""
    runnable = {b.kind for b in all_blocks() if b.runs}
    assert {"python", "sh", "toml"} <= runnable, runnable
    assert len([b for b in all_blocks() if b.runs and b.kind == "python"]) >= 6


def test_skipped_blocks_say_why() -> None:
    skipped = [b for b in all_blocks() if b.annotation and b.annotation[0] == "skip"]
    for b in skipped:
        assert len(b.annotation[1].split()) >= 4, f"{b.where}: say why it cannot run"  # type: ignore[index]
    # kept rare: every exception is a line of the report, not a habit
    assert len(skipped) <= 6, [b.where for b in skipped]


def test_file_blocks_are_python_modules_that_compile() -> None:
    for b in all_blocks():
        if b.file_name:
            assert b.file_name.endswith(".py") and b.kind == "python", b.where
            compile(b.code, b.where, "exec")


def test_python_and_shell_examples_parse() -> None:
    """The integration test runs them; here, a syntax error fails fast."""
    for b in all_blocks():
        if b.kind == "python":
            compile(b.code, b.where, "exec")
        elif b.kind == "sh":
            subprocess.run(["bash", "-n"], input=b.code, text=True, check=True)


def test_yaml_and_json_examples_parse() -> None:
    for b in all_blocks():
        if b.kind == "yaml" and b.runs:
            list(yaml.safe_load_all(b.code))
        elif b.kind == "json" and b.runs:
            json.loads(b.code)


CHECK_TOML = """
import sys
from singleton.service.assembly import build_listeners
from singleton.service.config import load_config
from singleton.service.registry import job_function

for path in sys.argv[1:]:
    config = load_config(path)
    build_listeners(config)
    for job in config.jobs:
        job_function(job.use)
    print("ok", path, len(config.listeners), len(config.jobs))
"""


def _toml_pages() -> list[Path]:
    return [p for p in pages() if any(b.kind == "toml" and b.runs for b in blocks_of(p))]


@pytest.mark.parametrize("page", _toml_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_toml_examples_load_and_build(page: Path, tmp_path: Path) -> None:
    """Every TOML example of the page through ``load_config`` (every key checked), its
    listeners built (their options checked by the classes) and its jobs' functions imported,
    beside the files the page asks the reader to save."""
    for name, text in page_files(page).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    paths = []
    for n, b in enumerate(b for b in blocks_of(page) if b.kind == "toml" and b.runs):
        path = tmp_path / f"example-{n}-line-{b.line}.toml"
        path.write_text(b.code, encoding="utf-8")
        paths.append(str(path))
    done = subprocess.run(
        [sys.executable, "-c", CHECK_TOML, *paths],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{page.relative_to(ROOT)}: {done.stderr[-3000:]}"
    assert done.stdout.count("ok ") == len(paths), done.stdout


def test_a_broken_toml_example_would_fail(tmp_path: Path) -> None:
    """The check above can fail: an unknown key is refused by the same script."""
    path = tmp_path / "bad.toml"
    path.write_text("[lease]\nttll = 5\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", CHECK_TOML, str(path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "did you mean 'ttl'" in done.stderr, done.stderr[-500:]


def test_every_config_key_has_a_description() -> None:
    ref = reference()
    keys = ref.config_keys()
    missing = [f"{k.section}.{k.key}" for k in keys if not k.meaning]
    assert not missing, f"describe them in docs/hooks/config_descriptions.py: {missing}"
    assert not ref.stale_descriptions(keys), "describes keys the config no longer has"


def test_the_config_reference_lists_the_real_keys() -> None:
    """Against the loader itself: every top-level and [lease] key it accepts, and every
    [[jobs]] key, is listed; and a key the loader refuses is not."""
    from singleton.service.config import _LEASE_TYPES, _TOP_TYPES, tables

    ref = reference()
    listed = {(k.section, k.key) for k in ref.config_keys()}
    assert {("top", key) for key in _TOP_TYPES} <= listed
    assert {("lease", key) for key in _LEASE_TYPES} <= listed
    assert {("jobs", key) for key in tables._JOB_KEYS} <= listed
    assert {("listeners", key) for key in ("use", *tables.PLACEMENT_KEYS)} <= listed
    assert ("options", "batch_size") in listed and ("elasticsearch", "index") in listed
    shape = importlib.import_module("listeners.elasticsearch.shape.collections")
    assert {("collections", key) for key in shape.COLLECTION_KEYS} <= listed
    markdown = ref.config_markdown()
    assert "`ttl`<br>`SINGLETON_LEASE__TTL`" in markdown and "| `drain_timeout`<br>" in markdown


def test_the_cli_reference_lists_every_subcommand_and_flag() -> None:
    import argparse

    from singleton.service.cli import build_parser

    markdown = reference().cli_markdown()
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                assert f"### `singleton {name}`" in markdown, name
                for flag in (s for a in sub._actions for s in a.option_strings):
                    if flag not in ("-h", "--help"):
                        shown = re.search(rf"[`, ]{re.escape(flag)}[ ,`]", markdown)
                        assert shown, (name, flag)
    assert "`--unsafe-disable-fencing`" in markdown  # the drill's own parser


def test_the_metrics_reference_lists_what_a_replica_serves() -> None:
    """Every family name in metrics.py's source is in the generated list, as served."""
    served = {name for name, *_ in reference().metric_families()}
    source = (ROOT / "singleton" / "service" / "metrics.py").read_text(encoding="utf-8")
    declared = set(re.findall(r'"(singleton_[a-z_]+)"', source))
    as_served = {n.removesuffix("_total") for n in served}
    assert declared <= as_served, sorted(declared - as_served)
    assert "singleton_dead_letters_total" in served and "singleton_members" in served


def test_the_readme_and_getting_started_show_one_recipe() -> None:
    """The quick start's dev-servers block (which test_newcomer.py runs) is the same on both."""

    def recipe(page: Path) -> str:
        return next(b.code for b in blocks_of(page) if "dev-servers --write-config" in b.code)

    assert recipe(ROOT / "README.md") == recipe(ROOT / "docs" / "getting-started.md")


def test_the_readme_is_a_quick_start_that_links_the_docs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120, "the reference belongs on the docs site"
    assert "make demo" in text and "make test" in text and "make docs" in text
    assert ".venv/bin/singleton" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), link


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    return subprocess.run(
        [str(mkdocs), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)},
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``make docs-check``'s build: a broken link, anchor or API reference, or a config key
    without a description, is a warning, and a warning fails it."""
    done = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "SINGLETON_LEASE__TTL" in config and "<!-- generated" not in config


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    for package in ("singleton", "listeners"):
        (copy / package).symlink_to(ROOT / package)
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(copy / "docs")], check=True)
    page = copy / "docs" / "concepts" / "lease.md"
    page.write_text(page.read_text() + "\nSee [the lost page](no-such-page.md).\n")
    done = _mkdocs(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stderr, done.stderr[-2000:]

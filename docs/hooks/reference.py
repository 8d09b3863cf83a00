"""MkDocs hook: the reference pages' tables, generated from the code at build time.

A page writes ``<!-- generated: config -->``, ``<!-- generated: cli -->`` or
``<!-- generated: metrics -->`` and gets, in its place:

* every ``singleton.toml`` key with its type, default, environment variable and meaning, read
  from the config dataclasses (``singleton.service.config``), the ``[[listeners]]`` placement
  keys and listener options (``singleton.service.config.tables``, ``ChangeStreamListener``,
  ``ElasticsearchSync``) and the ``[[jobs]]`` key table; a meaning comes from
  ``config_descriptions.py`` beside this file, else from the ``#:`` comment above the attribute;
* every ``singleton`` subcommand and flag, walked from the argparse parsers;
* every metric family a replica's collector yields, with its type, labels and help.

A key without a meaning, or a meaning for a key that no longer exists, is a build warning
(``mkdocs build --strict`` fails on it), and ``tests/unit/test_docs.py`` checks the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from config_descriptions import DESCRIPTIONS  # noqa: E402

log = logging.getLogger("mkdocs.hooks.reference")
MARKER = re.compile(r"<!-- generated: (\w+) -->")


@dataclass(frozen=True)
class Key:
    """One configuration key as the reference shows it."""

    section: str
    key: str
    type: str
    default: str
    env: str
    meaning: str


def attribute_comments(cls: type) -> dict[str, str]:
    """``name -> text`` of the ``#:`` comment lines right above each attribute of ``cls`` and
    of its bases (a subclass's comment wins)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        pending: list[str] = []
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith("#:"):
                pending.append(stripped[2:].strip())
                continue
            match = re.match(r"\s{4}(\w+)\s*[:=]", line)
            if match and pending:
                found[match.group(1)] = " ".join(pending)
            pending = []
    return found


def _toml(value: Any) -> str:
    """A default as one writes it in TOML (``None``: unset)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (tuple, list, frozenset)):
        return "`[]`" if not value else f"`{list(value)!r}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:.1f}`"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MB)"
    return f"`{value!r}`"


def _type(annotation: Any) -> str:
    """A Python annotation as a reader of TOML reads it (``str | None`` -> ``str`` or unset)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text.replace("Sequence[Mapping[str, Any]]", "array of tables")
    text = text.replace("Mapping[str, Any]", "table").replace("tuple[str, ...]", "list[str]")
    text = text.replace("HistoryLostPolicy", "str").replace("PoisonPolicy", "str")
    parts = [p.strip() for p in text.split("|") if p.strip()]
    shown = " or ".join(f"`{p}`" for p in parts if p != "None")
    return shown + (" or unset" if "None" in parts else "")


def _annotations(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        out.update(getattr(klass, "__annotations__", {}))
    return out


def _markdown(rst: str) -> str:
    """A ``#:`` comment's reST as Markdown: ````x```` -> ```x```, ``:class:`~a.B``` -> ```B```."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", rst)
    return text.replace("``", "`")


def _meaning(section: str, key: str, comments: dict[str, str]) -> str:
    return DESCRIPTIONS.get(section, {}).get(key) or _markdown(comments.get(key, ""))


def _top_keys() -> Iterator[Key]:
    from singleton.service.config import Config, LeaseConfig

    comments = attribute_comments(Config)
    for f in dataclasses.fields(Config):
        if f.name in ("lease", "listeners", "jobs"):
            continue
        env = f"`SINGLETON_{f.name.upper()}`"
        meaning = _meaning("top", f.name, comments)
        yield Key("top", f.name, _type(f.type), _toml(f.default), env, meaning)
    comments = attribute_comments(LeaseConfig)
    for f in dataclasses.fields(LeaseConfig):
        env = f"`SINGLETON_LEASE__{f.name.upper()}`"
        meaning = _meaning("lease", f.name, comments)
        yield Key("lease", f.name, _type(f.type), _toml(f.default), env, meaning)


def _placement_keys() -> Iterator[Key]:
    from singleton.service.config import tables

    keys = ["use", *tables.PLACEMENT_KEYS]
    # a field the service reads from the table besides the listener's own options
    keys += [
        f.name
        for f in dataclasses.fields(tables.ListenerConfig)
        if f.name not in keys and f.name != "options"
    ]
    defaults = {f.name: f.default for f in dataclasses.fields(tables.ListenerConfig)}
    hints = {f.name: f.type for f in dataclasses.fields(tables.ListenerConfig)}
    comments = attribute_comments(tables.ListenerConfig)
    for key in keys:
        default = defaults.get(key, dataclasses.MISSING)
        shown = "required" if default is dataclasses.MISSING else _toml(default)
        meaning = _meaning("listeners", key, comments)
        yield Key("listeners", key, _type(hints.get(key, "")), shown, "", meaning)


def _listener_keys(section: str, cls: type, keys: list[str], filled: dict[str, str]) -> list[Key]:
    comments = attribute_comments(cls)
    hints = _annotations(cls)
    rows = []
    for key in keys:
        default = _toml(getattr(cls, key, None))
        if key in filled:
            default = f"the service's `{filled[key]}`"
        meaning = _meaning(section, key, comments)
        rows.append(Key(section, key, _type(hints.get(key, "")), default, "", meaning))
    return rows


def _declared_order(cls: type, names: frozenset[str]) -> list[str]:
    order = [k for k in _annotations(cls) if k in names]
    return order + sorted(names - set(order))


def _option_keys() -> Iterator[Key]:
    from listeners.base import ChangeStreamListener
    from singleton.service.registry import LISTENERS

    base = ChangeStreamListener._base_options
    yield from _listener_keys(
        "options", ChangeStreamListener, _declared_order(ChangeStreamListener, base), {}
    )
    kind = LISTENERS["elasticsearch"]
    cls = kind.cls
    extra = cls.extra_options | {k for k in base if k in vars(cls)}
    yield from _listener_keys(
        "elasticsearch", cls, _declared_order(cls, frozenset(extra)), dict(kind.service_options)
    )


def _docstring_table(doc: str, keys: tuple[str, ...]) -> dict[str, str]:
    """``key -> meaning`` from a docstring's literal block of ``key   meaning`` lines (a
    meaning may go on, more indented, on the next lines)."""
    found: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        match = re.match(r"    (\w+)\s{2,}(\S.*)$", line)
        if match and match.group(1) in keys:
            current = match.group(1)
            found[current] = match.group(2).strip()
        elif current and re.match(r"\s{8,}\S", line):
            found[current] += " " + line.strip()
        else:
            current = None
    return found


def _collection_keys() -> Iterator[Key]:
    """The keys of a ``[listeners.collections.<name>]`` table (a shaped index), when the
    listener has them: their meanings are the table in the module's docstring."""
    try:
        from listeners.elasticsearch.shape import collections as shape
    except ImportError:
        return
    keys = tuple(getattr(shape, "COLLECTION_KEYS", ()))
    table = _docstring_table(shape.__doc__ or "", keys)
    for key in keys:
        meaning = DESCRIPTIONS.get("collections", {}).get(key) or _markdown(table.get(key, ""))
        yield Key("collections", key, "", "", "", meaning)


def _job_keys() -> Iterator[Key]:
    from singleton.service.config import tables

    defaults = {f.name: f.default for f in dataclasses.fields(tables.JobConfig)}
    comments = attribute_comments(tables.JobConfig)
    for key, (_, rule) in tables._JOB_KEYS.items():
        default = defaults.get(key, dataclasses.MISSING)
        shown = "required" if default is dataclasses.MISSING else _toml(default)
        meaning = _meaning("jobs", key, comments)
        yield Key("jobs", key, rule, shown, "", meaning)


def config_keys() -> list[Key]:
    """Every key of ``singleton.toml``, as the reference lists it."""
    return [*_top_keys(), *_placement_keys(), *_option_keys(), *_collection_keys(), *_job_keys()]


SECTIONS = {
    "top": ("Top level", "Top-level keys; flags `--redis-url`... override them."),
    "lease": ("`[lease]`", "The lease timings, shared by every listener and job of a replica."),
    "listeners": (
        "`[[listeners]]`: the service's keys",
        "Taken by the service, never passed to the listener.",
    ),
    "options": (
        "`[[listeners]]`: every listener's options",
        "Every other key of the table reaches the listener class as a keyword argument;"
        " these are `ChangeStreamListener`'s own.",
    ),
    "elasticsearch": (
        '`[[listeners]]` with `use = "elasticsearch"`',
        "`ElasticsearchSync`'s options besides the ones above (and its own defaults for"
        " them). A key marked *the service's* is filled from the top-level key when the"
        " table does not set it.",
    ),
    "collections": (
        "`[listeners.collections.<name>]`",
        "One table per collection of a shaped `elasticsearch` listener (see"
        " [a shaped index](../how-to/shaped-index.md)); every key is optional.",
    ),
    "jobs": ("`[[jobs]]`", "A leader-only scheduled job; unknown keys are refused."),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_markdown() -> str:
    keys = config_keys()
    out: list[str] = []
    for section, (title, intro) in SECTIONS.items():
        rows = [k for k in keys if k.section == section]
        out += [f"### {title}", "", intro, ""]
        head = ["key", "type", "default", "meaning"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in rows:
            missing = not k.meaning
            if missing:
                log.warning(
                    "config key %s.%s has no description: add it to %s",
                    section,
                    k.key,
                    HERE / "config_descriptions.py",
                )
            key = f"`{k.key}`" + (f"<br>{k.env}" if k.env else "")
            cells = [key, k.type, k.default, k.meaning]
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        out.append("")
    stale = stale_descriptions(keys)
    for name in stale:
        log.warning("config_descriptions.py describes %s, which is no key of the config", name)
    return "\n".join(out)


def stale_descriptions(keys: list[Key]) -> list[str]:
    """Descriptions of keys that the code no longer has."""
    real = {(k.section, k.key) for k in keys}
    return [f"{s}.{k}" for s, table in DESCRIPTIONS.items() for k in table if (s, k) not in real]


# --- the CLI ---------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag_rows(parser: argparse.ArgumentParser, config_flags: dict[str, str]) -> list[str]:
    """A table of ``parser``'s arguments; a flag that sets a config key (``config_flags``: dest
    -> key) says which, and says what the key means when its help does not."""
    meanings = {
        (f"{k.section}.{k.key}" if k.section == "lease" else k.key): k.meaning
        for k in config_keys()
        if k.section in ("top", "lease")
    }
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + str(action.metavar or action.dest.upper())
        else:
            name = str(action.metavar or action.dest)
            if action.choices:
                name = "{" + ",".join(map(str, action.choices)) + "}"
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) else f"`{default}`"
        if action.required:
            shown = "required"
        meaning = action.help or ""
        key = config_flags.get(action.dest) if action.option_strings else None
        if key is not None:
            meaning = meaning or meanings.get(key, "")
            meaning += f" (sets [`{key}`](config.md))"
        if action.choices and action.option_strings:
            meaning += f" (one of {', '.join(f'`{c}`' for c in action.choices)})"
        rows.append(f"| `{_cell(name)}` | {_cell(shown)} | {_cell(meaning)} |")
    return rows


def cli_markdown() -> str:
    from singleton.service import cli
    from singleton.service.drill import cli as drill_cli

    parser = cli.build_parser()
    commands = _subcommands(parser)
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
    out: list[str] = []
    for name, sub in commands.items():
        if name == "drill":
            sub = drill_cli.build_parser()
        out += [f"### `singleton {name}`", "", (helps.get(name) or "").capitalize() + ".", ""]
        usage = sub.format_usage().strip().removeprefix("usage: ")
        out += ["```text", usage, "```", ""]
        if sub.epilog:
            out += [sub.epilog, ""]
        flags = {} if name in ("drill", "demo") else dict(cli.FLAG_KEYS)
        if name == "dead-letters":
            flags = {k: v for k, v in flags.items() if k in ("mongo_url", "namespace")}
        out += [*_flag_rows(sub, flags), ""]
    return "\n".join(out)


# --- metrics -----------------------------------------------------------------------------------


def metric_families() -> list[tuple[str, str, str, list[str]]]:
    """``(name as served, type, help, labels)`` of every family a replica's collector yields
    (a replica hosting nothing yields every family, without samples)."""
    from singleton.service.metrics import ReplicaCollector

    view = SimpleNamespace(held=(), stale=True, members={}, share=0)
    replica = SimpleNamespace(
        hosted=[], jobs=None, balancer=SimpleNamespace(view=lambda: view), problems=list
    )
    served = []
    for family in ReplicaCollector(replica).collect():  # type: ignore[arg-type]
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = list(getattr(family, "_labelnames", ()))
        served.append((name, family.type, family.documentation, labels))
    return served


def metrics_markdown() -> str:
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for name, kind, doc, labels in metric_families():
        shown = ", ".join(f"`{label}`" for label in labels)
        suffix = " (`_bucket`, `_sum`, `_count`)" if kind == "histogram" else ""
        rows.append(f"| `{name}` | {kind}{suffix} | {shown} | {_cell(doc)} |")
    return "\n".join(rows) + "\n"


#: reST roles left in docstrings, as mkdocstrings renders them: ``:class:<code>~a.B</code>``.
ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Show ``:class:`~a.b.C``` as ``C`` and ``:mod:`a.b``` as ``a.b``, as Sphinx would."""
    return ROLE.sub(
        lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>",
        html,
    )


GENERATORS = {"config": config_markdown, "cli": cli_markdown, "metrics": metrics_markdown}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            log.warning("unknown generated section %r (known: %s)", name, ", ".join(GENERATORS))
            return match.group(0)
        return GENERATORS[name]()

    return MARKER.sub(fill, markdown)

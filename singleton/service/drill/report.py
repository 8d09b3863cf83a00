"""``--report FILE``: one self-contained HTML page (inline SVG, no scripts, no external files).

Rows are replicas. A thick bar is a period in which the lease store named that replica as holder,
coloured by fencing token (same token, same colour); the thin line under it is the tenure as the
replica itself saw it (audit ``elected`` .. ``lost``). Faults are dashed markers across the rows
(a tinted band on the victim's row while a pause or a cut lasts); takeover gaps are shaded red;
the write rate (operations per second) is drawn underneath, with the rate of change events
indexed (acknowledged batches) as a line over it. The bars are the lease faults aim at (the first
listener's first partition); with several listeners or partitions, a table gives each listener's
verification and another the time each fault took to leave the leases balanced again.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_WIDTH, PX_PER_SECOND, LEFT, RIGHT, TOP = 1240, 7, 120, 30, 62
ROW, ROW_GAP, RATE_H = 26, 14, 70
SHORT = {
    "kill": "KILL",
    "stop": "STOP",
    "term": "TERM",
    "rotate": "ROT",
    "net-cut": "CUT",
    "redis-restart": "R-RST",
    "redis-pause": "R-PAUSE",
    "clock-jump": "CLOCK",
    "lease-wipe": "WIPE",
    "checkpoint-loss": "CP-LOSS",
    "listener-error": "L-ERR",
}


def _colour(i: int) -> str:
    return f"hsl({(i * 137.508) % 360:.0f},62%,48%)"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


class _Scale:
    def __init__(self, t0: float, end: float) -> None:
        self.t0, self.span = t0, max(1e-3, end - t0)
        # long runs get a wider (scrolling) page rather than overlapping fault labels
        self.width = max(MIN_WIDTH, int(LEFT + RIGHT + PX_PER_SECOND * self.span))

    def x(self, mono: float) -> float:
        return (
            LEFT
            + (self.width - LEFT - RIGHT) * min(max(mono - self.t0, 0.0), self.span) / self.span
        )


def _lease_bars(h: dict[str, Any], end: float) -> list[tuple[str | None, int | None, float, float]]:
    samples = h["leases"]
    out = []
    for i, (at, ident, token) in enumerate(samples):
        until = samples[i + 1][0] if i + 1 < len(samples) else end
        out.append((ident, token, at, until))
    return out


def _tenures(h: dict[str, Any], end: float) -> list[tuple[str, int, float, float]]:
    """(identity, token, from, to) from the audit: elected .. lost, or the kill of the process,
    or the end. (A tenure elected past its deadline on a starved machine may log its loss in the
    same instant as its election, in either order.)"""
    elected: dict[int, tuple[str, float]] = {}
    lost: dict[int, float] = {}
    for r in h["audit"]:
        if r.get("kind") == "elected":
            elected.setdefault(r["token"], (r.get("identity", "?"), r["mono"]))
        elif r.get("kind") == "lost":
            lost[r["token"]] = max(lost.get(r["token"], r["mono"]), r["mono"])
    # a process that died without logging its loss: SIGKILL, or a SIGTERM that had to be forced
    kills = sorted(
        (f["at"] if f["kind"] == "kill" else f["end"], f["victim"])
        for f in h["faults"]
        if f["kind"] in ("kill", "term")
    )
    out = []
    for token, (ident, start) in elected.items():
        stop = lost.get(token)
        if stop is None:
            stop = next((at for at, who in kills if who == ident and at > start), end)
        out.append((ident, token, start, max(start, stop)))
    return out


@dataclass(frozen=True)
class _Layout:
    """Where things go: the time scale, the top of each replica's row, the rate panel."""

    sc: _Scale
    rows: dict[str, int]
    rate_top: int
    height: int

    @classmethod
    def of(cls, h: dict[str, Any]) -> _Layout:
        idents: Sequence[str] = h["identities"]
        rows = {ident: TOP + i * (ROW + ROW_GAP) for i, ident in enumerate(idents)}
        rate_top = TOP + len(idents) * (ROW + ROW_GAP) + 20
        return cls(_Scale(h["t0"], h["end"]), rows, rate_top, rate_top + RATE_H + 40)


def _token_colours(h: dict[str, Any]) -> dict[int, int]:
    """Fencing token -> colour index, in order of first appearance (samples, then the audit)."""
    tokens: dict[int, int] = {}
    for _, _, token in h["leases"]:
        if token is not None and token not in tokens:
            tokens[token] = len(tokens)
    for r in h["audit"]:
        if r.get("kind") == "elected" and r["token"] not in tokens:
            tokens[r["token"]] = len(tokens)
    return tokens


def _time_axis(lay: _Layout) -> list[str]:
    sc = lay.sc
    parts = []
    ticks = max(16, (sc.width - LEFT - RIGHT) // 80)
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 3600) if sc.span / s <= ticks)
    for k in range(int(sc.span // step) + 1):
        x = sc.x(sc.t0 + k * step)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP - 8}" x2="{x:.1f}" y2="{lay.rate_top + RATE_H}" '
            'stroke="#eee"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{lay.height - 18}" text-anchor="middle" fill="#555">'
            f"{k * step}s</text>"
        )
    return parts


def _takeover_gaps(h: dict[str, Any], lay: _Layout) -> list[str]:
    parts = []
    for g in h["gaps"]:
        if g.get("takeover"):
            x1, x2 = lay.sc.x(g["start"]), lay.sc.x(g["end"])
            parts.append(
                f'<rect x="{x1:.1f}" y="{TOP - 8}" width="{max(1.5, x2 - x1):.1f}" '
                f'height="{lay.rate_top - TOP}" fill="#e53935" fill-opacity="0.18">'
                f"<title>gap {g['gap']:.3f}s after {_esc(g['kind'])}</title></rect>"
            )
    return parts


def _row_labels(lay: _Layout) -> list[str]:
    parts = []
    for ident, y in lay.rows.items():
        parts.append(
            f'<text x="{LEFT - 10}" y="{y + ROW / 2 + 4}" text-anchor="end" '
            f'font-size="12">{_esc(ident)}</text>'
        )
        parts.append(
            f'<line x1="{LEFT}" y1="{y + ROW + 2}" x2="{lay.sc.width - RIGHT}" '
            f'y2="{y + ROW + 2}" stroke="#ddd"/>'
        )
    return parts


def _fault_bands(h: dict[str, Any], lay: _Layout) -> list[str]:
    """A tinted band on the victim's row while a pause or a cut lasts."""
    parts = []
    for f in h["faults"]:
        if f["victim"] in lay.rows and f["end"] - f["at"] > 0.2:
            y = lay.rows[f["victim"]]
            x1, x2 = lay.sc.x(f["at"]), lay.sc.x(f["end"])
            parts.append(
                f'<rect x="{x1:.1f}" y="{y - 3}" width="{x2 - x1:.1f}" '
                f'height="{ROW + 6}" fill="#ffb300" fill-opacity="0.25"/>'
            )
    return parts


def _holder_bars(h: dict[str, Any], lay: _Layout, tokens: dict[int, int]) -> list[str]:
    """The lease store's holder over time; grey across every row while the store did not
    answer (holder ``"?"``)."""
    sc = lay.sc
    t0 = sc.t0
    parts = []
    for holder, token, a, b in _lease_bars(h, h["end"]):
        if holder == "?":
            for y in lay.rows.values():
                parts.append(
                    f'<rect x="{sc.x(a):.1f}" y="{y}" width="{sc.x(b) - sc.x(a):.1f}" '
                    f'height="{ROW - 8}" fill="#bbb" fill-opacity="0.5">'
                    "<title>lease store not answering</title></rect>"
                )
            continue
        if holder is None or holder not in lay.rows or token is None:
            continue
        x1, x2, y = sc.x(a), sc.x(b), lay.rows[holder]
        i = tokens[token]
        parts.append(
            f'<rect x="{x1:.1f}" y="{y}" width="{max(1.0, x2 - x1):.1f}" height="{ROW - 8}" '
            f'fill="{_colour(i)}"><title>{_esc(holder)} holds the lease, token {token} '
            f"({a - t0:.2f}s - {b - t0:.2f}s)</title></rect>"
        )
        if x2 - x1 > 26:
            parts.append(f'<text x="{x1 + 3:.1f}" y="{y + ROW - 12}" fill="#fff">#{i}</text>')
    return parts


def _tenure_lines(h: dict[str, Any], lay: _Layout, tokens: dict[int, int]) -> list[str]:
    sc = lay.sc
    parts = []
    for ident, token, a, b in _tenures(h, h["end"]):
        if ident in lay.rows:
            y = lay.rows[ident] + ROW - 4
            parts.append(
                f'<rect x="{sc.x(a):.1f}" y="{y}" width="{max(1.0, sc.x(b) - sc.x(a)):.1f}" '
                f'height="4" fill="{_colour(tokens.get(token, 0))}" fill-opacity="0.6">'
                f"<title>{_esc(ident)} acts as leader, token {token}</title></rect>"
            )
    return parts


def _fault_markers(h: dict[str, Any], lay: _Layout) -> list[str]:
    parts = []
    level_end = [-1e9] * 4  # greedy: a label goes on the first level where it does not overlap
    for f in h["faults"]:
        x = lay.sc.x(f["at"])
        label = SHORT.get(f["kind"], f["kind"])
        half = 3.5 * len(label) + 3
        level = next((i for i, e in enumerate(level_end) if e < x - half), len(level_end) - 1)
        level_end[level] = x + half
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP - 14}" x2="{x:.1f}" y2="{lay.rate_top - 6}" '
            'stroke="#333" stroke-dasharray="3,3"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{TOP - 18 - 10 * level}" text-anchor="middle" '
            f'font-size="10" font-weight="bold" fill="#333">{label}<title>{_esc(f["kind"])} on '
            f"{_esc(f['victim'])} (token {f['token']}) at {f['at'] - lay.sc.t0:.2f}s</title></text>"
        )
    return parts


def _per_second(h: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Writes, and change events indexed (acknowledged batches), in each second of the run."""
    t0 = h["t0"]
    seconds = max(1, math.ceil(h["end"] - t0))
    writes = [0] * seconds
    for at in h["writes"]:
        k = int(at - t0)
        if 0 <= k < seconds:
            writes[k] += 1
    indexed = [0] * seconds
    for r in h["audit"]:
        k = int(r["mono"] - t0)
        if r.get("kind") == "batch" and 0 <= k < seconds:
            indexed[k] += int(r.get("n", 0))
    return writes, indexed


def _rates(h: dict[str, Any], lay: _Layout) -> list[str]:
    sc = lay.sc
    t0 = sc.t0
    rate_top = lay.rate_top
    counts, indexed = _per_second(h)
    peak = max(counts) or 1
    top = min(max(peak, *indexed), 3 * peak)  # catch-up bursts are clipped
    parts = [
        f'<text x="{LEFT - 10}" y="{rate_top + RATE_H / 2}" text-anchor="end" '
        'font-size="12">writes/s</text>',
        f'<text x="{LEFT - 10}" y="{rate_top + 10}" text-anchor="end" fill="#777">{top}</text>',
    ]
    for k, n in enumerate(counts):
        x1, x2 = sc.x(t0 + k), sc.x(t0 + k + 1)
        bh = RATE_H * n / top
        parts.append(
            f'<rect x="{x1:.1f}" y="{rate_top + RATE_H - bh:.1f}" '
            f'width="{max(0.5, x2 - x1 - 0.5):.1f}" height="{bh:.1f}" fill="#78909c"/>'
        )
    points = " ".join(
        f"{sc.x(t0 + k + 0.5):.1f},{rate_top + RATE_H - RATE_H * min(n, top) / top:.1f}"
        for k, n in enumerate(indexed)
    )
    parts.append(
        f'<polyline points="{points}" fill="none" stroke="#ef6c00" stroke-width="1.5">'
        "<title>change events indexed per second</title></polyline>"
    )
    return parts


def _svg(h: dict[str, Any]) -> str:
    """The timeline, drawn back to front."""
    lay = _Layout.of(h)
    tokens = _token_colours(h)
    width = lay.sc.width
    height = lay.height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        *_time_axis(lay),
        *_takeover_gaps(h, lay),
        *_row_labels(lay),
        *_fault_bands(h, lay),
        *_holder_bars(h, lay, tokens),
        *_tenure_lines(h, lay, tokens),
        *_fault_markers(h, lay),
        *_rates(h, lay),
        "</svg>",
    ]
    return "\n".join(parts)


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _gap_rows(r: dict[str, Any]) -> str:
    return "".join(
        f"<tr><td>{_esc(k)}</td><td>{g['count']}</td><td>{g['takeovers']}</td>"
        f"<td>{_sec(g['p50'])}</td><td>{_sec(g['p99'])}</td><td>{_sec(g['max'])}</td></tr>"
        for k, g in r["gaps"].items()
    )


def _bold_if(n: int) -> str:
    return f"<b>{n}</b>" if n else "0"


def _equal_rows(r: dict[str, Any]) -> str:
    by_kind = (r.get("equal") or {}).get("by_kind", {})
    return "".join(
        f"<tr><td>{_esc(k)}</td><td>{e['count']}</td>"
        f"<td>{_bold_if(e['unequal'])}</td>"
        f"<td>{_sec(e['p50'])}</td><td>{_sec(e['p99'])}</td><td>{_sec(e['max'])}</td></tr>"
        for k, e in by_kind.items()
        if e["count"]
    )


def _balance_rows(bal: dict[str, Any]) -> str:
    return "".join(
        f"<tr><td>{b['index'] + 1}</td><td>{_esc(b['kind'])}</td><td>{_sec(b['seconds'])}</td>"
        f"<td>{'yes' if b['ok'] else '<b>NO</b>'}</td>"
        f"<td>{_esc(', '.join(f'{k} {n}' for k, n in b['held'].items()))}</td></tr>"
        for b in bal["by_fault"]
    )


def _listener_rows(r: dict[str, Any]) -> str:
    return "".join(
        f"<tr><td>{_esc(li['index'])}</td><td>{_esc(', '.join(li['leases']))}</td>"
        f"<td>{li['es']}</td><td>{li['missing']}</td><td>{li['stale']}</td>"
        f"<td>{li['resurrected']}</td><td>{li['extra']}</td></tr>"
        for li in r.get("by_listener", [])
    )


def _summary(r: dict[str, Any]) -> str:
    """The paragraph of counts under the verdict."""
    return f"""<p>{r["faults"]} faults, {r["backend"]} leases, {r["replicas"]} replicas,
{r.get("listeners", 1)} listener(s) x {r.get("partitions", 1)} partition(s), seed {r["seed"]},
{r["duration"]:.0f} s, fencing {"on" if r["fencing"] else "<b>OFF</b>"};
{r["writes"]["ops"]} writes ({r["writes"]["transactions"]} transactions).
Documents: MongoDB {r["documents"]["mongo"]}, Elasticsearch {r["documents"]["es"]};
missing {r["missing"]}, stale {r["stale"]}, resurrected {r["resurrected"]}, extra {r["extra"]};
checkpoint regressions {r["checkpoint_regressions"]}; fencing violations
{r["fencing_violations"]}; planned handovers left to expire {r.get("planned_expired", 0)}.
Writer-to-index lag p50 {_sec(r["lag"]["p50"])}, p99 {_sec(r["lag"]["p99"])}; the stand-in's
raw change stream (pymongo alone) {(r.get("raw_stream") or {}).get("per_s") or "-"} events/s.</p>"""


def render(history: dict[str, Any]) -> str:
    """The HTML page for a drill's ``history`` (see :mod:`singleton.service.drill.run`)."""
    r = history["result"]
    verdict = "PASS" if r["ok"] else "FAIL"
    colour = "#2e7d32" if r["ok"] else "#c62828"
    failures = "".join(f"<li>{_esc(f)}</li>" for f in r["failures"])
    bal = r.get("balance") or {"by_fault": [], "bound": None}
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>singleton drill: {verdict}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
h1 span {{ color: {colour}; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
.legend span {{ display: inline-block; margin-right: 18px; }}
.sw {{ display: inline-block; width: 14px; height: 10px; margin-right: 4px; }}
</style></head><body>
<h1>singleton drill: <span>{verdict}</span></h1>
{_summary(r)}
<ul style="color:{colour}">{failures}</ul>
<p class="legend"><span><i class="sw" style="background:{_colour(0)}"></i>lease held
(colour = fencing token)</span><span><i class="sw" style="background:{_colour(0)};opacity:.6;
height:4px"></i>tenure as the replica saw it</span><span><i class="sw"
style="background:#e53935;opacity:.3"></i>takeover gap</span><span><i class="sw"
style="background:#ffb300;opacity:.4"></i>pause / cut in progress</span><span><i class="sw"
style="background:#bbb"></i>lease store not answering</span><span><i class="sw"
style="background:#78909c"></i>writes/s</span><span><i class="sw" style="background:#ef6c00;
height:2px"></i>events indexed/s</span></p>
{_svg(history)}
<h2>Listeners (each index against the collection)</h2>
<table><tr><th>index</th><th>leases</th><th>documents</th><th>missing</th><th>stale</th>
<th>resurrected</th><th>extra</th></tr>
{_listener_rows(r)}</table>
<h2>Equal index after each fault</h2>
<p>From the fault's end until every index equals its collection, compared document by document
with the writer held.</p>
<table><tr><th>fault</th><th>count</th><th>not equal</th><th>p50</th><th>p99</th><th>max</th></tr>
{_equal_rows(r)}</table>
<h2>Balance after each fault</h2>
<p>Every lease held by a live replica and the leases per live replica within one, from the
fault's end; bound {_sec(bal["bound"])}.</p>
<table><tr><th>fault</th><th>kind</th><th>time to balance</th><th>in bound</th>
<th>leases held per replica</th></tr>
{_balance_rows(bal)}</table>
<h2>Takeover gaps</h2>
<table><tr><th>fault</th><th>count</th><th>takeovers</th><th>p50</th><th>p99</th><th>max</th></tr>
{_gap_rows(r)}</table>
</body></html>
"""

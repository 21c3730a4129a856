"""``<stem>_report.html``: one self-contained page a person reads.

Inline CSS and inline SVG only: no script, no font, no image, no network, so the file opens
anywhere, offline, and can be attached to an issue. Per group: the coverage sentence, both
views with intervals, and four charts: reward distribution, pass@k curve (both views, interval
bars), rollouts not scored by class, and the latency histogram (``elapsed_seconds``). Every
text from the data goes through `_e`: control characters shown as escapes (`visible`: they are
invisible, or invalid, in HTML), then HTML-escaped.

Above the groups, the run: what its manifest says (`run_info`: input and digest, date, version,
deployment, the settings that differ from the defaults) and the rollouts that did not land (from
the batch status, at most `_LISTED`), each a link by id, ``rollout/0/TASK/ROLLOUT``: relative, so
it opens the rollout page where ``trollout view`` serves this report (``/run/N/report``); in the
file opened on its own the id still names the rollout.
"""

from __future__ import annotations

import datetime
import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ..recovery.files import replace_atomically
from ..recovery.layout import RunLayout
from ..text import visible
from .coverage import coverage_lines
from .run_info import run_info
from .summary import GroupSummary, Histogram
from .views import Estimate, ViewSummary

if TYPE_CHECKING:
    from ..health import HealthReport
    from .result import AggregateResult

__all__ = ["render_report", "write_report"]

_W, _H = 520, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 28, 40
_BLUE, _ORANGE, _RED, _GREY = "#2f6db5", "#d9822b", "#c23b3b", "#8a8f98"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1120px;padding:0 16px;color:#1d232b;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-top:1px solid #dde1e6;
padding-top:18px}.muted{color:#68707c}.cover{font-weight:600}
.warn{background:#fff4e5;border:1px solid #f0c27b;padding:6px 10px;border-radius:4px}
.error{background:#fdecec;border:1px solid #e39a9a;padding:6px 10px;border-radius:4px}
table{border-collapse:collapse;margin:8px 0}td,th{border-bottom:1px solid #e6e9ed;padding:4px 10px;
text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f5f7f9}
table.meta td{text-align:left;word-break:break-all}a.rollout{font-family:monospace}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px}
.chart{border:1px solid #e6e9ed;border-radius:6px;padding:4px}svg{width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#3b434d}svg .title{font-size:13px;font-weight:600}
"""


def write_report(
    path: Path, result: AggregateResult, *, health: HealthReport | None = None
) -> None:
    """Write the report atomically (with a rollout health section when ``health`` is given)."""
    page = render_report(result, title=path.name, health=health, links_from=path.parent)
    replace_atomically(path, [page.encode()])


def render_report(
    result: AggregateResult,
    *,
    title: str = "trollout report",
    health: HealthReport | None = None,
    links_from: Path | None = None,
) -> str:
    """Return the report as one HTML document (``links_from``: the page's folder, for links)."""
    head = [f"<h1>{_e(title)}</h1>"]
    head += [f'<p class="cover">{_e(line)}</p>' for line in coverage_lines(result.coverage)[:1]]
    head += [f'<p class="muted">{_e(line)}</p>' for line in coverage_lines(result.coverage)[1:]]
    head += [f'<p class="warn">{_e(line)}</p>' for line in result.inputs.lines()]
    shards = ", ".join(str(p) for p in result.inputs.shards)
    head.append(f'<p class="muted">Shards: {_e(shards)}</p>')
    run = result.merged_path or (result.inputs.shards[0] if result.inputs.shards else None)
    if run is not None:
        head.append(_run_section(RunLayout.for_output(run)))
    sections = [_group(g) for g in result.groups]
    if health is not None:
        sections.append(_health(health, links_from))
    body = "\n".join(head + sections + [_FOOTER])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


_FOOTER = (
    '<p class="muted">"failures excluded" scores the rollouts that landed; "failures as zero" '
    "scores every planned rollout, counting the ones that did not land as 0. Intervals: "
    "Bayesian bootstrap over tasks (seeded), or the normal approximation where marked.</p>"
)


def _group(g: GroupSummary) -> str:
    name = g.label + (f" · {g.environment_server}" if g.agent and g.environment_server else "")
    parts = [f"<section><h2>{_e(name)}</h2>"]
    parts += [f'<p class="cover">{_e(line)}</p>' for line in coverage_lines(g.coverage)]
    if g.aggregation_error:
        parts.append(f'<p class="error">Server metrics failed: {_e(g.aggregation_error)}</p>')
    parts.append(f'<p class="muted">Metrics file entry: {g.metrics_source} metrics.</p>')
    parts.append(_views_table([g.excluded, g.as_zero]))
    charts = [
        _bars(g.reward_histogram, "Reward distribution (landed)", _BLUE),
        _pass_curve(g.excluded, g.as_zero),
        _hbars(list(g.coverage.did_not_land().items()), "Rollouts that did not land, by class"),
        _bars(g.latency_histogram, "Latency, elapsed_seconds (landed)", _ORANGE),
    ]
    parts.append('<div class="charts">' + "".join(f'<div class="chart">{c}</div>' for c in charts))
    parts.append("</div></section>")
    return "\n".join(parts)


_UNHEALTHY_SHOWN = 20  # rollouts listed by id in the health section


def _health(report: HealthReport, links_from: Path | None) -> str:
    """The rollout health section: verdicts, top flagged checks, flagged tasks, unhealthy ids."""

    def href(path: Path) -> str:
        target = os.path.relpath(path, links_from) if links_from is not None else str(path)
        return html.escape(target, quote=True)

    v = report.verdicts
    parts = ['<section id="health"><h2>Rollout health</h2>']
    parts.append(f'<p class="cover">{_e(report.lines()[0])}</p>')
    parts.append(
        "<table><tr><th>verdict</th><th>rollouts</th></tr>"
        + "".join(f"<tr><td>{k}</td><td>{v[k]}</td></tr>" for k in v)
        + "</table>"
    )
    tasks = report.summary.get("tasks", {})
    flagged = sum(1 for task in tasks.values() if task.get("flags"))
    parts.append(f'<p class="muted">Tasks flagged: {flagged} of {len(tasks)}.</p>')
    top = report.top_flagged(8)
    chart = _hbars(top, "Top flagged checks (findings)", "no check flagged")
    parts.append(f'<div class="chart">{chart}</div>')
    unhealthy = _unhealthy_rows(report.verdicts_path, _UNHEALTHY_SHOWN)
    if unhealthy:
        items = "".join(
            f"<li><code>{_e(rid)}</code>: {_e(', '.join(checks))}</li>" for rid, checks in unhealthy
        )
        more = v["unhealthy"] - len(unhealthy)
        tail = f'<p class="muted">and {more} more.</p>' if more > 0 else ""
        parts.append(f"<p>Unhealthy rollouts, by rollout id:</p><ul>{items}</ul>{tail}")
    parts.append(
        f'<p class="muted">Every verdict: <a href="{href(report.verdicts_path)}">'
        f"{_e(report.verdicts_path.name)}</a>; the summary: "
        f'<a href="{href(report.summary_path)}">{_e(report.summary_path.name)}</a>.</p>'
    )
    parts.append("</section>")
    return "\n".join(parts)


def _unhealthy_rows(path: Path, limit: int) -> list[tuple[str, list[str]]]:
    """The first ``limit`` unhealthy rows of a verdict file: rollout id and flagged checks."""
    out: list[tuple[str, list[str]]] = []
    with open(path, "rb") as f:
        for line in f:
            if b'"verdict":"unhealthy"' not in line:
                continue
            row = orjson.loads(line)
            checks = list(dict.fromkeys(finding["check"] for finding in row["findings"]))
            out.append((str(row["rollout_id"]), checks))
            if len(out) == limit:
                break
    return out


_LISTED = 200  # rollouts that did not land, listed with links


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _run_section(layout: RunLayout) -> str:
    """The run's metadata and its rollouts that did not land, linked by id (module doc)."""
    info = run_info(_read_json(layout.manifest))
    parts = ["<section><h2>Run</h2>"]
    if info is None:
        parts.append('<p class="muted">No manifest: the run\'s settings are unknown.</p>')
    else:
        created = info["created_at"]
        when = (
            datetime.datetime.fromtimestamp(created, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
            if isinstance(created, int | float)
            else "?"
        )
        deployment = info["deployment"] if isinstance(info["deployment"], dict) else {}
        rows = [
            ("input", info["input"]),
            ("input sha256", info["input_sha256"]),
            ("created", when),
            ("trollout", info["trollout_version"]),
            ("run id", info["run_id"]),
            ("agents", ", ".join(map(str, deployment.get("agents") or []))),
            (
                "environment servers",
                ", ".join(map(str, deployment.get("environment_servers") or [])),
            ),
            ("planned", f"{info['expected_rollouts']} rollouts of {info['tasks']} tasks"),
        ]
        rows += [
            (key, orjson.dumps(value).decode()) for key, value in info["settings_changed"].items()
        ]
        parts.append('<table class="meta">')
        parts += [f"<tr><td>{_e(k)}</td><td>{_e(str(v))}</td></tr>" for k, v in rows]
        parts.append("</table>")
    status = _read_json(layout.batch_status)
    states = status.get("rollouts") if isinstance(status, dict) else None
    if isinstance(states, list) and states:
        links = []
        for state in states[:_LISTED]:
            if not isinstance(state, dict):
                continue
            task, rollout = state.get("task_index"), state.get("rollout_index")
            if type(task) is not int or type(rollout) is not int:
                continue
            what = _e(str(state.get("failure_class") or state.get("state") or "?"))
            links.append(
                f'<a class="rollout" href="rollout/0/{task}/{rollout}">{task}/{rollout}</a> {what}'
            )
        more = len(states) - _LISTED
        parts.append(
            f"<h3>Rollouts that did not land ({len(states)})</h3><p>{' · '.join(links)}"
            + (f" … and {more} more" if more > 0 else "")
            + '</p><p class="muted">Each id (task/rollout) opens its rollout in '
            f"<code>trollout view {_e(str(layout.output))}</code>.</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _views_table(views: Sequence[ViewSummary]) -> str:
    ks = sorted({k for v in views for k in v.pass_at_k})
    head = "".join(f"<th>pass@{k}</th>" for k in ks)
    rows = [
        "<table><tr><th>view</th><th>rollouts</th><th>tasks</th>"
        f"<th>mean reward (CI)</th>{head}</tr>"
    ]
    for v in views:
        cells = "".join(f"<td>{_est(v.pass_at_k.get(k))}</td>" for k in ks)
        rows.append(
            f"<tr><td>{_e(v.name.replace('_', ' '))}</td><td>{v.rollouts}</td><td>{v.tasks}</td>"
            f"<td>{_est(v.mean_reward)}</td>{cells}</tr>"
        )
    return "".join(rows) + "</table>"


def _est(e: Estimate | None) -> str:
    if e is None:
        return "–"
    if e.interval is None:
        return f"{e.value:.3f}"
    mark = "" if e.interval.method == "bootstrap" else "ⁿ"
    return f"{e.value:.3f} [{e.interval.low:.3f}, {e.interval.high:.3f}]{mark}"


def _frame(title: str, inner: str) -> str:
    return (
        f'<svg viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{_e(title)}"><text class="title" x="{_LEFT}" y="17">{_e(title)}</text>'
        f"{inner}</svg>"
    )


def _empty(title: str) -> str:
    return _frame(title, f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle">no data</text>')


def _axes(y_max: float, y_label: str) -> str:
    plot_h = _H - _TOP - _BOTTOM
    out = [
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_H - _BOTTOM}" stroke="{_GREY}"/>',
        f'<line x1="{_LEFT}" y1="{_H - _BOTTOM}" x2="{_W - _RIGHT}" y2="{_H - _BOTTOM}" '
        f'stroke="{_GREY}"/>',
    ]
    for i in range(5):
        y = _H - _BOTTOM - plot_h * i / 4
        out.append(
            f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{_num(y_max * i / 4)}</text>'
        )
    out.append(
        f'<text x="12" y="{_TOP + plot_h / 2}" transform="rotate(-90 12 {_TOP + plot_h / 2})" '
        f'text-anchor="middle">{_e(y_label)}</text>'
    )
    return "".join(out)


def _bars(hist: Histogram | None, title: str, color: str) -> str:
    if hist is None or not hist.counts:
        return _empty(title)
    top = -(-max(hist.counts) // 4) * 4  # a multiple of 4: whole-number ticks
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    step = plot_w / len(hist.counts)
    every = max(1, len(hist.counts) // 10)
    out = [_axes(top, "rollouts")]
    for i, (label, count) in enumerate(zip(hist.labels, hist.counts, strict=True)):
        h = plot_h * count / top
        x = _LEFT + i * step
        out.append(
            f'<rect x="{x + step * 0.1:.1f}" y="{_H - _BOTTOM - h:.1f}" width="{step * 0.8:.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{_e(label)}: {count}</title></rect>'
        )
        if i % every == 0:
            out.append(
                f'<text x="{x + step / 2:.1f}" y="{_H - _BOTTOM + 14}" text-anchor="middle">'
                f"{_e(label)}</text>"
            )
    return _frame(title, "".join(out))


def _hbars(
    items: Sequence[tuple[str, int]], title: str, empty: str = "every planned rollout landed"
) -> str:
    if not items:
        return _frame(
            title, f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle">{_e(empty)}</text>'
        )
    top = max(n for _, n in items)
    left = 170
    row_h = min(26.0, (_H - _TOP - 10) / len(items))
    out = []
    for i, (label, n) in enumerate(items):
        y = _TOP + i * row_h
        w = (_W - left - 50) * n / top
        out.append(
            f'<text x="{left - 6}" y="{y + row_h * 0.65:.1f}" text-anchor="end">{_e(label)}</text>'
            f'<rect x="{left}" y="{y + 2:.1f}" width="{w:.1f}" height="{row_h - 4:.1f}" '
            f'fill="{_RED}"/><text x="{left + w + 4:.1f}" y="{y + row_h * 0.65:.1f}">{n}</text>'
        )
    return _frame(title, "".join(out))


def _pass_curve(excluded: ViewSummary, as_zero: ViewSummary) -> str:
    title = "pass@k (binary rewards)"
    ks = sorted({k for v in (excluded, as_zero) for k in v.pass_at_k})
    if not ks:
        return _empty(title)
    plot_w, plot_h = _W - _LEFT - _RIGHT - 110, _H - _TOP - _BOTTOM
    xs = {k: _LEFT + 20 + (plot_w - 40) * (i / max(1, len(ks) - 1)) for i, k in enumerate(ks)}
    out = [_axes(1.0, "pass@k")]
    out += [
        f'<text x="{x:.1f}" y="{_H - _BOTTOM + 14}" text-anchor="middle">{k}</text>'
        for k, x in xs.items()
    ]
    for n, (view, color) in enumerate(((excluded, _BLUE), (as_zero, _RED))):
        points = []
        for k, e in sorted(view.pass_at_k.items()):
            x, y = xs[k], _H - _BOTTOM - plot_h * e.value
            points.append(f"{x:.1f},{y:.1f}")
            if e.interval is not None:
                lo, hi = (_H - _BOTTOM - plot_h * v for v in (e.interval.low, e.interval.high))
                out.append(
                    f'<line x1="{x:.1f}" y1="{lo:.1f}" x2="{x:.1f}" y2="{hi:.1f}" '
                    f'stroke="{color}" stroke-width="2" opacity="0.5"/>'
                )
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
        out.append(
            f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="2"/>'
        )
        lx, ly = _W - _RIGHT - 105, _TOP + 14 + 18 * n
        out.append(
            f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{ly}">{_e(view.name.replace("_", " "))}</text>'
        )
    return _frame(title, "".join(out))


def _num(x: float) -> str:
    return f"{x:.2f}" if x < 10 and x != int(x) else f"{x:.0f}"


def _e(text: str) -> str:
    return html.escape(visible(text), quote=True)

"""The ``remit check`` report: a terminal table, JSON and a self-contained HTML page."""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path

from remit_check import FAULTS, PROPERTIES, CellResult, Report

MARK = {"holds": "holds", "violated": "VIOLATED", "error": "ERROR"}


def _rows(report: Report) -> dict[str, list[tuple[str, str, dict[str, CellResult]]]]:
    """framework -> [(fault, property, {layer: cell})] in the matrix's order."""
    grid: dict[str, dict[tuple[str, str], dict[str, CellResult]]] = defaultdict(dict)
    for c in report.cells:
        grid[c.framework].setdefault((c.fault, c.property), {})[c.layer] = c
    order = {f: i for i, f in enumerate(FAULTS)}
    porder = {p: i for i, p in enumerate(PROPERTIES)}
    out: dict[str, list[tuple[str, str, dict[str, CellResult]]]] = {}
    for fw, cells in grid.items():
        keys = sorted(cells, key=lambda k: (order.get(k[0], 99), porder.get(k[1], 99)))
        out[fw] = [(f, p, cells[(f, p)]) for f, p in keys]
    return out


def profile(report: Report) -> str:
    lines = []
    for layer in report.options.get("layers", ["stock", "remit"]):
        cells = [c for c in report.cells if c.layer == layer]
        held = sum(c.holds for c in cells)
        lines.append(f"{layer}: {held}/{len(cells)} cells hold")
    return "; ".join(lines)


def text(report: Report) -> str:
    o = report.options
    layers: list[str] = list(o.get("layers", ["stock", "remit"]))
    head = (f"remit check: k={o.get('k')}, reps={o.get('reps')}, store: {o.get('store')} "
            f"({report.seconds:.0f}s)")
    out = [head, ""]
    for fw, note in report.skipped.items():
        out.append(f"{fw}: skipped ({note})")
    if report.skipped:
        out.append("")
    for fw, rows in _rows(report).items():
        out.append(fw)
        for fault, prop, by_layer in rows:
            for n, layer in enumerate(layers):
                c = by_layer.get(layer)
                label = f"{fault:<20}{prop:<7}" if n == 0 else " " * 27
                cell = "-" if c is None else f"{MARK[c.verdict]:<9}{c.summary}"
                out.append(f"  {label}{layer:<7}{cell}")
        out.append("")
    out.append("profile: " + profile(report))
    if not report.cells:
        out.append("result: nothing was checked (exit status 1)")
    else:
        out.append("result: " + ("every remit cell holds" if report.ok
                                 else "some remit cells do NOT hold (exit status 1)"))
    return "\n".join(out)


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.as_dict(), indent=2))


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#1d1d1f}
h1{font-size:20px}h2{font-size:16px;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2}
td.holds{background:#d9f2dc}td.violated{background:#f8d3d0}td.error{background:#e4e4e4}
td.cell span{display:block;font-size:12px;color:#444}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid #ccc}
"""


def to_html(report: Report) -> str:
    o = report.options
    layers: list[str] = list(o.get("layers", ["stock", "remit"]))
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>remit check</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>remit check: the resume contract, stock against remit</h1>",
        f"<p>k={e(str(o.get('k')))}, reps={e(str(o.get('reps')))}, "
        f"store: {e(str(o.get('store')))}, {report.seconds:.0f}s. "
        f"{e(profile(report))}. "
        f"<b>{'Every remit cell holds.' if report.ok else 'Some remit cells do not hold.'}</b>"
        "</p>",
        "<p class='legend'><span class='l holds' style='background:#d9f2dc'>holds</span>"
        "<span style='background:#f8d3d0'>violated</span>"
        "<span style='background:#e4e4e4'>error</span> Hover a cell for its raw counts.</p>",
    ]
    for fw, note in report.skipped.items():
        parts.append(f"<p>{e(fw)}: skipped ({e(note)})</p>")
    for fw, rows in _rows(report).items():
        parts.append(f"<h2>{e(fw)}</h2><table><thead><tr><th>fault point</th><th>property</th>"
                     + "".join(f"<th>{e(layer)}</th>" for layer in layers)
                     + "</tr></thead><tbody>")
        for fault, prop, by_layer in rows:
            parts.append(f"<tr><td title='{e(FAULTS.get(fault, fault))}'>{e(fault)}</td>"
                         f"<td>{e(prop)}</td>")
            for layer in layers:
                c = by_layer.get(layer)
                if c is None:
                    parts.append("<td>-</td>")
                    continue
                counts = ", ".join(f"{k}={v}" for k, v in c.counts.items())
                parts.append(
                    f"<td class='cell {c.verdict}' data-framework='{e(fw)}' "
                    f"data-layer='{e(layer)}' data-fault='{e(fault)}' data-property='{e(prop)}' "
                    f"title='{e(counts)}'><b>{e(MARK[c.verdict])}</b><span>{e(c.summary)}</span>"
                    "</td>")
            parts.append("</tr>")
        parts.append("</tbody></table>")
    parts.append("</body></html>")
    return "".join(parts)


def write_html(report: Report, path: Path) -> None:
    path.write_text(to_html(report))

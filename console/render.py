"""Pure functions from snapshot pieces to rich Text for cells and panels (no I/O)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from ups.format import (
    HEALTH_STYLES,
    STATE_STYLES,
    fmt_age,
    fmt_attempt,
    fmt_bytes,
    fmt_duration,
    fmt_ms,
    fmt_progress,
    fmt_rate,
    slurm_line,
)

# Where a rank's step goes (ups.status.straggler.RankTime): each part's glyph, style and name,
# in the order the bar draws them. Distinct glyphs, so that the bar reads without colour.
STEP_PARTS = (("▓", "cyan", "input"), ("░", "yellow", "peer wait"), ("█", "blue", "backward"),
              ("▒", "magenta", "rest"))
STEP_BAR_WIDTH = 12


def health_cell(health: str, reason: str = "", width: int = 48) -> Text:
    """The health word (always shown, coloured), with the reason when it is a problem."""
    t = Text(health, style=HEALTH_STYLES.get(health, ""))
    if reason and width and health not in ("ok", "done"):
        t.append(" " + (reason if len(reason) <= width else reason[: width - 1] + "…"), style="dim")
    return t


def reason_cell(health: str, reason: str, width: int = 60) -> Text:
    if not reason or health in ("ok", "done"):
        return Text("")
    return Text(reason if len(reason) <= width else reason[: width - 1] + "…", style="dim")


def state_cell(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def bar(step: int, total: int | None, width: int = 10) -> Text:
    if not total:
        return Text(str(step))
    frac = max(0.0, min(1.0, step / total))
    full = int(frac * width)
    return Text.assemble(("█" * full, "green"), ("░" * (width - full), "dim"), f" {frac * 100:3.0f}%")


def step_parts(t) -> tuple[float, float, float, float]:
    """A rank's median step (a ``RankTime``) as input, waiting for peers, backward (the work
    and real communication every rank shares: ups.status.straggler), rest; in seconds."""
    return t.data, t.wait, max(0.0, t.step - t.wait - t.data - t.other), t.other


def step_bar(t, *, named: bool = False, width: int = STEP_BAR_WIDTH) -> Text:
    """A rank's step as a bar of ``width`` cells, each part in proportion (largest remainders
    rounded up), then its straggler score; the straggler's score in its health's colour."""
    parts = step_parts(t)
    total = sum(parts)
    if total <= 0:
        return Text("-")
    exact = [width * v / total for v in parts]
    cells = [int(x) for x in exact]
    for i in sorted(range(len(parts)), key=lambda i: exact[i] - cells[i], reverse=True)[: width - sum(cells)]:
        cells[i] += 1
    bar = Text.assemble(*((glyph * n, style) for (glyph, style, _), n in zip(STEP_PARTS, cells, strict=True) if n))
    bar.append(f" {t.score:.2f}", style=HEALTH_STYLES["straggler"] if named else "")
    return bar


def step_line(t, label: str, found=None) -> Text:
    """The selected rank's step in words: each part's glyph, name and median, its score, and
    its cause when it is the straggler named (``found``: a ``Straggler``)."""
    line = Text.assemble((f"{label} ", "bold"), f"step {fmt_ms(t.step)}: ")
    for (glyph, style, name), value in zip(STEP_PARTS, step_parts(t), strict=True):
        line.append(glyph, style=style)
        line.append(f" {name} {fmt_ms(value)}  ")
    named = found is not None and (t.name == found.rank.name or t.rank in found.node_ranks)
    line.append(f"score {t.score:.2f}", style=HEALTH_STYLES["straggler"] if named else "bold")
    if named:  # the verdict above says what it costs
        line.append(f" (straggler: {found.cause})", style=HEALTH_STYLES["straggler"])
    return line


def gpu_cell(gpu) -> str:
    if gpu is None or gpu.allocated is None:
        return "-"
    return f"{fmt_bytes(gpu.allocated)}/{fmt_bytes(gpu.peak)}"


def gpu_panel(attributed) -> Text | Group:
    if attributed is None:
        return Text("GPU: not polled", style="dim")
    g = attributed.gpu
    if not g.available:
        return Text.assemble(("GPU  ", "bold"), ("No visible devices found: ", "yellow"), (g.reason or "", "yellow"))
    parts: list = [Text(f"GPU  driver {g.driver_version or '?'}  CUDA {g.cuda_driver_version or '?'}", style="bold")]
    for d in g.devices:
        used, total = d.memory_used or 0, d.memory_total or 1
        width = 20
        fill = int(width * used / total)
        parts.append(Text.assemble(
            f"{d.index} {d.name or '?'} ",
            ("█" * fill, "magenta"), ("░" * (width - fill), "dim"),
            f" {fmt_bytes(used)}/{fmt_bytes(total)}  util {d.utilization_gpu if d.utilization_gpu is not None else '-'}%"
            f"  {d.temperature_c if d.temperature_c is not None else '-'}C",
        ))
    for p in attributed.processes:
        who = f"{p.run_id} {p.label}" if p.status == "run" else p.note
        style = "" if p.status == "run" else "bold red"
        parts.append(Text.assemble(f"  gpu{p.device} pid {p.pid} {fmt_bytes(p.used_memory)}  ", (who, style)))
    for n in attributed.notes:
        parts.append(Text(n, style="yellow"))
    return Group(*parts)


def run_header(view, now: float) -> Text:
    m = view.manifest or {}
    state = view.state or "unreadable"
    created = m.get("created_at")
    elapsed = fmt_duration((m.get("ended_at") or now) - created) if created else "-"
    mode = m.get("mode") or (f"{m.get('world_size')} ranks" if m.get("world_size") else "")
    t = Text.assemble((view.run_id, "bold"), f"  {view.kind or '?'}  ", (state, STATE_STYLES.get(state, "")),
                      f"  elapsed {elapsed}  eta {fmt_duration(view.eta_s)}  {fmt_progress(*view.progress)}"
                      f"  {fmt_rate(view.rate, view.unit)}" + (f"  mode {mode}" if mode else ""),
                      (fmt_attempt(m), "bold yellow"))
    if view.kind == "attached":
        t.append("\nnot launched by ups: attached, watched from outside (no signal; exit codes not visible)", style="cyan")
        if slurm_line(m):
            t.append(f"\n{slurm_line(m)}", style="cyan")
    if m.get("summary"):
        t.append(f"\n{m['summary']}", style="dim")
    if view.manifest_problem:
        t.append(f"\n{view.manifest_problem}", style="red")
    for p in view.problems:
        t.append(f"\nunreadable status file {p.file}: {p.problem}", style="yellow")
    return t


def events_text(events) -> Text:
    import time

    t = Text()
    for e in list(events)[-12:]:
        what = e.get("reason") or e.get("summary") or e.get("sample") or e.get("error") or e.get("request") or e.get("result") or ""
        who = e.get("actor", "")
        t.append(time.strftime("%H:%M:%S ", time.localtime(e.get("ts", 0))), style="dim")
        t.append(f"{e.get('event')}", style="bold")
        t.append(f" [{who}] {e.get('target', '')} {what}\n")
    return t


def attempts_text(manifest: dict) -> Text:
    """The attempts of a run restarted on hangs, as a timeline: each one's start, what its start
    cost (to its first step), the step it reached, how it ended and why, and the seconds from
    its hang to the next start (run.json's ``attempts``, written by the launcher)."""
    import time

    def num(v: object) -> float | None:
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    def clock(v: object) -> str:
        return time.strftime("%H:%M:%S", time.localtime(num(v))) if num(v) is not None else "?"

    attempts = [a for a in manifest.get("attempts") or [] if isinstance(a, dict)]
    current = manifest.get("attempt") or 1
    if not attempts and current == 1:
        return Text("one attempt: no restart" + (" (--on-hang restart)" if manifest.get("on_hang") == "restart" else ""),
                    style="dim")
    t = Text()
    for a in attempts:
        verdict = a.get("verdict") if isinstance(a.get("verdict"), dict) else {}
        t.append(f"attempt {a.get('attempt', '?')}", style="bold")
        t.append(f"  {clock(a.get('started_at'))}")
        if num(a.get("first_step_s")) is not None:
            t.append(f"  first step after {a['first_step_s']:.1f} s")
        if num(a.get("step")) is not None:
            t.append(f"  reached step {a['step']}")
        t.append(f"  {a.get('ended', '?')}", style="yellow" if str(a.get("ended", "")).startswith("restarted") else "red")
        if num(a.get("hang_to_restart_s")) is not None:
            t.append(f"  hang → restart {a['hang_to_restart_s']:.0f} s")
        t.append("\n")
        if verdict.get("headline"):
            where = (verdict.get("where") or {}).get("site") if isinstance(verdict.get("where"), dict) else None
            t.append(f"    {verdict['headline']}" + (f" at {where}" if where else "") + "\n", style="dim")
        if isinstance(a.get("reason"), str):
            t.append(f"    {a['reason']}\n", style="bold red" if a["reason"].startswith(("not restarted", "gave up")) else "")
    if not any(a.get("attempt") == current for a in attempts) and manifest.get("state") == "running":
        t.append(f"attempt {current}", style="bold")
        t.append("  running")
        if num(manifest.get("first_step_s")) is not None:
            t.append(f"  first step after {manifest['first_step_s']:.1f} s")
        t.append("\n")
    return t


def age(seconds: float) -> str:
    return fmt_age(seconds)


def verdict_line(verdict) -> Text:
    """`ups why` at the head of the run screen: the headline, then where and what next."""
    if verdict is None:
        return Text("")
    t = Text.assemble(("why: ", "bold"), (verdict.headline, "green" if verdict.ok else "bold red"))
    where = verdict.where or {}
    loc = where.get("site") or where.get("frame")
    if loc and not verdict.ok:
        t.append(f"  at {loc}", "yellow")
    if verdict.next and not verdict.ok:
        t.append(f"\nnext: {verdict.next}", "dim")
    return t

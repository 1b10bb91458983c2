"""Small pure formatters shared by the CLI tables and the console (no heavy imports)."""

from __future__ import annotations


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def fmt_rate(rate: float | None, unit: str = "") -> str:
    if rate is None:
        return "-"
    suffix = f" {unit}/s" if unit else "/s"
    if rate >= 100:
        return f"{rate:.0f}{suffix}"
    if rate >= 1:
        return f"{rate:.1f}{suffix}"
    return f"{rate:.2f}{suffix}"


def fmt_metric(value: object) -> str:
    """A training metric (loss, lr, grad norm) in at most 8 characters: '0.1234', '3.2e-04', 'nan'."""
    if isinstance(value, str):
        return value[:8]
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.1e}"
    return f"{value:.4g}"


def fmt_attempt(manifest: dict) -> str:
    """'  attempt 2/4' for a run launched with --on-hang restart (or that restarted); '' otherwise."""
    attempt = manifest.get("attempt") or 1
    if manifest.get("on_hang") != "restart" and attempt == 1:
        return ""
    return f"  attempt {attempt}/{(manifest.get('max_restarts') or 0) + 1}"


def fmt_progress(step: int, total: int | None) -> str:
    if not total:
        return str(step)
    pct = 100.0 * step / total
    return f"{step}/{total} ({pct:.0f}%)"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_ms(seconds: float | None) -> str:
    """Seconds as milliseconds, three significant digits: '9.35 ms', '120 ms', '-'."""
    return "-" if seconds is None else f"{seconds * 1e3:.3g} ms"


def fmt_straggler(found) -> str:
    """A named straggler (``ups.status.straggler.Straggler``) in one sentence: who, its score
    and cause, and what it costs the job."""
    who = (f"node {found.rank.host} (ranks {', '.join(map(str, found.node_ranks))})" if found.cause == "node"
           else f"rank {found.rank.rank}")
    return (f"straggler: {who}, score {found.rank.score:.2f} (cause: {found.cause}); the job runs {found.cost:.0%} "
            f"below its pace without it, {found.gpu_hours_per_day:.1f} GPU-hours a day on {found.world} ranks")


HEALTH_STYLES = {
    "starting": "cyan",
    "ok": "green",
    "slow": "yellow",
    "straggler": "yellow",
    "stalled": "bold yellow",
    "unresponsive": "bold red",
    "dead": "bold red",
    "unreachable": "bold magenta",
    "done": "dim green",
    "failed": "bold red",
}

STATE_STYLES = {
    "launching": "cyan",
    "running": "green",
    "succeeded": "dim green",
    "partial": "yellow",
    "failed": "bold red",
    "killed": "magenta",
    "lost": "red",
    "ended": "yellow",
    "unsupervised": "bold yellow",
}


def slurm_line(manifest: dict) -> str | None:
    """The SLURM step an attached run watches (``attached.slurm`` in its run.json, as ``ups
    attach`` found it): job id, step, user and node; None for any other run."""
    step = (manifest.get("attached") or {}).get("slurm") if isinstance(manifest.get("attached"), dict) else None
    if not isinstance(step, dict) or not step.get("job_id"):
        return None
    who = "".join(f", {k} {step[k]}" for k in ("user", "node") if step.get(k))
    return f"SLURM job {step['job_id']} step {step.get('step_id', '?')}{who}"

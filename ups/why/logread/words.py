"""The words every match of a sign's pattern holds (:attr:`ups.why.logread.classes.Sign.words`):
a line with none of them cannot match, and a substring test costs a fraction of a regex search
(a log has many lines). Read from the pattern's text: for each top-level alternative, its
longest run of literal characters outside any group, class or optional part."""

from __future__ import annotations

_LITERAL_ESCAPES = set(".()[]{}*+?|^$\\/-'\"`<>:=,;!@#%&~ ")


def required_words(pattern: str, shortest: int = 3) -> tuple[str, ...] | None:
    """For each top-level alternative of ``pattern``, its longest run of literal characters
    outside any group, class or optional part: every match holds one of them. None when an
    alternative has no such run of ``shortest`` characters (then the pattern is always tried)."""
    words: list[str] = []
    for alt in _split_top(pattern):
        runs, run, depth, k = [], "", 0, 0
        while k < len(alt):
            c = alt[k]
            nxt = alt[k + 1] if k + 1 < len(alt) else ""
            if c == "\\" and nxt:
                lit = nxt if nxt in _LITERAL_ESCAPES else None
                k += 2
            elif c == "[":
                end = alt.find("]", k + 2)
                k, lit = (end + 1 if end > 0 else len(alt)), None
                runs.append(run)
                run = ""
                continue
            elif c == "(":
                depth += 1
                k, lit = k + 1, None
            elif c == ")":
                depth -= 1
                k, lit = k + 1, None
            elif c in ".^$|":
                k, lit = k + 1, None
            elif c in "?*{":
                # the character before is optional (or repeated from zero): drop it from the run
                run = run[:-1]
                runs.append(run)
                run = ""
                if c == "{":
                    k = alt.find("}", k) + 1 or len(alt)
                else:
                    k += 1
                continue
            elif c == "+":  # the character before is required, but may repeat: the run ends with it
                runs.append(run)
                run = ""
                k += 1
                continue
            else:
                lit = c
                k += 1
            if lit and depth == 0:
                run += lit
            elif lit != "":
                runs.append(run)
                run = ""
        runs.append(run)
        best = max(runs, key=len).strip().lower() if runs else ""
        if len(best) < shortest:
            return None
        words.append(best)
    return tuple(words)


def _split_top(pattern: str) -> list[str]:
    """``pattern``'s top-level alternatives (the ``|`` outside groups and classes)."""
    out, cur, depth, k = [], "", 0, 0
    while k < len(pattern):
        c = pattern[k]
        if c == "\\":
            cur += pattern[k:k + 2]
            k += 2
            continue
        if c == "[":
            end = pattern.find("]", k + 2)
            end = len(pattern) - 1 if end < 0 else end
            cur += pattern[k:end + 1]
            k = end + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(cur)
            cur = ""
            k += 1
            continue
        cur += c
        k += 1
    out.append(cur)
    return out

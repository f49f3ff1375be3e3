"""``$(VAR)`` references in env values, command and args, expanded the way kubelet does (pure).

``$(NAME)`` becomes the value of ``NAME`` when it is defined and stays as written when it is not;
``$$`` is an escaped ``$``; any other ``$`` is kept.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "(":
            close = text.find(")", i + 2)
            if close != -1:
                name = text[i + 2 : close]
                out.append(env[name] if name in env else text[i : close + 1])
                i = close + 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)

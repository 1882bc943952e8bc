"""Text from models and trajectories, made safe to show: no control characters, no escape sequences.

Model output, trajectory samples and anything a proposer writes reach commit messages, reports and
the terminal. An ANSI CSI sequence (`ESC [ ... m`, cursor moves, screen clears), an OSC sequence
(`ESC ] ... BEL`: window titles, hyperlinks, clipboard writes on some terminals), a carriage return
or backspace that overwrites what was printed before, or a C1 control would then act on the
reader's terminal or hide text from a reviewer. `clean_text` removes them all.

    clean_text("ok\\x1b[2J\\x1b]0;pwned\\x07 done")      # "ok done"
    clean_text("a\\tb\\nc", newlines=False)             # "a\\tb c"
"""
from __future__ import annotations

import re

# ESC-introduced sequences: CSI (ESC [ params final), OSC/DCS/SOS/PM/APC (ESC ] ... BEL or ST),
# and two-character escapes (ESC + one byte); their 8-bit C1 forms (CSI U+009B, OSC U+009D ...).
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"                       # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"                                      # other escapes (and a lone ESC)
)
# C0 controls but \t and \n, DEL, C1 controls; and the Unicode line/paragraph separators and
# bidirectional overrides that reorder what a reader sees.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def clean_text(text: object, newlines: bool = True, tabs: bool = True) -> str:
    """`text` as a string without escape sequences or control characters. `\\n` is kept when
    `newlines` (else it becomes a space), `\\t` when `tabs` (else a space); `\\r\\n` counts as `\\n`."""
    s = text if isinstance(text, str) else str(text)
    s = _ESCAPES.sub("", s.replace("\r\n", "\n"))
    if not newlines:
        s = s.replace("\n", " ")
    if not tabs:
        s = s.replace("\t", " ")
    return _CONTROLS.sub("", s)

"""The id rule (protocol.md "The id rule"), in one place.

An id (account, server, channel) is 1-128 characters and holds no control, format or surrogate
code point (Unicode categories Cc, Cf, Cs) and no line or paragraph separator (U+2028, U+2029).
Format characters are the invisible ones: zero-width spaces and joiners, the bidirectional
overrides and isolates (U+202A-U+202E, U+2066-U+2069) that make a roster spell a name backwards,
the BOM, soft hyphens, tag characters. Frames (`bad_frame`), tokens (4001), the internal API
(400) and `presence load` (an error naming the entry) all ask this module, and nothing else.

Pure: no I/O. The categories come from the running Python's Unicode database.
"""

from __future__ import annotations

import re
import unicodedata

MIN_ID_LENGTH = 1
MAX_ID_LENGTH = 128
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})
SEPARATORS = frozenset({"\u2028", "\u2029"})

# The demo's reserved namespace: the demo site's accounts, server and channel, and only they,
# have ids starting with this. `presence load` refuses such ids, a token signed with the service's
# secret never names one, and a demo token (edge/tokens.py) names nothing else.
DEMO_PREFIX = "demo:"

# The common case, checked without a per-character loop: printable ASCII only.
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")


def id_problem(value: object) -> str | None:
    """Why `value` is not a valid id, or None when it is one.

    The message never quotes the id itself (it may be long, invisible or spoofing): it names the
    offending code point and its position, which is enough to find it."""
    if not isinstance(value, str):
        return "an id must be a string"
    if len(value) < MIN_ID_LENGTH:
        return "an id must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"an id is at most {MAX_ID_LENGTH} characters (this one has {len(value)})"
    if _PRINTABLE_ASCII.fullmatch(value):
        return None
    for i, c in enumerate(value):
        category = unicodedata.category(c)
        if category in FORBIDDEN_CATEGORIES or c in SEPARATORS:
            return f"an id may not contain U+{ord(c):04X} (category {category}) at position {i}"
    return None


def check_id(value: str) -> str:
    """`value` itself when valid, else ValueError with the reason (for pydantic validators)."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def is_demo_id(value: str) -> bool:
    """Whether `value` lies in the demo's reserved namespace."""
    return value.startswith(DEMO_PREFIX)

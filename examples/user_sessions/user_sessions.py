"""User sessions: clicks grouped into sessions separated by 30 minutes of inactivity.

``clicks`` (key: user id, any value) is grouped by user and cut into session
windows with a 30-minute inactivity gap and 5 minutes of grace (a session takes
clicks until stream time passes its end + gap + grace, as in Kafka); the
``user-sessions`` session store counts each session's clicks. Every change goes
to ``user-sessions`` keyed ``"<user>@<session start>"`` with value
``{"user", "start", "end", "clicks"}`` (both ends inclusive: the first and
last click's times). When a click bridges two sessions they merge: each
merged session's key gets a tombstone (None), then the merged session is
written, so the topic, compacted, holds exactly the current sessions.
"""

from typing import Any

from eddyline_runtime.processing import SessionWindows, StreamsBuilder, Windowed

INPUT_TOPIC = "clicks"
OUTPUT_TOPIC = "user-sessions"
STORE = "user-sessions"
GAP_MS = 30 * 60_000
GRACE_MS = 5 * 60_000


def session(window: Windowed[str], clicks: int | None) -> tuple[str, dict[str, Any] | None]:
    start, end = window.window.start, window.window.end
    key = f"{window.key}@{start}"
    if clicks is None:  # merged into a longer session
        return key, None
    return key, {"user": window.key, "start": start, "end": end, "clicks": clicks}


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT_TOPIC, key_serde="string", value_serde="json")
        .group_by_key()
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(GAP_MS, GRACE_MS))
        .count(STORE)
        .to_stream()
        .map(session)
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder

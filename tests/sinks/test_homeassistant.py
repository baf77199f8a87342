"""The discovery document's value templates, rendered with jinja2 (Home Assistant's template engine)
in its strictest mode against every kind of payload the guard publishes: the state sent on connect
(no numbers yet), the state before the first frame (no latencies yet), a running guard's state, and
an event. A template that fails to render leaves its entity unavailable in Home Assistant."""

from __future__ import annotations

import json

import jinja2
import pytest

from tracker.latency import STAGES
from tracker.sinks.homeassistant import discovery_payload

ON_CONNECT = {"schema": 1, "ts": "2026-12-06T08:00:00Z", "events_dropped": 0, "outbox_pending": 0,
              "too_large": {}, "inbound_ignored": 0}
BEFORE_FIRST_FRAME = {**ON_CONNECT, "fps": 0.0, "tracks": 0, "latency_ms": {}}
RUNNING = {**ON_CONNECT, "fps": 9.5, "tracks": 2, "events_dropped": 3,
           "latency_ms": {stage: {"p50": 10.0, "p95": 42.5} for stage in STAGES}}
EVENT = {"schema": 1, "id": "0123456789abcdef0123456789abcdef", "kind": "identified", "identity": "alice",
         "confidence": 0.91, "track_id": 7}


def render(template: str, payload: dict) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps  # one of Home Assistant's own filters
    return env.from_string(template).render(value_json=payload)


@pytest.mark.parametrize("key, payload, expected", [
    ("presence", ON_CONNECT, "OFF"), ("presence", BEFORE_FIRST_FRAME, "OFF"), ("presence", RUNNING, "ON"),
    ("fps", ON_CONNECT, "None"), ("fps", BEFORE_FIRST_FRAME, "0.0"), ("fps", RUNNING, "9.5"),
    ("latency", ON_CONNECT, "None"), ("latency", BEFORE_FIRST_FRAME, "None"), ("latency", RUNNING, "42.5"),
    ("dropped", ON_CONNECT, "0"), ("dropped", RUNNING, "3"),
])
def test_state_templates_render_for_every_state_the_guard_sends(key, payload, expected):
    template = discovery_payload("tracker", "hall", "Guard hall")["cmps"][key]["value_template"]
    assert render(template, payload) == expected


def test_the_event_template_gives_home_assistant_its_event_type_and_attributes():
    template = discovery_payload("tracker", "hall", "Guard hall")["cmps"]["person"]["value_template"]
    assert json.loads(render(template, EVENT)) == {"event_type": "identified", "identity": "alice", "confidence": 0.91,
                                                   "track_id": 7, "event_id": EVENT["id"]}

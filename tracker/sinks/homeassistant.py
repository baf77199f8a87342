"""Home Assistant MQTT discovery for one guard (pure functions; the MQTT sink publishes the result).

Device-based discovery: ONE retained message on `<discovery_prefix>/device/<node>/config` carries the
device, the origin and every component, so Home Assistant creates or removes the guard's entities as
one unit (per-component discovery would need six messages that repeat the device and availability
and can be half-applied). `<node>` is `<prefix with / as _>_<device id>`, unique per guard, so several
guards on one broker become several devices.

Components (each tied to `<prefix>/<device>/availability`, payloads online/offline):
    presence   binary_sensor (occupancy)  ON while the guard has at least one track (state.tracks)
    person     event   event_types entered / identified / left, from the events topic; the event's
               identity, confidence, track_id and id become attributes
    snapshot   image   the retained JPEG on the snapshot topic
    fps        sensor  diagnostic, frames per second (state.fps)
    latency    sensor  diagnostic, p95 of the whole-frame latency in ms (state.latency_ms.total_ms.p95)
    dropped    sensor  diagnostic, events that will never be sent (state.events_dropped: the outbox
                       bounds' drops and the events the broker refused or that are too large for
                       it, kept across restarts, so that the count only grows, as Home Assistant's
                       total_increasing takes it; and, since the guard started, those not storable)
Required by Home Assistant's device discovery schema: `dev` with identifiers, `o` (origin) with a
name, `cmps` whose entries each have `p` (platform) and `unique_id`.
"""

from __future__ import annotations

from tracker import __version__


def node_id(prefix: str, device_id: str) -> str:
    return f"{prefix.replace('/', '_')}_{device_id}"


def discovery_topic(discovery_prefix: str, prefix: str, device_id: str) -> str:
    return f"{discovery_prefix}/device/{node_id(prefix, device_id)}/config"


def discovery_payload(prefix: str, device_id: str, device_name: str) -> dict:
    """The device-discovery document for the guard whose topics start with `<prefix>/<device_id>`."""
    base = f"{prefix}/{device_id}"
    node = node_id(prefix, device_id)
    state = f"{base}/state"

    def component(platform: str, key: str, name: str, **options) -> dict:
        return {"p": platform, "unique_id": f"{node}_{key}", "name": name, **options}

    diagnostic = {"entity_category": "diagnostic", "state_topic": state, "state_class": "measurement"}
    return {
        "dev": {
            "ids": [node],
            "name": device_name,
            "mf": "tracker",
            "mdl": "Face-tracking guard",
            "sw": __version__,
        },
        "o": {"name": "tracker", "sw": __version__},
        "availability_topic": f"{base}/availability",
        "payload_available": "online",
        "payload_not_available": "offline",
        "qos": 1,
        "cmps": {
            "presence": component(
                "binary_sensor", "presence", "Person present",
                device_class="occupancy", state_topic=state,
                value_template="{{ 'ON' if (value_json.tracks | default(0) | int(0)) > 0 else 'OFF' }}",
            ),
            "person": component(
                "event", "person", "Person",
                state_topic=f"{base}/events",
                event_types=["entered", "identified", "left"],
                value_template=(
                    "{{ {'event_type': value_json.kind, 'identity': value_json.identity, "
                    "'confidence': value_json.confidence, 'track_id': value_json.track_id, "
                    "'event_id': value_json.id} | to_json }}"
                ),
            ),
            "snapshot": component(
                "image", "snapshot", "Last face",
                image_topic=f"{base}/snapshot", content_type="image/jpeg",
            ),
            "fps": component(
                "sensor", "fps", "Frame rate", unit_of_measurement="fps",
                value_template="{{ value_json.fps | default(none) }}", **diagnostic,
            ),
            "latency": component(
                "sensor", "latency", "Frame latency p95", unit_of_measurement="ms", device_class="duration",
                # Until the first frame the state has no latency_ms, or an empty one: no value, not an error.
                value_template="{{ value_json.latency_ms.total_ms.p95 if value_json.latency_ms is defined and "
                               "value_json.latency_ms.total_ms is defined else none }}", **diagnostic,
            ),
            "dropped": component(
                "sensor", "dropped", "Events dropped",
                value_template="{{ value_json.events_dropped | default(0) }}",
                **{**diagnostic, "state_class": "total_increasing"},
            ),
        },
    }

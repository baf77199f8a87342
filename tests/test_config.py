"""Strict config: the default file is complete and valid, every mistake is one line naming the key
path, the bad value and what was expected (exit 2 from the CLI, no traceback), and random YAML never
produces anything but a valid Config or a ConfigError (hypothesis)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tracker.config import DEFAULT_CONFIG, Config, load_config, parse_config
from tracker.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += leaf_paths(annotation, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


ALL_KEYS = sorted({p[-1] for p in leaf_paths(Config)} | {p[0] for p in leaf_paths(Config)})


def test_default_file_is_valid_and_equals_the_built_in_defaults():
    assert load_config(DEFAULT_CONFIG) == Config()


def test_default_file_documents_every_key_with_a_comment():
    text = DEFAULT_CONFIG.read_text()
    lines = text.splitlines()
    for path in leaf_paths(Config):
        # the key, nested under its section (by indentation), commented out only if its default is
        # machine-dependent (the model paths)
        pattern = re.compile(rf"^{'  ' * (len(path) - 1)}#? ?{re.escape(path[-1])}:")
        matches = [ln for ln in lines if pattern.match(ln)]
        assert matches, f"{'.'.join(path)} is not documented in {DEFAULT_CONFIG}"
        assert any("#" in ln.split(":", 1)[1] or ln.lstrip().startswith("#") for ln in matches), path


@pytest.mark.parametrize("data, key, fragment", [
    ({"mqtt": {"port": 70000}}, "mqtt.port", "less than or equal to 65535"),
    ({"mqtt": {"port": "eighty"}}, "mqtt.port", "valid integer"),
    ({"mqtt": {"prot": "v5"}}, "mqtt.prot", "unknown key"),
    ({"mqtt": {"protocol": "v4"}}, "mqtt.protocol", "'v5' or 'v311'"),
    ({"mqtt": {"prefix": "a/#"}}, "mqtt.prefix", "pattern"),
    ({"mqtt": {"host": "mqtt://192.168.1.5:1883"}}, "mqtt.host", "or an IP address, without a scheme"),
    ({"mqtt": {"host": "192.168.1.5:1883"}}, "mqtt.host", "without a scheme or :port (the port is mqtt.port)"),
    # a label over 63 characters passed, then killed paho's network thread (idna) for good
    ({"mqtt": {"host": "a" * 64 + ".lan"}}, "mqtt.host", "expected a host name (labels of at most 63 characters)"),
    # the resolver looked these up as names, and failed at every retry for ever
    ({"mqtt": {"host": "192.168.1.300"}}, "mqtt.host", "bad value '192.168.1.300'; expected an IPv4 address (four "
     "numbers 0..255, e.g. 192.168.1.5) or a host name (not digits and dots only)"),
    ({"mqtt": {"host": "999.1.1.1"}}, "mqtt.host", "expected an IPv4 address (four numbers 0..255"),
    ({"web": {"listen": "192.168.1.300:8080"}}, "web.listen", "bad value '192.168.1.300:8080'; expected host:port with "
     "an IPv4 address (four numbers 0..255"),
    ({"mqtt": {"password_file": ""}}, "mqtt.password_file", "bad value ''; expected a file path"),  # was '.'
    ({"web": {"password_file": ""}}, "web.password_file", "bad value ''; expected a file path"),
    ({"mqtt": {"discovery_prefix": "home assistant"}}, "mqtt.discovery_prefix", "pattern"),
    ({"mqtt": {"password_file": "/no/such/file"}}, "mqtt.password_file", "expected an existing file"),
    ({"mqtt": {"tls": {"ca": "/no/such/ca.pem"}}}, "mqtt.tls.ca", "expected an existing file"),
    ({"mqtt": {"tls": {"cert": str(DEFAULT_CONFIG)}}}, "mqtt.tls", "cert given alone"),
    # it relaxes a TLS connection's check: alone it left TLS off and the guard connected unencrypted
    ({"mqtt": {"tls": {"insecure": True}}}, "mqtt.tls", "insecure is true but TLS is off; expected enabled: true"),
    ({"mqtt": {"reconnect_min_s": 60, "reconnect_max_s": 10}}, "mqtt", "expected reconnect_min_s <= reconnect_max_s"),
    ({"mqtt": {"state_interval_s": float("inf")}}, "mqtt.state_interval_s", "finite number"),
    ({"mqtt": {"outbox": {"max_events": 0}}}, "mqtt.outbox.max_events", "greater than or equal to 1"),
    ({"mqtt": {"outbox": {"max_age_s": -1}}}, "mqtt.outbox.max_age_s", "greater than 0"),
    ({"mqtt": {"username": ""}}, "mqtt.username", "bad value ''; expected a string of at least 1 character"),
    # MQTT strings end at 65,535 bytes: paho's network thread died on these, or a topic was refused
    ({"mqtt": {"username": "u" * 70_000}}, "mqtt.username", "expected a string of at most 256 characters"),
    ({"mqtt": {"prefix": "p" * 70_000}}, "mqtt.prefix", "at most 256 characters"),
    # MQTT forbids NUL in its strings: mosquitto closed the connection, and the guard blamed TLS, for ever
    ({"mqtt": {"username": "gu\x00ard"}}, "mqtt.username", "bad value 'gu\\x00ard'; expected text without control "
     "characters (such as NUL, tab or a line break) or unpaired surrogates, which MQTT brokers refuse"),
    ({"mqtt": {"username": "guard\n"}}, "mqtt.username", "expected text without control characters"),
    ({"mqtt": {"username": "gu\x7fard"}}, "mqtt.username", "expected text without control characters"),
    ({"mqtt": {"discovery_prefix": "d" * 70_000}}, "mqtt.discovery_prefix", "at most 256 characters"),
    ({"mqtt": "yes"}, "mqtt", "a mapping of keys"),
    ({"mqtt": {"tls": ["ca"]}}, "mqtt.tls", "a mapping of keys"),
    ({"device": {"id": "Living Room"}}, "device.id", "pattern"),
    ({"source": {"kind": "webcam"}}, "source.kind", "'synthetic', 'opencv', 'folder' or 'picamera2'"),
    # a camera set as uri alone, under the shipped kind synthetic, ran the fake scene in the real state_dir
    ({"source": {"uri": "/dev/video0"}}, "source", "source.uri '/dev/video0' given with source.kind 'synthetic', "
     "which reads no uri; expected source.kind opencv"),
    ({"source": {"fps": 0}}, "source.fps", "greater than or equal to 0.01"),
    ({"source": {"fps": 1e-300}}, "source.fps", "greater than or equal to 0.01"),
    ({"latency": {"path": 12}}, "latency.path", "bad value 12; expected a file path (a string)"),
    # YAML is not read by a shell: the guard made a folder named $HOME in its working folder
    ({"state_dir": "$HOME/trk"}, "state_dir", "bad value '$HOME/trk' contains '$': variables are not expanded; "
     "expected the path written out (~ for a home folder is expanded)"),
    ({"mqtt": {"password_file": "${CREDENTIALS_DIRECTORY}/pw"}}, "mqtt.password_file", "contains '$'"),
    ({"latency": {"report_every_s": 1e300}}, "latency.report_every_s", "less than or equal to 86400"),
    # a report line every frame, and an overflow when the live view started
    ({"latency": {"report_every_s": 1e-300}}, "latency.report_every_s", "greater than or equal to 1"),
    ({"web": {"stream_fps": 1e-300}}, "web.stream_fps", "greater than or equal to 0.1"),
    ({"batcher": {"max_batch": 1000}}, "batcher.max_batch", "less than or equal to 256"),
    # Haar's pyramid of a step just over 1 took 16.9 GB and minutes a frame
    ({"detect": {"scale_factor": 1.0000000000000002}}, "detect.scale_factor", "greater than or equal to 1.05"),
    ({"sinks": {"console": "maybe"}}, "sinks.console", "valid boolean"),
    # numbers were strict, booleans lax: "no", "off", 0 and 1.0 were taken
    ({"web": {"enabled": "no"}}, "web.enabled", "bad value 'no'; expected a valid boolean (true or false, unquoted)"),
    ({"mqtt": {"tls": {"insecure": "off"}}}, "mqtt.tls.insecure", "expected a valid boolean"),
    ({"motion": {"enabled": 0}}, "motion.enabled", "bad value 0; expected a valid boolean"),
    ({"source": {"realtime": 1.0}}, "source.realtime", "bad value 1.0; expected a valid boolean"),
    ({"sinks": {"jsonl_max_bytes": 999}}, "sinks.jsonl_max_bytes", "greater than or equal to 10000"),
    ({"sinks": {"jsonl_backups": 101}}, "sinks.jsonl_backups", "less than or equal to 100"),
    # logs that never rotate, an outbox without a bound
    ({"sinks": {"jsonl_max_bytes": 10**29}}, "sinks.jsonl_max_bytes", "less than or equal to 1000000000"),
    ({"latency": {"max_bytes": 10**29}}, "latency.max_bytes", "less than or equal to 1000000000"),
    ({"mqtt": {"outbox": {"max_events": 10**29}}}, "mqtt.outbox.max_events", "less than or equal to 100000"),
    ({"colour": "blue"}, "colour", "unknown key"),
])
def test_bad_values_are_one_line_naming_key_value_and_expectation(data, key, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    message = str(err.value)
    assert "\n" not in message
    assert f"'{key}'" in message and fragment in message, message
    assert len(message) < 400


def test_host_names_and_ip_addresses_are_taken():
    config = parse_config({"mqtt": {"host": "192.168.1.5"}, "web": {"listen": "0.0.0.0:8080"}})
    assert config.mqtt.host == "192.168.1.5" and config.web.listen == "0.0.0.0:8080"
    assert parse_config({"mqtt": {"host": "3com.lan"}, "web": {"listen": "localhost:80"}}).mqtt.host == "3com.lan"


def test_yamls_own_booleans_are_booleans():
    """YAML 1.1 (PyYAML) reads yes/no and on/off unquoted as booleans: those stay accepted."""
    config = parse_config(yaml.safe_load("web: {enabled: off}\nmotion: {enabled: no}\nmqtt: {enabled: yes}\n"))
    assert (config.web.enabled, config.motion.enabled, config.mqtt.enabled) == (False, False, True)


def test_a_rule_across_sections_names_its_keys_without_a_key_prefix():
    """It read "key '(top level)': detect.detect_width 4096 makes ..."."""
    with pytest.raises(ConfigError) as err:
        parse_config({"detect": {"detect_width": 4096}})
    assert str(err.value).startswith("config: detect.detect_width 4096 makes the 640x480 frame 12.6 megapixels"), err.value


def test_a_camera_device_index_may_be_written_unquoted():
    """The YAML's comment says "device index": `uri: 0` was refused as "expected a valid string"."""
    assert parse_config(yaml.safe_load("source: {kind: opencv, uri: 0}")).source.uri == "0"


def test_a_section_left_empty_takes_its_defaults():
    """Every key of a section commented out leaves it None to YAML: it was refused as "expected a mapping"."""
    document = "device:\n  # id: hall\nmqtt:\n  tls:\n    # ca: /etc/ssl/broker-ca.pem\n"  # (device and mqtt.tls)
    assert parse_config(yaml.safe_load(document)) == Config()


def test_long_bad_values_are_shortened():
    with pytest.raises(ConfigError) as err:
        parse_config({"device": {"name": "x" * 5000}})
    assert len(str(err.value)) < 300 and "..." in str(err.value)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracker", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.parametrize("content, fragment", [
    ("mqtt:\n  port: 99999\n", "config: key 'mqtt.port': bad value 99999; expected"),
    ("mqtt: [\n", "not valid YAML at line"),
    # the parser's own cause was dropped: "not valid YAML at line 2, column 1" left the tab to be found
    ("motion:\n\tthreshold: 18\n", "not valid YAML at line 2, column 1 (found character '\\t' that cannot start any "
     "token); expected a mapping of sections"),
    ("device:\n  name: a\x07b\n", "not valid YAML (special characters are not allowed)"),
    ("- just\n- a list\n", "top level is list; expected a mapping of sections"),
    ("mqtt:\n  enabled: true\n  tls:\n    key: /etc/hostname\n", "key given alone"),
    ("mqtt:\n  enabled: true\n  tls:\n    insecure: true\n", "key 'mqtt.tls': insecure is true but TLS is off"),
    # PyYAML reads 1e3 and 1.0e3 as strings: "expected a valid number" left the user puzzled
    ("source:\n  fps: 1e3\n", "bad value '1e3'; expected a valid number (YAML reads a number like 1e3 as text; write it with a dot "
     "and a signed exponent, as 1.0e+3, or in full)"),
])
def test_check_config_exits_2_with_one_line(tmp_path, content, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = run_cli("--check-config", "--config", str(path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracker: error: ") and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_yaml_parsers_cause_is_shown_printable_and_bounded():
    from tracker.config import _printable

    shown = _printable("found \x1b[2J\n" + "x" * 500)  # a terminal's escape and a line break: one inert line
    assert shown.startswith("found \\x1b[2J\\n") and len(shown) == 120 and shown.endswith("...") and shown.isprintable()


def test_check_config_missing_file_and_good_file(tmp_path):
    missing = run_cli("--check-config", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    good = tmp_path / "good.yaml"
    good.write_text("device:\n  id: hall\nmqtt:\n  enabled: true\n  host: broker.lan\n")
    ok = run_cli("--check-config", "--config", str(good))
    assert ok.returncode == 0 and "config ok" in ok.stdout


# -- property: random YAML never gives a traceback -------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=20), st.sampled_from(["", "v5", "localhost", "/etc/hostname", "a\x00b", "x" * 300, "~", "yes"]),
)
keys = st.one_of(st.sampled_from(ALL_KEYS), st.text(max_size=12), st.integers(-5, 5), st.none(), st.booleans())
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)),
    max_leaves=25,
)
documents = st.one_of(
    st.dictionaries(st.sampled_from(ALL_KEYS), values, max_size=6),  # mostly real sections
    st.dictionaries(keys, values, max_size=4),
    values,
)

_tmp = Path(tempfile.mkdtemp(prefix="tracker-config-property-"))


def check_document(text: str) -> None:
    path = _tmp / "random.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        config = load_config(path)
    except ConfigError as err:
        message = str(err)
        assert message and "\n" not in message and "Traceback" not in message
    else:
        assert isinstance(config, Config)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_yaml_structures_give_a_config_or_a_config_error(document):
    check_document(yaml.safe_dump(document, allow_unicode=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list("abmqt: -[]{}#\n'\"&*!|>%@,0129.\t") + ["mqtt", "port", "  ", "tls:"]),
                max_size=40).map("".join))
def test_random_yaml_text_gives_a_config_or_a_config_error(text):
    check_document(text)


def test_a_home_folder_in_a_path_is_expanded(tmp_path, monkeypatch):
    """YAML is not read by a shell: '~/trk' made a folder named '~' in the working directory."""
    from tracker.config import parse_config

    monkeypatch.setenv("HOME", str(tmp_path))
    config = parse_config({"state_dir": "~/trk", "latency": {"path": "~/logs/latency.jsonl"}})
    assert config.resolved_state_dir() == tmp_path / "trk" and config.latency.path == tmp_path / "logs" / "latency.jsonl"

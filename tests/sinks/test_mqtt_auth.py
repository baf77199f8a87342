"""TLS and password authentication against brokers configured for them (certificates made by the
test with openssl): the right credentials deliver events; wrong ones give one clear error line while
the sink keeps retrying with back-off and never raises; a listener that never answers is named as such."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
from mosquitto import Broker, Subscriber, make_certs, make_event, sink_config

from tracker.config import parse_config
from tracker.errors import ConfigError
from tracker.sinks.mqtt import MqttSink

USERS = {"guard": "correct horse"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, certs):
    """TLS with a client certificate required, and a password file: both must be right."""
    with Broker(tmp_path_factory.mktemp("tls"), users=USERS, tls=certs, require_client_cert=True) as b:
        yield b


@pytest.fixture(scope="module")
def password_broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("pw"), users=USERS) as b:
        yield b


def password_file(tmp_path, text):
    path = tmp_path / "mqtt-password"
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def deliver_one(broker, sink, device):
    sub = Subscriber(broker, [f"tracker/{device}/events"])
    event = make_event()
    sink.publish_event(event, None)
    got = json.loads(sub.wait_for(lambda m: m)[0][1])
    sub.close()
    return got["id"] == event.id


def connection_errors(config, tmp_path, caplog):
    """The error lines of a sink that cannot connect with `config`, after a few attempts."""
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    sink = MqttSink(config.mqtt, config.device, tmp_path)
    try:
        wait_until(lambda: sink.failed_attempts >= 2)
        assert not sink.connected
    finally:
        sink.close()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_password_authentication(password_broker, tmp_path):
    config = sink_config(password_broker, "pw-ok", username="guard",
                         password_file=password_file(tmp_path, USERS["guard"]))
    sink = MqttSink(config.mqtt, config.device, tmp_path)
    try:
        assert deliver_one(password_broker, sink, "pw-ok")
    finally:
        sink.close()


def test_wrong_password_is_one_error_line_and_retries(password_broker, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    config = sink_config(password_broker, "pw-bad", username="guard", password_file=password_file(tmp_path, "nope"))
    sink = MqttSink(config.mqtt, config.device, tmp_path)
    try:
        sink.publish_event(make_event(), None)  # kept in the outbox, not lost
        wait_until(lambda: sink.failed_attempts >= 3)  # refused again and again, with back-off
        assert not sink.connected and len(sink.outbox) == 1
    finally:
        sink.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "refused the connection: " in errors[0]
    assert "Not authorized" in errors[0] or "Bad user name or password" in errors[0]  # mosquitto 2: the former
    assert "check mqtt.username and the password file" in errors[0]
    assert password_broker.log_text().count("not authorised") >= 3  # the broker saw the retries


def test_tls_with_client_certificate_and_password(tls_broker, certs, tmp_path):
    config = sink_config(tls_broker, "tls-ok", username="guard", password_file=password_file(tmp_path, "correct horse"),
                         tls={"ca": str(certs.ca), "cert": str(certs.client_cert), "key": str(certs.client_key)})
    sink = MqttSink(config.mqtt, config.device, tmp_path)
    try:
        assert deliver_one(tls_broker, sink, "tls-ok")
    finally:
        sink.close()


def test_tls_wrong_ca_is_one_error_line_and_retries(tls_broker, certs, tmp_path, caplog):
    config = sink_config(tls_broker, "tls-bad", username="guard", password_file=password_file(tmp_path, "correct horse"),
                         tls={"ca": str(certs.other_ca), "cert": str(certs.client_cert), "key": str(certs.client_key)})
    errors = connection_errors(config, tmp_path, caplog)
    assert len(errors) == 1, errors
    assert "TLS handshake with 127.0.0.1" in errors[0] and "CERTIFICATE_VERIFY_FAILED" in errors[0]


def test_tls_without_the_required_client_certificate(tls_broker, certs, tmp_path, caplog):
    config = sink_config(tls_broker, "tls-nocert", username="guard",
                         password_file=password_file(tmp_path, "correct horse"), tls={"ca": str(certs.ca)})
    errors = connection_errors(config, tmp_path, caplog)
    assert len(errors) == 1, errors
    assert "client certificate" in errors[0] or "TLS handshake" in errors[0]


def test_plain_mqtt_to_a_tls_port_suggests_tls_not_a_client_certificate(tls_broker, tmp_path, caplog):
    errors = connection_errors(sink_config(tls_broker, "plain-to-tls"), tmp_path, caplog)
    assert len(errors) == 1, errors
    assert "closed the connection before accepting it" in errors[0]
    assert f"mqtt.tls is off: if port {tls_broker.port} is the broker's TLS listener" in errors[0]
    assert "client certificate" not in errors[0]


def test_a_listener_that_never_answers_connect_is_not_blamed_on_the_broker_or_tls(tmp_path, caplog):
    """paho gives up waiting for the CONNACK after keepalive_s: that was logged as the broker closing
    the connection before accepting it, with a hint to turn TLS on."""
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    with socket.socket() as silent:  # accepts TCP (the kernel's backlog), never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        config = parse_config({"device": {"id": "silent"},
                               "mqtt": {"enabled": True, "host": "127.0.0.1", "port": port, "keepalive_s": 5}})
        sink = MqttSink(config.mqtt, config.device, tmp_path)
        try:
            wait_until(lambda: sink.failed_attempts >= 1)
        finally:
            sink.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"mqtt: no answer to CONNECT from 127.0.0.1:{port} within 5 s (mqtt.keepalive_s): "
                                "check that it is an MQTT broker; "), errors
    assert "tls" not in errors[0].lower() and "closed the connection" not in errors[0]


def test_tls_to_a_plain_port_says_so_not_unreachable(password_broker, certs, tmp_path, caplog):
    config = sink_config(password_broker, "tls-to-plain", tls={"ca": str(certs.ca)})
    errors = connection_errors(config, tmp_path, caplog)
    assert len(errors) == 1, errors
    assert "closed the connection during the TLS handshake" in errors[0] and "unreachable" not in errors[0]
    assert f"check that port {password_broker.port} is the broker's TLS listener" in errors[0]


def test_unloadable_certificate_is_a_config_error(tls_broker, tmp_path):
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    config = sink_config(tls_broker, "tls-bogus", tls={"ca": str(bogus)})
    with pytest.raises(ConfigError, match="mqtt.tls.ca: cannot load"):
        MqttSink(config.mqtt, config.device, tmp_path)


def test_an_encrypted_client_key_is_one_line_not_a_passphrase_prompt(certs, tmp_path):
    """OpenSSL asks the controlling terminal for the passphrase of an encrypted key, and waits: on
    a terminal, `--check-config` (and the guard, and scripts/install-pi) hung there. Run on a
    pseudo-terminal of its own, it must answer at once."""
    key = tmp_path / "client-encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(certs.client_key), "-aes256", "-passout", "pass:secret", "-out",
                    str(key)], check=True, capture_output=True)
    config = tmp_path / "tracker.yaml"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "mqtt": {
        "enabled": True, "host": "127.0.0.1", "tls": {"ca": str(certs.ca), "cert": str(certs.client_cert),
                                                        "key": str(key)}}}))
    leader, follower = os.openpty()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TRACKER_CACHE_DIR": str(tmp_path / "cache")}
    try:  # setsid --ctty: a session of its own, whose controlling terminal is the pty on its stdin
        proc = subprocess.run(["setsid", "--ctty", sys.executable, "-m", "tracker", "--check-config", "--config",
                               str(config)], stdin=follower, capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"tracker: error: mqtt.tls.key: cannot load {str(key)!r}") and proc.stderr.count("\n") == 1
    assert "it may be encrypted (have a passphrase)" in proc.stderr


@pytest.mark.parametrize("cert, key, expected", [
    # "mqtt.tls.cert/key: cannot load ([X509: KEY_VALUES_MISMATCH] ...)" named neither file
    ("client_cert", "server_key", "mqtt.tls.key: '{key}' is not the private key of mqtt.tls.cert '{cert}' ([X509: "
     "KEY_VALUES_MISMATCH]"),
    ("client_key", "client_key", "mqtt.tls.cert: cannot load '{cert}' ([SSL] PEM lib"),
    ("client_cert", "client_cert", "mqtt.tls.key: cannot load '{key}' ([SSL] PEM lib"),
])
def test_a_client_certificate_or_key_that_cannot_be_loaded_is_named_with_its_path(certs, tmp_path, cert, key, expected):
    cert, key = getattr(certs, cert), getattr(certs, key)
    config = parse_config({"mqtt": {"enabled": True, "tls": {"cert": str(cert), "key": str(key)}}})
    with pytest.raises(ConfigError) as err:
        MqttSink(config.mqtt, config.device, tmp_path)
    assert str(err.value).startswith(expected.format(cert=cert, key=key)), err.value
    assert "\n" not in str(err.value)

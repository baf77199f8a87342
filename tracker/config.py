"""The guard's configuration: YAML validated once at start-up (docs/ARCHITECTURE.md, sections 6 and 7).

Every section is a pydantic model with `extra="forbid"`, so an unknown key is an error. A failure
becomes one `ConfigError` line naming the key path, the bad value and what was expected. Secrets
never live in the YAML: the MQTT password is read from `mqtt.password_file` (or from systemd's
credentials directory) by the MQTT sink.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import reprlib
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from tracker.detection_scale import MAX_DETECT_PIXELS, MIN_WINDOW_PX, asked_scale, detection_scale
from tracker.errors import ConfigError
from tracker.files import read_regular_file
from tracker.model.card import Embedding
from tracker.model.spec import EMBEDDING_BLOB, MODELS_DIR, ModelSpec

# The default config: the package's data/config, a link to config/ in a checkout, a copy in a wheel.
DEFAULT_CONFIG = Path(str(files("tracker") / "data" / "config" / "tracker.yaml")).resolve()
MAX_CONFIG_BYTES = 1 << 20  # a config is a few kB; a bigger file is a mistake or an attack
MAX_ALIASES = 32  # YAML aliases (*name) in one file: enough for hand-written reuse, too few for a bomb
MAX_DEPTH = 32  # nesting of mappings and lists: the schema is 3 deep
MAX_INT_CHARS = 64  # an integer's characters in YAML (digits, sign, underscores)
# A log rotates at this size at the latest (1e29 passed, and the logs never rotated): 1 GB, 100 times
# the default; with its rotated files kept, what an SD card can hold
MAX_LOG_BYTES = 1_000_000_000


def _existing_file(path: Path) -> Path:
    """A path that names an existing regular file (checked at load time, so --check-config sees it)."""
    try:
        ok = path.is_file()
        reason = "not found or not a regular file"
    except (OSError, ValueError) as err:  # too long, embedded NUL, no permission to look
        ok, reason = False, getattr(err, "strerror", None) or str(err)
    if not ok:
        raise ValueError(f"bad value {_short(str(path))}; expected an existing file ({reason})")
    return path


def _expanded(path: Path) -> Path:
    """~ and ~user as the shell would expand them (a YAML file is not read by a shell)."""
    try:
        return path.expanduser()
    except RuntimeError:  # no such user, or no home directory to expand ~ to
        raise ValueError(f"bad value {_short(str(path))}; expected ~ or ~user of a user with a home directory") from None


def _not_empty(value: object) -> object:
    """An empty string would become Path('.'), the working directory: refuse it, and a path no
    system call takes (a NUL in it, longer than Linux's PATH_MAX, a name longer than NAME_MAX), and
    one with a "$" (YAML is not read by a shell: `$HOME/trk` made a folder named $HOME in the
    working folder)."""
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"bad value {value!r}; expected a file path (or null for the default)")
    if isinstance(value, str) and "$" in value:
        raise ValueError(f"bad value {_short(value)} contains '$': variables are not expanded; expected the path "
                         "written out (~ for a home folder is expanded)")
    if isinstance(value, str) and ("\0" in value or len(value.encode("utf-8", "surrogateescape")) >= 4096
                                   or any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in value.split("/"))):
        raise ValueError(f"bad value {_short(value)}; expected a path without a NUL character, under 4096 bytes, "
                         "each name in it at most 255 bytes")
    return value


def _device_index_as_text(value: object) -> object:
    """A camera's number written unquoted (`uri: 0`, which YAML reads as an int) is the text "0" the
    source takes; other ints (negative, or past any device number) are left to be refused as such."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else value


FilePath = Annotated[Path, BeforeValidator(_not_empty), AfterValidator(_expanded)]
ExistingFile = Annotated[Path, BeforeValidator(_not_empty), AfterValidator(_expanded), AfterValidator(_existing_file)]


class Section(BaseModel):
    # inf/nan would pass range checks like gt=0 and then break timers and sleeps at run time. Numbers
    # are StrictInt / StrictFloat: pydantic would take YAML's true as 1 (an int also serves a float);
    # booleans StrictBool: it would take "no", "off", 0 and 1.0 (YAML's own true/false, yes/no and
    # on/off unquoted are booleans already).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _empty_when_none(cls, data: object) -> object:
        # a section whose keys are all commented out is None to YAML: all defaults, as keys left out are
        return {} if data is None else data


class DeviceConfig(Section):
    id: str = Field("tracker", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    name: str = Field("Tracker", min_length=1, max_length=64)


class SourceConfig(Section):
    kind: Literal["synthetic", "opencv", "folder", "picamera2"] = "synthetic"
    # opencv: device index, /dev/videoN, URL or file; folder: a directory; picamera2: the camera number
    uri: Annotated[str, BeforeValidator(_device_index_as_text)] = ""
    width: StrictInt = Field(640, ge=32, le=4096)
    height: StrictInt = Field(480, ge=32, le=4096)
    fps: StrictFloat = Field(10.0, ge=0.01, le=120)  # a frame in 100 s at least (1e-300 overflowed the pacing timer)
    frames: StrictInt | None = Field(None, ge=1)  # stop after this many frames captured, dropped ones too (None: until the source ends)
    queue_size: StrictInt = Field(4, ge=1, le=64)
    seed: StrictInt = Field(0, ge=0, le=2**63 - 1)  # synthetic scene (numpy seeds are non-negative)
    faces_dir: FilePath | None = None  # synthetic scene: <person>/<image> faces (default: the shared dlib chips)
    realtime: StrictBool = True  # synthetic scene: paced at fps like a camera (False: as fast as consumed)

    @model_validator(mode="after")
    def _uri_needs_a_kind_that_reads_it(self):
        # the shipped config starts with kind synthetic: a camera set as uri alone ran the fake scene
        # in the real state_dir, its fake people's events among the real ones
        if self.kind == "synthetic" and self.uri:
            raise ValueError(f"source.uri {_short(self.uri)} given with source.kind 'synthetic', which reads no uri; "
                             "expected source.kind opencv (a camera, stream or video file), folder or picamera2 "
                             "for it, or source.uri \"\" for the synthetic scene")
        return self


class MotionConfig(Section):
    enabled: StrictBool = True
    downscale_width: StrictInt = Field(160, ge=16, le=1024)
    threshold: StrictInt = Field(18, ge=1, le=255)
    min_area_fraction: StrictFloat = Field(0.002, ge=0.0, le=1.0)


class DetectConfig(Section):
    detector: Literal["auto", "yunet", "blazeface", "haar"] = "auto"
    model: ExistingFile | None = None  # yunet / blazeface: the model file (default: the search path)
    detect_width: StrictInt = Field(320, ge=64, le=4096)
    score_threshold: StrictFloat | None = Field(None, gt=0.0, lt=1.0)  # yunet / blazeface; None: the detector's own
    regions: StrictBool = True  # search only where something moved and around live tracks
    # haar: the image pyramid's step. Its levels, and OpenCV's buffers for them, grow as 1/(step - 1):
    # on a 2-megapixel frame 1.05 takes about 0.3 GB and 8 s, 1.01 1.1 GB and 28 s, and 1 + 2e-16 17 GB
    scale_factor: StrictFloat = Field(1.1, ge=1.05, le=2.0)
    min_neighbors: StrictInt = Field(5, ge=0, le=50)  # haar
    min_face_px: StrictInt = Field(24, ge=8, le=1024)  # haar

    @model_validator(mode="after")
    def _model_needs_a_cnn_detector(self):
        if self.model is not None and self.detector not in ("yunet", "blazeface"):
            raise ValueError(f"model given for detector {self.detector!r}; expected detector yunet or blazeface "
                             "(haar uses the cascade inside OpenCV, auto searches for the model files)")
        return self

    @model_validator(mode="after")
    def _score_threshold_needs_a_cnn_detector(self):
        # Haar's scores are neighbour counts, which it filters by min_neighbors: a threshold was ignored in silence
        if self.score_threshold is not None and self.detector == "haar":
            raise ValueError(f"score_threshold {self.score_threshold:g} given for detector 'haar', which has no face "
                             "scores to compare it with; expected detector yunet or blazeface with it, or "
                             "score_threshold null (haar: min_neighbors)")
        return self


class ModelConfig(Section):
    prototxt: FilePath = MODELS_DIR / "face_cnn.prototxt"
    weights: FilePath = MODELS_DIR / "face_cnn.caffemodel"
    probs: str = "prob"
    embedding: str = EMBEDDING_BLOB

    def spec(self) -> ModelSpec:
        """The model these keys name, as the backends take it."""
        return ModelSpec(self.prototxt, self.weights, self.probs, self.embedding)


class BackendConfig(Section):
    name: str = "caffe-openblas-dl"
    precision: Literal["fp32", "int8"] = "fp32"
    threads: StrictInt | None = Field(None, ge=1, le=64)
    worker: StrictBool = False


class BatcherConfig(Section):
    max_batch: StrictInt = Field(8, ge=1, le=256)
    max_wait_ms: StrictFloat = Field(30.0, ge=0.0, le=5000.0)


class IdentityConfig(Section):
    # cosine at or above which a face is an enrolled person; None: the model card's (tracker.identity)
    threshold: StrictFloat | None = Field(None, ge=-1.0, le=1.0)
    # how a face becomes its embedding (tracker.backends.mirror); None: as the model card says
    embedding: Embedding | None = None
    min_faces: StrictInt = Field(3, ge=1, le=1000)  # faces a track needs before its identity is said
    margin: StrictFloat = Field(0.2, ge=0.0, le=1.0)  # the winner's lead over the runner-up, share of all votes


class TrackingConfig(Section):
    min_hits: StrictInt = Field(3, ge=1, le=100)
    max_age: StrictInt = Field(10, ge=1, le=1000)
    iou_threshold: StrictFloat = Field(0.3, ge=0.0, le=1.0)
    embedding_weight: StrictFloat = Field(0.3, ge=0.0, le=1.0)
    # detections scoring below this only continue tracks (ByteTrack); None: all are high-score
    high_score: StrictFloat | None = Field(None, ge=0.0)
    observation_centric: StrictBool = False  # OC-SORT: recover by the last observed box, re-update after a gap
    reid: StrictBool = True  # a face lost and found again within reid_window_s keeps its track (trained weights only)
    reid_threshold: StrictFloat | None = Field(None, ge=-1.0, le=1.0)  # None: the weights' card threshold
    reid_window_s: StrictFloat = Field(10.0, ge=0.0, le=3600.0)


class LatencyConfig(Section):
    path: FilePath | None = None  # default: <state_dir>/latency.jsonl
    max_bytes: StrictInt = Field(10_000_000, ge=10_000, le=MAX_LOG_BYTES)
    backups: StrictInt = Field(3, ge=0, le=100)
    # a day at most (1e300 overflowed the timer); a second at least (1e-300 logged a report every frame)
    report_every_s: StrictFloat = Field(10.0, ge=1.0, le=86_400)

    def log_path(self, state_dir: Path) -> Path:
        """The latency log: `path`, or latency.jsonl in the guard's `state_dir` (its demo's for --demo)."""
        return self.path or Path(state_dir) / "latency.jsonl"


class SinksConfig(Section):
    console: StrictBool = True
    jsonl: FilePath | None = None  # default: <state_dir>/events.jsonl
    jsonl_max_bytes: StrictInt = Field(10_000_000, ge=10_000, le=MAX_LOG_BYTES)
    jsonl_backups: StrictInt = Field(3, ge=0, le=100)

    def events_path(self, state_dir: Path) -> Path:
        """The events log: `jsonl`, or events.jsonl in the guard's `state_dir` (its demo's for --demo)."""
        return self.jsonl or Path(state_dir) / "events.jsonl"


class TLSConfig(Section):
    enabled: StrictBool = False  # also on when ca or cert is set; with no ca, the system's CAs verify the broker
    ca: ExistingFile | None = None  # PEM CA bundle that signed the broker's certificate
    cert: ExistingFile | None = None  # PEM client certificate (needs key)
    key: ExistingFile | None = None  # PEM private key of the client certificate (needs cert)
    insecure: StrictBool = False  # skip the broker host-name check (never in production); needs TLS on

    @model_validator(mode="after")
    def _cert_and_key_together(self):
        if (self.cert is None) != (self.key is None):
            given = "cert" if self.key is None else "key"
            raise ValueError(f"{given} given alone; expected both cert and key (a client certificate and its private key)")
        return self

    @model_validator(mode="after")
    def _insecure_only_with_tls(self):
        # it only relaxes the check of a TLS broker: alone it left the connection unencrypted, in silence
        if self.insecure and not self.active:
            raise ValueError("insecure is true but TLS is off; expected enabled: true (or ca, or cert and key) "
                             "with it: insecure only skips the broker host-name check of a TLS connection")
        return self

    @property
    def active(self) -> bool:
        return self.enabled or self.ca is not None or self.cert is not None


class OutboxConfig(Section):
    path: FilePath | None = None  # default: <state_dir>/outbox.sqlite3
    # events of about 330 bytes: 100,000 is some 50 MB, also in memory (an outbox the disk refused)
    max_events: StrictInt = Field(10_000, ge=1, le=100_000)
    max_age_s: StrictFloat = Field(7 * 24 * 3600, gt=0, le=366 * 24 * 3600)

    def file_path(self, state_dir: Path) -> Path:
        """The outbox's file: `path`, or outbox.sqlite3 in the guard's `state_dir` (its demo's for --demo)."""
        return self.path or Path(state_dir) / "outbox.sqlite3"


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?")
_DIGIT_LABELS = re.compile(r"[0-9]+(\.[0-9]+)*\.?")
_IPV4_OR_NAME = "an IPv4 address (four numbers 0..255, e.g. 192.168.1.5) or a host name (not digits and dots only)"


def _digits_but_no_ipv4(host: str) -> bool:
    """Whether `host`'s labels are all digits but it is no IPv4 address (192.168.1.300, 999.1.1.1):
    the resolver then looks it up as a name, which fails at every retry, for ever, not at start."""
    if not _DIGIT_LABELS.fullmatch(host):
        return False
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return True
    return False


def _broker_host(value: str) -> str:
    """A host name or an IP address (IPv6 without brackets), as the socket layer takes it: not a
    URL nor host:port, which would only fail at connect time, as a warning, for ever."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if _digits_but_no_ipv4(value):
            raise ValueError(f"bad value {_short(value)}; expected {_IPV4_OR_NAME}") from None
        try:
            value.encode("idna")  # what the socket layer does first: a label over 63 characters killed paho's thread
            named = bool(_HOST_NAME.fullmatch(value))
        except UnicodeError:
            named = False
        if not named:
            raise ValueError(f"bad value {_short(value)}; expected a host name (labels of at most 63 characters) or an "
                             "IP address, without a scheme or :port (the port is mqtt.port)") from None
    return value


MQTT_NAME_MAX = 256  # characters of mqtt.prefix, username and discovery_prefix (see MQTTConfig)
# What MQTT's strings must not hold (NUL) or should not (the other controls, C0, DEL and C1), and
# what UTF-8 cannot encode (an unpaired surrogate): mosquitto closes the connection ("protocol
# error"), which the guard could only retry for ever
_NOT_IN_MQTT_STRINGS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _mqtt_string(value: str) -> str:
    """`value`, a string the client sends the broker (mqtt.username), unless it holds what
    _NOT_IN_MQTT_STRINGS matches (ValueError)."""
    if _NOT_IN_MQTT_STRINGS.search(value):
        raise ValueError(f"bad value {_short(value)}; expected text without control characters (such as NUL, "
                         "tab or a line break) or unpaired surrogates, which MQTT brokers refuse")
    return value


_TOPIC_LEVELS = r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$"  # a topic's first levels: no wildcard, no empty level


class MQTTConfig(Section):
    enabled: StrictBool = False
    host: Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_broker_host)] = "localhost"
    port: StrictInt = Field(1883, ge=1, le=65535)
    protocol: Literal["v5", "v311"] = "v5"  # v5: PUBACK reason codes, session take-over reason
    # (lengths: MQTT's strings hold at most 65,535 bytes, past which paho's network thread dies; a topic
    # is a prefix and a few words, a client id the prefix and the device id)
    prefix: str = Field("tracker", max_length=MQTT_NAME_MAX, pattern=_TOPIC_LEVELS)
    username: Annotated[str, Field(min_length=1, max_length=MQTT_NAME_MAX), AfterValidator(_mqtt_string)] | None = None
    password_file: ExistingFile | None = None  # default: $CREDENTIALS_DIRECTORY/mqtt-password if it exists
    tls: TLSConfig = TLSConfig()
    keepalive_s: StrictInt = Field(30, ge=5, le=3600)
    reconnect_min_s: StrictInt = Field(1, ge=1, le=3600)
    reconnect_max_s: StrictInt = Field(120, ge=1, le=3600)
    max_inflight: StrictInt = Field(20, ge=1, le=1000)  # events handed to paho and not yet acknowledged
    flush_timeout_s: StrictFloat = Field(2.0, ge=0.0, le=3.0)  # on close: wait this long for PUBACKs
    state_interval_s: StrictFloat = Field(30.0, ge=1.0, le=24 * 3600)
    outbox: OutboxConfig = OutboxConfig()
    discovery: StrictBool = True
    discovery_prefix: str = Field("homeassistant", max_length=MQTT_NAME_MAX, pattern=_TOPIC_LEVELS)

    @model_validator(mode="after")
    def _delays_ordered(self):
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError(
                f"reconnect_max_s {self.reconnect_max_s} is below reconnect_min_s {self.reconnect_min_s}; "
                "expected reconnect_min_s <= reconnect_max_s"
            )
        return self


def _listen_address(value: str) -> str:
    """host:port, [IPv6]:port; the port 1..65535 (0 would pick a random one nobody could find)."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        host.encode("idna")  # what the server's bind does first: a label over 63 characters fails here
    except UnicodeError:
        host = ""
    if not sep or not host or not port.isdecimal() or not 1 <= int(port) <= 65535 or any(c in host for c in "/ []"):
        raise ValueError(f"bad value {_short(value)}; expected host:port, e.g. 127.0.0.1:8080, 0.0.0.0:8080 or [::1]:8080")
    if _digits_but_no_ipv4(host):
        raise ValueError(f"bad value {_short(value)}; expected host:port with {_IPV4_OR_NAME}")
    return value


class WebConfig(Section):
    enabled: StrictBool = True
    listen: Annotated[str, AfterValidator(_listen_address)] = "127.0.0.1:8080"
    password_file: ExistingFile | None = None  # default: $CREDENTIALS_DIRECTORY/web-password if it exists
    session_hours: StrictFloat = Field(12.0, gt=0, le=24 * 31)
    max_viewers: StrictInt = Field(3, ge=1, le=16)
    stream_fps: StrictFloat = Field(5.0, ge=0.1, le=30)  # a frame in 10 s at least (1e-300 overflowed the live view)
    stream_width: StrictInt = Field(640, ge=160, le=1920)
    max_upload_mb: StrictFloat = Field(8.0, gt=0, le=64)

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class Config(Section):
    device: DeviceConfig = DeviceConfig()
    state_dir: FilePath | None = None  # default: $STATE_DIRECTORY (systemd) or ~/.local/state/tracker
    source: SourceConfig = SourceConfig()
    motion: MotionConfig = MotionConfig()
    detect: DetectConfig = DetectConfig()
    model: ModelConfig = ModelConfig()
    backend: BackendConfig = BackendConfig()
    batcher: BatcherConfig = BatcherConfig()
    identity: IdentityConfig = IdentityConfig()
    tracking: TrackingConfig = TrackingConfig()
    latency: LatencyConfig = LatencyConfig()
    sinks: SinksConfig = SinksConfig()
    mqtt: MQTTConfig = MQTTConfig()
    web: WebConfig = WebConfig()

    @model_validator(mode="after")
    def _frame_fits_the_detector(self):
        # The camera's frames at detection scale (tracker.detection_scale): within its bound of
        # pixels, each side at least the CNN detectors' minimum; and Haar's smallest face in them.
        width, height, detect = self.source.width, self.source.height, self.detect
        frame = f"the {width}x{height} frame"
        k = detection_scale(width, height, detect.detect_width)
        asked = asked_scale(width, height, detect.detect_width)
        if asked > k * 1.001:  # (rounding aside) the bound of detection pixels would cut it
            widest = int(detect.detect_width * k / asked)
            raise ValueError(f"detect.detect_width {detect.detect_width} makes {frame} "
                             f"{width * height * asked ** 2 / 1e6:.1f} megapixels to search; expected at most "
                             f"{MAX_DETECT_PIXELS / 1e6:.1f} (a detect_width of at most {widest})")
        if detect.detector != "haar" and min(width * k, height * k) < MIN_WINDOW_PX:
            raise ValueError(f"detect.detect_width {detect.detect_width} makes {frame} {width * k:.0f}x{height * k:.0f} "
                             f"detection pixels; expected at least {MIN_WINDOW_PX} on each side for the yunet/blazeface "
                             "detectors (raise detect_width)")
        if detect.detector == "haar" and detect.min_face_px > min(width, height):
            raise ValueError(f"detect.min_face_px {detect.min_face_px} is larger than {frame}'s shorter side; expected "
                             f"at most {min(width, height)} (no face could be found)")
        return self

    def resolved_state_dir(self) -> Path:
        """The directory for enrolments, snapshots, logs, the outbox and benchmark profiles."""
        if self.state_dir is not None:
            return self.state_dir
        if os.environ.get("STATE_DIRECTORY"):  # set by systemd's StateDirectory=
            return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
        return Path.home() / ".local" / "state" / "tracker"


_REPR = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 2, 3, 3, 3, 3
_REPR.maxstring = _REPR.maxother = 60


def _short(value: object, limit: int = 80) -> str:
    """A bounded repr: never walks more than a few items of a value, however big or deep."""
    return _clipped(_REPR.repr(value), limit)


def _clipped(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, "..." marking the cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _printable(text: str, limit: int = 120) -> str:
    """`text` bounded and on one line, a character that is not printable written as its escape."""
    return _clipped("".join(c if c.isprintable() else ascii(c)[1:-1] for c in text), limit)


def _number_read_as_text(value: object) -> bool:
    """Whether `value` is a number with an exponent that PyYAML read as a string: YAML 1.1 takes an
    exponent only after a dot and with a sign (1.0e+3), so 1e3 and 1.0e3 stay text."""
    if not isinstance(value, str) or "e" not in value.lower():
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _describe(error) -> str:
    """One line for pydantic's first error (an ErrorDetails: loc, type, input, ctx, msg)."""
    path = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"config: unknown key {path!r} (value {_short(error['input'])}); remove it or check its spelling"
    if kind == "value_error":  # our own validators word the whole message (bad value and expectation)
        where = f"key {path!r}: " if error["loc"] else ""  # Config's own validator names its keys itself
        return f"config: {where}{error['ctx']['error']}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"config: key {path!r}: bad value {_short(error['input'])}; expected a mapping of keys (a YAML section)"
    if kind == "path_type":  # pydantic's own words name a Python class
        return f"config: key {path!r}: bad value {_short(error['input'])}; expected a file path (a string)"
    if kind == "invalid_key":  # YAML 1.1 reads on/off/yes/no as booleans, digits as numbers
        section = ".".join(str(p) for p in error["loc"][:-1]) or "(top level)"
        return (f"config: section {section!r}: key {_short(error['input'])} is not a name (YAML reads on, off, yes and "
                "no as booleans, and digits as numbers); expected a key name, quoted if it is one of those")
    message = error["msg"]  # pydantic's "Input should be a valid integer": "a valid integer"
    for prefix, instead in (("Input should be ", ""), ("String should match ", "a string matching "),
                            ("String should have ", "a string of ")):
        if message.startswith(prefix):
            message = instead + message[len(prefix):]
            break
    if kind == "bool_type":
        message += " (true or false, unquoted)"
    if kind == "float_type" and _number_read_as_text(error["input"]):
        message += " (YAML reads a number like 1e3 as text; write it with a dot and a signed exponent, as 1.0e+3, or in full)"
    # lower-case its first letter only: the rest may quote a pattern or a type
    return f"config: key {path!r}: bad value {_short(error['input'])}; expected {message[:1].lower()}{message[1:]}"


def parse_config(data: object, origin: str = "config") -> Config:
    """Validate a parsed YAML document; ConfigError names the first bad key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: top level is {type(data).__name__}; expected a mapping of sections")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err.errors()[0])) from None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses more than MAX_ALIASES aliases (a "billion laughs" file expands a few
    hundred bytes into gigabytes), nesting deeper than MAX_DEPTH (PyYAML recurses per level), and a
    key written twice in one mapping (PyYAML keeps the last in silence: an edit that appends a key
    already set above would change nothing)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise ConfigError(f"more than {MAX_ALIASES} YAML aliases (line {mark.line + 1}); expected a plain "
                                  "config (aliases can expand a small file into gigabytes)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigError(f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1}); expected "
                                  "sections of keys")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        lines: dict[str, int] = {}
        for key_node, _ in node.value:  # before merges ("<<") are applied: a merged key may be overridden
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                line = key_node.start_mark.line + 1
                if key_node.value in lines:
                    raise ConfigError(f"key {key_node.value!r} twice in one section (lines {lines[key_node.value]} and "
                                      f"{line}); expected each key once")
                lines[key_node.value] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        # Python reads no integer of more than 4,300 digits from text (a ValueError's traceback);
        # the config's largest numbers have ten
        if len(node.value) > MAX_INT_CHARS:
            raise ConfigError(f"a number of {len(node.value)} characters (line {node.start_mark.line + 1}); "
                              f"expected at most {MAX_INT_CHARS}")
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_config(path: Path | None = None) -> Config:
    """Read and validate the YAML file at `path` (default: DEFAULT_CONFIG, the package's own): at most
    MAX_CONFIG_BYTES of UTF-8 text, bounded aliases and depth; ConfigError (exit 2) otherwise."""
    path = path or DEFAULT_CONFIG
    where = f"config file {str(path)!r}"
    try:
        raw = read_regular_file(path, MAX_CONFIG_BYTES)  # (a FIFO hung the guard here)
    except OSError as err:
        if err.errno == errno.EFBIG:
            raise ConfigError(f"{where}: larger than {MAX_CONFIG_BYTES} bytes; expected a YAML config of a few kB") from None
        raise ConfigError(f"{where}: cannot read ({err.strerror or err}); expected a readable YAML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: not UTF-8 text (byte {raw[err.start]:#04x} at offset {err.start}); "
                          "expected a UTF-8 YAML file") from None
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or getattr(err, "reason", None)  # (reason: the reader's)
        cause = f" ({_printable(problem)})" if problem else ""
        raise ConfigError(f"{where}: not valid YAML{at}{cause}; expected a mapping of sections") from None
    return parse_config(data, where)

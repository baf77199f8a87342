"""The guard's stages, built once from a config: `build_stages(config, ...)` -> `Stages`.

Every stage of docs/ARCHITECTURE.md, section 3, except the loop that drives them
(`tracker.pipeline.Guard`, which takes a `Stages` and closes it when its run ends). Building them
here, apart from the loop, means a run is set up in one place, in one order, with everything it
opened closed again if a later stage fails; and a test can hand the guard stages of its own.

Order matters: the backend and the detector come before the gallery, because people enrolled
under other weights are recomputed with them (`tracker.enroll.refresh`) before the gallery loads.
"""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.backends import create_backend, run_options
from tracker.backends.base import Backend
from tracker.backends.mirror import embedder
from tracker.backends.worker import RestartingBackend, Stop
from tracker.batcher import Batcher
from tracker.config import Config
from tracker.crops import CROP_ALIGNED, CROP_BOX, crop_definition
from tracker.detect import FaceDetector, create_detector
from tracker.enroll import enroll, refresh
from tracker.errors import TrackerError
from tracker.events import EventMaker
from tracker.identity import (
    Gallery,
    IdentityVotes,
    PeopleStamp,
    chosen_embedding,
    embeddings_key,
    identity_threshold,
    people_stamp,
    weights_card,
)
from tracker.latency import LatencyLog
from tracker.model.card import thresholds, thresholds_blob
from tracker.motion import MotionGate
from tracker.preflight import embedding_width, guard_model, lock_state_dir, prepare_state_dir
from tracker.sinks import Sink
from tracker.sinks.console import ConsoleSink
from tracker.sinks.jsonl import JsonlSink
from tracker.snapshots import SnapshotStore, snapshots_folder
from tracker.sources import Source, make_source
from tracker.tracking import Tracker

if TYPE_CHECKING:
    from tracker.web.server import WebServer

log = logging.getLogger(__name__)


@dataclass
class Stages:
    """One run's stages (see the module docstring). `close()` runs `opened`'s callbacks, which
    release, in reverse order of opening, what the stages hold open: the state_dir's lock
    (`preflight.lock_state_dir`), the backend (a worker child), the sinks (MQTT connection, files,
    the web page's server) and the latency log; it is idempotent."""

    state_dir: Path
    source: Source  # opened by the guard's capture thread, which also closes it
    gate: MotionGate
    detector: FaceDetector
    batcher: Batcher
    backend: Backend  # the RestartingBackend, or the embedding's wrapper of it (tracker.backends.mirror)
    gallery: Gallery
    votes: IdentityVotes
    tracker: Tracker
    events: EventMaker
    snapshots: SnapshotStore
    sinks: list[Sink]
    latency_log: LatencyLog
    embedding_width: int  # tracker.preflight.embedding_width: the gallery holds the people of means this wide
    embeddings_key: str = ""  # tracker.identity.embeddings_key: the gallery holds the people enrolled with it
    people_stamp: PeopleStamp | None = None  # tracker.identity.people_stamp when the gallery was loaded
    web: WebServer | None = None  # the web page, also one of `sinks`; None when off or not listening
    # What restarts the backend after a failure (the one `backend` is or wraps): its `interrupt` ends
    # a call that waits on a hung worker, and its restarts (the guard is stopping); its `restarts` are
    # in the guard's state. None: a backend of a test's own, never restarted.
    restarting: RestartingBackend | None = None
    opened: ExitStack = field(default_factory=ExitStack, repr=False)

    def close(self) -> None:
        self.opened.close()

    def reload_people(self) -> None:
        """Take the people enrolled or forgotten while running (the web page's changes, a `tracker
        enroll` beside the guard) into the gallery, under the same threshold and crop definition; if
        they cannot be read (the people folder made unreadable meanwhile), the guard goes on with
        the gallery it has, and says so."""
        self.people_stamp = people_stamp(self.state_dir)  # before: a change during the load is seen next time
        try:
            self.gallery = Gallery.load(self.state_dir, self.embeddings_key, self.gallery.threshold,
                                        crop_definition(self.detector.gives_landmarks), self.embedding_width)
        except TrackerError as err:
            log.error("people: cannot reload them (%s); the guard goes on with the %d it knows", err,
                      len(self.gallery.names))

    def reload_people_if_changed(self) -> None:
        """`reload_people` if the people changed since (`people_stamp`: a listing and a stat per
        person, called every second)."""
        if people_stamp(self.state_dir) != self.people_stamp:
            self.reload_people()


def reid_threshold(config: Config, card: dict | None) -> float | None:
    """The face similarity at which the tracker takes a new track for a lost one back (None: off):
    `tracking.reid_threshold` if set, else the one the weights' card was calibrated with (0.1%
    false accepts between different people: a false merge would swallow a stranger's `entered`).
    Weights without one (untrained, e.g. the seeded random ones of tests) give embeddings on
    which any two faces look alike, so re-identification stays off for them, and the log says so;
    so it does, said likewise, when `model.embedding` is not the blob the card's threshold is a
    cosine of (`tracker.model.card.thresholds_blob`)."""
    if not config.tracking.reid:
        return None
    if config.tracking.reid_threshold is not None:
        return float(config.tracking.reid_threshold)
    if card is not None and config.model.embedding != thresholds_blob(card):  # cosines of another blob
        log.warning("tracking: re-identification by face is off: the model card's threshold is for %s embeddings, "
                    "model.embedding is %s; set tracking.reid_threshold to turn it on", thresholds_blob(card),
                    config.model.embedding)
        return None
    threshold = thresholds(card, chosen_embedding(config, card)).get("reid_threshold")
    if threshold is None:
        log.warning("tracking: re-identification by face is off: weights %s have no card with a calibrated "
                    "threshold (untrained?); set tracking.reid_threshold to force it", config.model.weights)
        return None
    return float(threshold)


def crop_mismatch(trained_on: str | None, detector: FaceDetector) -> str | None:
    """The warning for weights trained on `trained_on` crops (the card's `crop`; None: it does not
    say) when `detector` gives other crops, None when they agree. Its advice follows the mismatch:
    weights trained on aligned crops want a detector with landmarks; weights trained on box crops
    want haar's boxes, or to be retrained with this detector."""
    crop = crop_definition(detector.gives_landmarks)
    if trained_on is None or trained_on == crop:
        return None
    if trained_on == CROP_ALIGNED:
        advice = "use a detector with landmarks: detect.detector yunet or blazeface"
    elif trained_on == CROP_BOX:
        advice = f"use detect.detector haar, or retrain the weights with detector {detector.name}"
    else:
        advice = f"retrain the weights with detector {detector.name}"
    return (f"identity: the weights were trained on {trained_on} crops but detector {detector.name} gives {crop} "
            f"crops: identities will be less reliable ({advice})")


def build_stages(config: Config, *, source_spec: str | None = None, realtime: bool = True,
                 enroll_scene_people: bool = False, stop: Stop | None = None) -> Stages:
    """Every stage of a run of `config` (already checked by `tracker.preflight.check_runnable`).

    source_spec: the command line's --source, parsed by `make_source` (None: the config's);
    realtime: pace a synthetic scene at its own rate (files are never paced); enroll_scene_people: enrol the
    synthetic scene's people first (the demo); stop: raised by the caller's signal handler, it ends
    the wait for a backend worker's start-up (a WorkerFailure). Raises what the stages raise
    (ModelError for a model whose input is not the guard's crop, BackendUnavailable, InputError
    ...), after closing whatever it had opened."""
    state_dir = prepare_state_dir(config.resolved_state_dir())
    # The demo keeps its state in <state_dir>/demo (tracker.cli.effective_config); the benchmark
    # records its runs and auto's profile in <state_dir> itself, which is what the demo should use.
    benchmark_dir = state_dir.parent if enroll_scene_people else state_dir
    with ExitStack() as opened:
        opened.callback(os.close, lock_state_dir(state_dir))
        restarting = _open_backend(config, benchmark_dir, stop or Stop())
        opened.callback(restarting.close)
        card = weights_card(config)  # after the backend: it refuses missing or mismatched weights first
        backend = embedder(restarting, chosen_embedding(config, card))  # the callback above closes what it wraps
        sinks = _open_sinks(config, state_dir)
        for sink in sinks:
            opened.callback(sink.close)
        web = _open_web(config, state_dir, benchmark_dir)
        if web is not None:
            opened.callback(web.close)
            sinks.append(web)
        latency_log = LatencyLog(config.latency.log_path(state_dir), config.latency.max_bytes,
                                 config.latency.backups)
        opened.callback(latency_log.close)
        detector = create_detector(config.detect)
        if enroll_scene_people:
            _enroll_scene_people(config, backend, detector)
        refresh(config, detector, backend, report=log.info)  # new weights: recompute the people
        crop = crop_definition(detector.gives_landmarks)
        key = embeddings_key(config, card)  # hashes the weights: once, for the gallery and its reloads
        mismatch = crop_mismatch((card or {}).get("crop"), detector)
        if mismatch is not None:
            log.warning("%s", mismatch)
        width = embedding_width(config)
        stamp = people_stamp(state_dir)  # before the gallery's load (as in reload_people)
        stages = Stages(
            state_dir=state_dir,
            source=make_source(config.source, spec=source_spec, realtime=realtime,
                               luma_width=config.detect.detect_width),
            gate=MotionGate.from_config(config.motion),
            detector=detector,
            batcher=Batcher(config.batcher.max_batch, config.batcher.max_wait_ms),
            backend=backend,
            gallery=Gallery.load(state_dir, key, identity_threshold(config, card), crop, width),
            votes=IdentityVotes(config.identity.min_faces, config.identity.margin),
            tracker=Tracker.from_config(config.tracking, reid_threshold=reid_threshold(config, card)),
            events=EventMaker(),
            snapshots=SnapshotStore(snapshots_folder(state_dir)),
            sinks=sinks,
            latency_log=latency_log,
            embedding_width=width,
            embeddings_key=key,
            people_stamp=stamp,
            web=web,
            restarting=restarting,
        )
        stages.opened = opened.pop_all()
    return stages


def _open_backend(config: Config, benchmark_dir: Path, stop: Stop) -> RestartingBackend:
    """The configured backend, restarted with back-off whenever it fails (a worker that died);
    `auto` reads the profile the benchmark wrote in `benchmark_dir`. `stop` reaches every worker
    it starts, the first and those a restart starts."""
    model = guard_model(config)
    backend_config = config.backend
    options = run_options(backend_config.name, benchmark_dir)

    def create():
        return create_backend(backend_config.name, model, precision=backend_config.precision,
                              threads=backend_config.threads, worker=backend_config.worker,
                              worker_options={"stop": stop}, **options)

    return RestartingBackend(create, stop=stop)


def _open_sinks(config: Config, state_dir: Path) -> list[Sink]:
    sinks: list[Sink] = []
    if config.sinks.console:
        sinks.append(ConsoleSink())
    sinks.append(JsonlSink(config.sinks.events_path(state_dir), config.sinks.jsonl_max_bytes,
                           config.sinks.jsonl_backups))
    if config.mqtt.enabled:
        from tracker.sinks.mqtt import MqttSink

        sinks.append(MqttSink(config.mqtt, config.device, state_dir))
    return sinks


def _open_web(config: Config, state_dir: Path, benchmark_dir: Path) -> WebServer | None:
    """The web page's server, listening (None when `web.enabled` is off, or when it cannot listen:
    the guard guards on without its page, and the log says why)."""
    if not config.web.enabled:
        return None
    from tracker.passwords import web_password
    from tracker.web.server import WebServer

    server = WebServer(config, state_dir, config.sinks.events_path(state_dir), web_password(config.web),
                       benchmark_dir)
    if server.start():
        return server
    server.close()
    return None


def _enroll_scene_people(config: Config, backend, detector: FaceDetector) -> None:
    """The demo knows the synthetic scene's people: enroll each from face chips the scene does
    not show (tracker.sources.synthetic.enrolment_chips). What it skips is a warning for the
    user's own `source.faces_dir`, and a debug line for the built-in chips (one of which the
    shared data holds twice: "given twice" at every start), where nothing is the user's to mend."""
    from tracker.sources.synthetic import enrolment_chips

    report = log.warning if config.source.faces_dir is not None else log.debug
    for name, files in enrolment_chips(config.source.faces_dir).items():
        enroll(name, files, config, aligned=True, backend=backend, detector=detector, report=report)


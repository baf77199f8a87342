"""`tracker train`: train the face CNN (models/face_cnn.prototxt) and write a caffemodel and its card.

    tracker train --out CAFFEMODEL [--data SET]... [--teacher NPZ]... [--pairs FILE --pairs-images DIR]
                  [--work DIR] [--epochs N] [--resume]

What it does, in order (scripts/train-face-cnn is the command that made the shipped weights):
1. Cuts every photo of every data set (`tracker.train.data`) with the guard's detector and crop,
   cached in `<work>/crops-*.npz`.
2. Chooses fc2's classes: the P best-populated identities (P = fc2's outputs, 848; ties by name).
3. Builds each photo's distillation target from the teacher files (`tracker.train.teacher`).
   A photo is trained on when it has a target or a class.
4. Trains (`TrainableNet`, BatchNorm during training) with AdamW and a cosine learning rate after a
   short warm-up, on augmented crops (`tracker.train.augment`): loss = (1 - cosine(embedding,
   target)) over photos with a target (the embedding: the blob model.embedding names, fc1 by default) +
   CE_WEIGHT * cross-entropy (label smoothing 0.1) of fc2 over photos with a class. Seeds are
   fixed (numpy and torch); the progress bar shows loss and images/s.
   A checkpoint (`<work>/checkpoint.pt`) is written atomically after every epoch; `--resume`
   continues from it if it belongs to the same run (same data, teacher files, classes and
   settings); without --resume a checkpoint in --work is refused, not written over; Ctrl-C (or
   SIGTERM) stops with the last checkpoint intact, here and in step 5. A loss that is not finite (a --lr too large)
   stops the run before its weights are saved.
5. Exports the caffemodel with BatchNorm folded (`tracker.train.net.export_netdef`) to a staged file
   beside --out, runs it through the project's Caffe engine and checks it matches the torch net,
   measures the pairs (default: LFW's pairsDevTrain; there is no training without pairs: weights
   without a threshold would name strangers at the untrained default) through that engine,
   embedding faces the EMBEDDING way (mirror-mean) and then the other ways, and only then puts it
   in place with its card (`tracker.model.card`: the embedding, the thresholds for a
   THRESHOLD_FAR false-accept rate), the card first; the card names the data and teachers by
   their resolved paths. The data sets' names, the teacher files, the pairs file, --out itself
   (none of the files the run reads) and the --out and --work folders (made if absent, once the
   rest is checked) are checked before any work: a mistake there fails at once, not after the
   training. A trial (--steps, --limit) replaces no --out but a trial's (its card says
   `"trial": true`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import queue
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from tracker import shared_data
from tracker.errors import InputError, ModelError
from tracker.files import atomic_write, file_sha256, make_writable_folder
from tracker.interrupts import interrupts_held, stop_as_ctrl_c
from tracker.machine import cores

CE_WEIGHT = 0.3
THRESHOLD_FAR = 0.01
# The tracker's re-identification merges a new track into a lost one: a false merge swallows the
# `entered` of a different person, so it is set for ten times fewer false accepts.
REID_FAR = 0.001
# How the guard embeds a face with the weights by default (tracker.backends.mirror): the card says
# so, and its thresholds are measured that way (those of the other embeddings beside them).
EMBEDDING = "mirror-mean"
PARITY_TOLERANCE = 1e-4  # exported caffemodel vs the torch net, max abs difference of unit embeddings
# The defaults, in the shared data (tracker.shared_data): LFW's View 1 training people and CelebA 10k.
DEFAULT_DATA = ("datasets/lfw-devtrain/images", "datasets/celeba-10k/identity_CelebA_first10000.txt")
DEFAULT_TEACHER = ("datasets/lfw-devtrain/dlib_descriptors.npz",)
DEFAULT_PAIRS = "datasets/lfw-devtrain/pairsDevTrain.txt"
# What a checkpoint of `save()` holds besides "minutes" and "losses" (older runs had neither).
CHECKPOINT_KEYS = frozenset({"fingerprint", "net", "optimizer", "schedule", "epoch", "step", "numpy_rng", "torch_rng"})
CUT_LINE_EVERY = 1000  # photos between two progress lines when stderr is not a terminal (a log, nohup)
DEFAULT_PAIRS_IMAGES = "datasets/lfw-devtrain/images"
MAX_THREADS = 1024  # torch.set_num_threads overflows past a C int; more threads than cores only slow it


def _parser():
    from tracker.arguments import CONFIG_DEFAULT, ArgumentParser, config_path, int_between, path_to, positive_float, positive_int

    p = ArgumentParser(prog="tracker train", description="Train the face CNN on face photographs and write a caffemodel.")
    p.add_argument("--data", type=path_to("a data set folder or list file"), action="append",
                   help="a data set: a folder of <person>/<image> or a list file of 'image identity' lines "
                        "(repeatable; default: the shared data's LFW training people and CelebA 10k)")
    p.add_argument("--teacher", type=path_to("a teacher .npz file"), action="append",
                   help="an .npz of teacher descriptors ('paths' relative to a data set folder, 'descriptor') "
                        "to distil onto the embedding, model.embedding's blob (repeatable; default: dlib's "
                        "descriptors of the LFW set)")
    p.add_argument("--pairs", type=path_to("an LFW-format pairs file"),
                   help="LFW-format pairs file to set the identity threshold on (default: the LFW set's pairsDevTrain.txt)")
    p.add_argument("--pairs-images", type=path_to("the pairs file's image folder"),
                   help="the pairs file's image folder (default: the LFW set's)")
    p.add_argument("--out", type=path_to("a caffemodel file to write"), required=True,
                   help="caffemodel to write, with its card beside it (written only when training succeeded)")
    p.add_argument("--work", type=path_to("a folder for the crop cache and checkpoint"), default=Path("train-work"),
                   help="crop cache and checkpoint folder (default: ./train-work)")
    p.add_argument("--epochs", type=positive_int, default=30)
    p.add_argument("--batch", type=int_between(2), default=128)  # BatchNorm needs two images a batch
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--seed", type=int_between(0, 2**63 - 1), default=20161129)  # torch's seed is a 64-bit integer
    p.add_argument("--steps", type=positive_int, help="stop after this many steps in all (a short trial)")
    p.add_argument("--limit", type=positive_int, help="use only the first N photos of each data set (a short trial)")
    p.add_argument("--threads", type=int_between(1, MAX_THREADS), help="torch threads (default: all usable cores)")
    p.add_argument("--resume", action="store_true", help="continue from <work>/checkpoint.pt")
    p.add_argument("--config", type=config_path, help=f"YAML config: its detector and model files ({CONFIG_DEFAULT})")
    return p


def _require_torch():
    try:
        import torch
    except ImportError as err:
        from tracker.errors import BackendUnavailable

        raise BackendUnavailable(f"tracker train needs PyTorch ({err}); install it with: "
                                 "pip install 'tracker[train]' (torch==2.13.0, CPU)") from None
    return torch


def _writable_folder(folder: Path, what: str) -> None:
    """Make `folder` (and its parents) if absent; InputError (exit 2) unless it is then a folder
    this process can write in."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"train: {what} {str(folder)!r} is a file; expected a folder to write in")
    try:
        make_writable_folder(folder)
    except OSError as err:
        raise InputError(f"train: {what} {str(folder)!r} cannot be written in ({err.strerror or err}); expected a "
                         "folder to write in") from None


def _written_by_a_trial(weights: Path) -> bool:
    """Whether the caffemodel `weights` comes from a trial (--steps, --limit), as its card says."""
    from tracker.model.card import read_card

    try:
        training = (read_card(weights, file_sha256(weights)) or {}).get("training")
    except (ModelError, OSError):  # no card of these weights: not known to be a trial's
        return False
    return isinstance(training, dict) and training.get("trial") is True


def choose_classes(identities: list[str], count: int) -> list[str]:
    """The `count` identities with the most photos (ties broken by name), best-populated first."""
    counts = Counter(identities)
    return sorted(counts, key=lambda name: (-counts[name], name))[:count]


def _fingerprint(args, samples, classes, prototxt: Path, crops: str, *, before_teacher_hashes: bool = False) -> str:
    """What a resumed run must share with the checkpoint's: the data, teachers and photos (resolved
    paths, as `data.source_key` takes them: a run resumed from another folder, or naming them
    through `..` or a link, is the same run), the teacher files' contents (one rewritten at the same
    path gives other targets; their bytes, not the targets made of them, whose SVD may round
    differently on another CPU), classes, settings, prototxt and `crops` (`data.definition_key`: a
    detector changed since would train on other crops). `before_teacher_hashes`: the form of
    checkpoints written before the teacher files' contents counted (absolute paths, no hashes), so
    that a run interrupted then still resumes."""
    path = (lambda p: str(p.absolute())) if before_teacher_hashes else (lambda p: str(p.resolve()))
    facts = {"data": [path(p) for p in args.data], "teacher": [path(p) for p in args.teacher],
             "photos": [path(s.path) for s in samples], "classes": classes, "epochs": args.epochs,
             "crops": crops, "batch": args.batch, "lr": args.lr, "seed": args.seed, "limit": args.limit,
             "prototxt": hashlib.sha256(Path(prototxt).read_bytes()).hexdigest()}
    if not before_teacher_hashes:
        facts["teacher_sha256"] = [file_sha256(p) for p in args.teacher]
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _save_atomic(torch, state: dict, path: Path) -> None:
    """Write the checkpoint with tracker.files.atomic_write: a crash or a full disk leaves the
    previous one as it was. InputError (exit 2) when it cannot be written."""
    buffer = io.BytesIO()  # serialised first: torch.save reports a full disk as a RuntimeError
    torch.save(state, buffer)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, buffer.getbuffer())
    except OSError as err:
        raise InputError(f"train: cannot write checkpoint {str(path)!r} ({err.strerror or err}); the previous "
                         "checkpoint is unchanged; expected a writable --work folder with free space") from None


def _batches(order: np.ndarray, batch: int, crops: np.ndarray, rng: np.random.Generator):
    """Augmented batches (indices, (B, 1, 88, 88) float32) of one epoch, made one ahead in a thread
    (cv2 releases the GIL) while torch trains on the current one; a queue of one bounds memory."""
    from tracker.train.augment import augment

    starts = range(0, len(order) - batch + 1, batch)  # whole batches only: BatchNorm wants them
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce():
        try:
            for start in starts:
                if stop.is_set():
                    return
                rows = order[start:start + batch]
                ready.put((rows, augment(crops[rows], rng)))
        except Exception as err:  # handed to the training loop, which raises it (never a silent hang)
            ready.put(err)
            return
        ready.put(None)

    worker = threading.Thread(target=produce, name="train-augment", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on the full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                pass
            worker.join(0.05)


def embed_torch(torch, net, x: np.ndarray) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        return net(torch.from_numpy(x))[1].numpy()


def check_export(torch, net, backend, caffemodel: Path, probe: np.ndarray) -> float:
    """Run `probe` (N, 1, 88, 88) through `backend` (the Caffe engine on the exported `caffemodel`)
    and the torch net (eval mode); ModelError unless their unit embeddings agree within
    PARITY_TOLERANCE. Returns the largest difference."""
    from tracker.identity import unit_rows

    ours = unit_rows(embed_torch(torch, net, probe))
    theirs = unit_rows(backend.infer(np.ascontiguousarray(probe)).embedding)
    worst = float(np.abs(ours - theirs).max())
    if not worst <= PARITY_TOLERANCE:
        raise ModelError(f"train: the exported caffemodel {caffemodel} differs from the trained net by {worst:.2e} "
                         f"on the Caffe engine; expected at most {PARITY_TOLERANCE:g}")
    return worst


def threshold_cards(pairs_file: Path, images: Path, detector, backends: dict) -> dict:
    """For each embedding -> backend of `backends` (the Caffe engine, embedding that way), the
    card's threshold entries: the cosines at which THRESHOLD_FAR (identity) and REID_FAR
    (re-identification) of the mismatched pairs of `pairs_file` are accepted, measured as
    `tracker eval-faces` would, the photos cut once for all."""
    from tracker.evaluate_faces import Progress, pair_scores
    from tracker.verification import threshold_at_far

    # minutes on LFW's 2,200 pairs after the training: said, and its lines say train, not eval-faces
    print(f"train: measuring the identity threshold on {pairs_file} ...", file=sys.stderr, flush=True)
    cards = {}
    measured = pair_scores(pairs_file, images, detector, list(backends.values()), Progress(0, prefix="train"))
    for name, (scores, same, skipped) in zip(backends, measured):
        if same.all() or not same.any():
            raise InputError(f"train: pairs file {str(pairs_file)!r}: {int(same.sum())} matched and "
                             f"{int((~same).sum())} mismatched pairs with a face in both photos ({skipped} left out); "
                             "expected some of each to set the identity threshold (the checkpoint holds the training: "
                             "give other --pairs and run again with --resume)")
        threshold, tar = threshold_at_far(scores, same, THRESHOLD_FAR)
        reid, reid_tar = threshold_at_far(scores, same, REID_FAR)
        # rounded up: a threshold rounded down accepts more than its rate (0.745034 -> 0.745 took 1.09%)
        cards[name] = {"identity_threshold": math.ceil(threshold * 1e4) / 1e4, "threshold_far": THRESHOLD_FAR,
                       "reid_threshold": math.ceil(reid * 1e4) / 1e4, "reid_far": REID_FAR,
                       "threshold_pairs": f"{pairs_file.name}: {len(scores)} pairs ({skipped} without a central "
                                          f"face); true-accept rate {tar:.3f} at the identity threshold, "
                                          f"{reid_tar:.3f} at the re-identification threshold"}
    return cards


def train_command(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    with stop_as_ctrl_c():  # a kill or a closed terminal keeps the crops cut and the last checkpoint, as Ctrl-C
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    torch = _require_torch()
    from tqdm import tqdm

    from tracker.config import load_config
    from tracker.crops import crop_definition
    from tracker.detect import create_detector
    from tracker.model.caffe_io import load_net, write_caffemodel
    from tracker.model.convert.graph import lower
    from tracker.model.face_cnn import he_weights
    from tracker.train.data import CropCache, data_root, definition_key, list_samples, load_crops, namespace
    from tracker.train.net import TrainableNet, export_netdef
    from tracker.train.teacher import read_teacher, split_pca_targets

    config = load_config(args.config)
    default_data = not args.data
    args.data = args.data or [shared_data.locate(name, "train", instead="give --data") for name in DEFAULT_DATA]
    named: dict[str, Path] = {}
    for source in args.data:  # people are told apart by their set's name (train.data): one name, one set
        if (name := namespace(source)) in named:
            raise InputError(f"train: --data {str(source)!r} and {str(named[name])!r} are both named {name!r}: "
                             "their people would merge; expected each data set in a folder of its own name")
        named[name] = source
    teachers_named = args.teacher is not None  # (the defaults may describe none of the photos: not a mistake)
    if args.teacher is None and default_data:  # the shipped recipe: without its teacher it is another one
        args.teacher = [shared_data.locate(name, "train", instead="give --teacher") for name in DEFAULT_TEACHER]
    elif args.teacher is None:  # (another set's photos may be none of those the default describes)
        args.teacher = [path for path in map(shared_data.find, DEFAULT_TEACHER) if path is not None]
    prototxt, out = config.model.prototxt, args.out
    if out.is_dir():
        raise InputError(f"train: --out {str(out)!r} is a folder; expected the caffemodel file to write")
    # `scripts/train-face-cnn --steps 5` would replace the shipped weights (a trial may replace a trial's)
    if (args.steps or args.limit) and out.exists() and not _written_by_a_trial(out):
        raise InputError(f"train: --out {str(out)!r} exists, and a trial (--steps, --limit) does not replace trained "
                         "weights; expected another --out for the trial")
    checkpoint = args.work / "checkpoint.pt"
    if not args.resume and checkpoint.exists():  # a fresh run would write over it at its first epoch
        raise InputError(f"train: {str(checkpoint)!r} holds an earlier run; expected --resume to continue it, or "
                         "another --work (or remove the file) to start afresh")
    if args.resume and not checkpoint.exists():  # checked before the photos are cut (minutes)
        raise InputError(f"train: --resume: no checkpoint {str(checkpoint)!r}; expected one written by an "
                         "earlier run with the same --work")
    teachers = []
    for teacher_file in args.teacher:
        if not teacher_file.is_file():  # (a folder was said not to exist)
            problem = "is a folder" if teacher_file.is_dir() else "is not a regular file" if teacher_file.exists() \
                else "does not exist"
            raise InputError(f"train: --teacher {str(teacher_file)!r} {problem}; expected an .npz of "
                             "'paths' and 'descriptor'")
        teachers.append(read_teacher(teacher_file))  # all in memory from here: 7 MB for the LFW set's
    lengths = sorted({len(d) for teacher in teachers for d in teacher.values()})
    if len(lengths) > 1:  # their principal axes are found together
        raise InputError(f"train: --teacher files with descriptors of {' and '.join(map(str, lengths))} values; "
                         "expected one length in all")
    # The pairs the card's identity threshold is measured on: weights without one would name strangers
    # at the untrained default (tracker.model.card), so there is no training without them.
    pairs_file = args.pairs or shared_data.locate(DEFAULT_PAIRS, "train", instead="give --pairs and --pairs-images")
    from tracker.verification import read_pairs

    pairs_images = args.pairs_images or shared_data.locate(DEFAULT_PAIRS_IMAGES, "train", instead="give --pairs-images")
    read_pairs(pairs_file, pairs_images)  # a bad pairs file fails now, not after hours of training
    from tracker.arguments import refuse_overwriting

    try:  # the weights are written over --out once the training is done: `--out pairs.txt` lost the pairs
        # file (and the prototxt, the net itself) after hours of work; the config's caffemodel is not
        # among them, as training in its place is how it is replaced
        refuse_overwriting(out, {"prototxt": prototxt, "config": args.config, "pairs": pairs_file,
                                 "teacher": args.teacher, "data set list": args.data, "checkpoint": checkpoint})
    except InputError as err:
        raise InputError(f"train: --out: {err}") from None
    _writable_folder(out.parent, "--out's folder")  # made last: a mistake found above leaves no empty folder
    _writable_folder(args.work, "--work")
    pairs = (pairs_file, pairs_images)
    threads = args.threads or cores()
    torch.set_num_threads(threads)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    structure = load_net(prototxt, None)
    graph = lower(he_weights(structure), config.model.probs, config.model.embedding)
    net = TrainableNet(graph)
    net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit it; oneDNN's convolutions: 0.74 s a step, not 1.07
    n_classes = net.layers[net.outputs[0]].out_features
    # the size of the blob model.embedding names, as the net outputs it (an image blob flattened:
    # conv3's 96 x 8 x 8 is 6144), not the first InnerProduct's: the targets are compared with it
    (width,) = graph.shapes[graph.outputs["embedding"]]
    if lengths and lengths[0] < width // 2:  # the targets are made of width // 2 principal axes (train.teacher)
        raise InputError(f"train: --teacher descriptors of {lengths[0]} values; expected at least {width // 2} "
                         f"(half the embedding's {width}, model.embedding {config.model.embedding!r})")

    # 1. crops
    detector = create_detector(config.detect)
    crop_name = crop_definition(detector.gives_landmarks)
    crops_key = definition_key(detector, config.detect)
    cache = CropCache(args.work, crops_key)
    listed = [(root, list_samples(root)) for root in args.data]
    sets = [(root, found[:args.limit] if args.limit else found) for root, found in listed]
    # what gives the steps below more photos, said when they have too few
    more_photos = "raise --limit" if args.limit and any(len(found) > args.limit for _, found in listed) else "give more --data"
    total = sum(len(s) for _, s in sets)
    parts: list[np.ndarray] = []
    samples, roots, left_out = [], [], 0
    cut = [0]  # photos done; the bar shows them on a terminal, plain lines in a log (tqdm is off there)

    def progress(n: int) -> None:
        bar.update(n)
        before, cut[0] = cut[0], cut[0] + n
        if not sys.stderr.isatty() and cut[0] // CUT_LINE_EVERY > before // CUT_LINE_EVERY:
            print(f"train: {cut[0]} of {total} photos cut", file=sys.stderr, flush=True)

    try:
        with tqdm(total=total, desc="crops", unit="photo", file=sys.stderr, disable=None, dynamic_ncols=True) as bar:
            for root, set_samples in sets:
                c, kept, missed = load_crops(set_samples, detector, cache, progress=progress)
                parts.append(c)
                samples += kept
                roots += [data_root(root)] * len(kept)
                left_out += missed
    except KeyboardInterrupt:  # load_crops saved what it cut
        print(f"\ntrain: interrupted while cutting photos; the crops cut so far are kept in {cache.path}: the next "
              "run starts from them", file=sys.stderr)
        return 130
    crops = np.concatenate(parts)
    print(f"train: {len(samples)} photos with a central face ({crop_name} crops), {left_out} left out "
          f"(not an image or no face found); cache {cache.path}", file=sys.stderr)
    del parts, cache  # the crops are in `crops` now: 218 MB more RSS kept for the whole training otherwise

    # 2. classes, 3. targets
    classes = choose_classes([s.identity for s in samples], n_classes)
    class_of = {name: i for i, name in enumerate(classes)}
    labels = np.array([class_of.get(s.identity, -1) for s in samples], np.int64)
    targets = np.zeros((len(samples), width), np.float32)
    has_target = np.zeros(len(samples), bool)
    descriptors, rows = [], []
    for teacher, teacher_file in zip(teachers, args.teacher):
        matched = 0
        for i, (sample, root) in enumerate(zip(samples, roots)):
            # a photo outside its data set's folder (an absolute path in a list) has no teacher entry
            inside = sample.path.is_relative_to(root)
            descriptor = teacher.get(sample.path.relative_to(root).as_posix()) if inside else None
            matched += descriptor is not None
            if descriptor is not None and not has_target[i]:
                descriptors.append(descriptor)
                rows.append(i)
                has_target[i] = True
        if samples and not matched and teachers_named:  # one the user named for nothing
            raise InputError(f"train: --teacher {str(teacher_file)!r} has a descriptor of none of the {len(samples)} "
                             f"photos; expected its 'paths' relative to a --data set's folder "
                             f"({', '.join(sorted({str(r) for r in roots}))})")
    if rows and len(rows) <= width // 2:
        raise InputError(f"train: {len(rows)} teacher descriptors; expected more than {width // 2} to find the "
                         f"principal axes: {more_photos}")
    if rows:
        targets[rows] = split_pca_targets(np.stack(descriptors), width)
    used = np.flatnonzero(has_target | (labels >= 0))
    if len(used) < args.batch:
        fixes = ([f"lower --batch to {len(used)} or less"] if len(used) >= 2 else []) + [more_photos]
        raise InputError(f"train: {len(used)} usable photos (with a teacher descriptor or one of the {n_classes} "
                         f"classes); expected at least one batch of {args.batch}: {', or '.join(fixes)}")
    smallest = min(Counter(labels[labels >= 0].tolist()).values(), default=0)
    print(f"train: {len(used)} photos used: {int(has_target[used].sum())} with a teacher target, "
          f"{int((labels[used] >= 0).sum())} in the {len(classes)} classes (smallest class: {smallest} photos)",
          file=sys.stderr)

    # 4. training
    steps_per_epoch = len(used) // args.batch
    total_steps = steps_per_epoch * args.epochs
    warmup = min(300, total_steps // 10 + 1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=5e-4)
    # math, not numpy: no numpy float in the optimizer's state, the plain data torch.load's
    # weights_only mode (which runs no code from the file) takes without an allowance
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (
        1.0 + math.cos(math.pi * min(step, total_steps) / total_steps)))
    fingerprint = _fingerprint(args, samples, classes, prototxt, crops_key)
    epoch, step, minutes_before = 0, 0, 0.0  # minutes: time spent training, over every resumed run
    losses: list[float] = []  # per step, over every resumed run (13 kB for the shipped run)
    if args.resume:
        try:
            # tensors and plain data only: no code runs. numpy's float64 and its dtype too: the
            # learning rates of checkpoints written before the schedule computed in math are ones
            rebuild_scalar = np.float64(0).__reduce__()[0]  # what pickle calls: numpy._core.multiarray.scalar
            with torch.serialization.safe_globals([rebuild_scalar, np.dtype, type(np.dtype(np.float64))]):
                state = torch.load(checkpoint, weights_only=True)
        except Exception as err:  # a truncated or foreign file: torch raises several kinds
            raise InputError(f"train: --resume: checkpoint {str(checkpoint)!r} is unreadable ({type(err).__name__}); "
                             "expected one written by tracker train") from None
        if not isinstance(state, dict) or not CHECKPOINT_KEYS <= state.keys():  # loadable, but not one of ours
            raise InputError(f"train: --resume: checkpoint {str(checkpoint)!r} is not one tracker train wrote (a "
                             f"{type(state).__name__} without {', '.join(sorted(CHECKPOINT_KEYS))}); expected one "
                             "written by tracker train")
        if state["fingerprint"] not in (fingerprint, _fingerprint(args, samples, classes, prototxt, crops_key,
                                                                  before_teacher_hashes=True)):
            raise InputError(f"train: --resume: checkpoint {str(checkpoint)!r} is of another run (other data, "
                             "teacher files, classes or settings); expected the same arguments, or start afresh without --resume")
        net.load_state_dict(state["net"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        epoch, step, minutes_before = state["epoch"], state["step"], state.get("minutes", 0.0)
        losses[:] = state.get("losses", [])
        rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        print(f"train: resumed from {checkpoint} after epoch {epoch}", file=sys.stderr)

    def save() -> None:
        minutes = minutes_before + (time.monotonic() - started) / 60.0
        _save_atomic(torch, {"fingerprint": fingerprint, "net": net.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "epoch": epoch, "step": step, "minutes": minutes,
                             "losses": losses,
                             "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state()}, checkpoint)

    t_labels, t_targets = torch.from_numpy(labels), torch.from_numpy(targets)
    t_has_target = torch.from_numpy(has_target)

    def batch_loss(rows: np.ndarray, x: np.ndarray):
        """The loss of one batch (a 0-d tensor) through the net as it is (train or eval mode)."""
        logits, embedding = net(torch.from_numpy(x).contiguous(memory_format=torch.channels_last))
        idx = torch.from_numpy(rows)
        loss = torch.zeros(())
        mask = t_has_target[idx]
        if mask.any():
            cos = torch.nn.functional.cosine_similarity(embedding[mask], t_targets[idx][mask], eps=1e-8)
            loss = loss + (1.0 - cos).mean()
        lab = t_labels[idx]
        if (lab >= 0).any():
            loss = loss + CE_WEIGHT * torch.nn.functional.cross_entropy(logits[lab >= 0], lab[lab >= 0],
                                                                        label_smoothing=0.1)
        return loss

    def refuse_diverged(loss, when: str) -> None:
        """A loss that is not finite: the weights diverged, and saving them would put NaN (or
        1e30) weights in place of the last good checkpoint."""
        if not torch.isfinite(loss):
            raise InputError(f"train: the loss is {loss.item()} {when} (--lr {args.lr:g}): the training diverged; "
                             "its weights are not saved (the last checkpoint, if any, is kept); expected a smaller --lr")

    started = time.monotonic()
    try:
        while epoch < args.epochs and not (args.steps and step >= args.steps):
            net.train()
            order = used[rng.permutation(len(used))]
            bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch + 1}/{args.epochs}", unit="step",
                       file=sys.stderr, disable=None, dynamic_ncols=True)
            seen, t0, done = 0, time.monotonic(), 0
            for picked, x in _batches(order, args.batch, crops, rng):
                loss = batch_loss(picked, x)
                refuse_diverged(loss, f"at step {step + 1}")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                step += 1
                seen += len(picked)
                losses.append(float(loss.detach()))
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", img_s=f"{seen / (time.monotonic() - t0):.0f}")
                bar.update(1)
                done += 1
                if args.steps and step >= args.steps:
                    break
            bar.close()
            if done:  # the last step's update is in no loss yet: its batch again, through the weights it made
                net.eval()
                with torch.no_grad():
                    refuse_diverged(batch_loss(picked, x), f"after step {step}")
            epoch += done == steps_per_epoch  # a --steps trial may stop inside an epoch: resume repeats it
            save()
            print(f"train: epoch {epoch}/{args.epochs}, step {step}: loss {np.mean(losses[-done:]):.4f}, "
                  f"{seen / (time.monotonic() - t0):.0f} images/s; checkpoint {checkpoint}", file=sys.stderr)
    except KeyboardInterrupt:
        if checkpoint.exists():
            print(f"\ntrain: interrupted; the last checkpoint ({checkpoint}) is intact: continue with --resume",
                  file=sys.stderr)
        else:
            print("\ntrain: interrupted in the first epoch, before any checkpoint: run again without --resume",
                  file=sys.stderr)
        return 130
    minutes = minutes_before + (time.monotonic() - started) / 60.0

    # 5. export, check, threshold, card
    from tracker.backends import create_backend
    from tracker.backends.mirror import embedder
    from tracker.crops import network_input
    from tracker.model.card import EMBEDDINGS, card_path, write_card
    from tracker.model.spec import ModelSpec

    # Staged beside `out` and checked first: a failing check never replaces the weights in use.
    staged = out.with_name(f".{out.name}.staged")
    placed: list[Path] = []  # `out`, once the weights and their card are in place

    def write_or_say(write) -> None:
        """write(); a full disk or a folder removed since the start is one line saying how the
        training, safe in its checkpoint, gets exported."""
        try:
            write()
        except OSError as err:
            raise InputError(f"train: cannot write {str(out)!r} or its card ({err.strerror or err}); the checkpoint "
                             f"{str(checkpoint)!r} holds the training: make room and run again with --resume") from None

    def put_in_place() -> None:
        """The card first, then the weights, each by a rename (which takes no room): new weights
        never stand without their card (between the two renames, for a moment, the weights they
        replace stand beside the new card; no stop comes between them)."""
        card_file = write_card(staged, card)
        with interrupts_held():
            card_file.replace(card_path(out))
            staged.replace(out)
            placed.append(out)  # (a stop held here comes after: the weights are in place)

    try:
        write_or_say(lambda: write_caffemodel(staged, export_netdef(net, structure)))
        backend = create_backend("caffe-openblas-dl", ModelSpec(prototxt, staged, config.model.probs,
                                                                config.model.embedding))
        try:  # one engine for the parity check and the threshold
            worst = check_export(torch, net, backend, staged, network_input(crops[used[:32]]))
            card = _card(staged, crop_name, config.model.embedding, classes, args, len(used), epoch, step, minutes,
                         threads, losses)
            # thresholds for the card's embedding, and for the others beside them
            entries = threshold_cards(*pairs, detector, {name: embedder(backend, name) for name in EMBEDDINGS})
            card.update(entries.pop(EMBEDDING))
            card["thresholds_for"] = entries
        finally:
            backend.close()
        write_or_say(put_in_place)
    except KeyboardInterrupt:  # measuring the pairs cuts thousands of photos: minutes to stop in
        if placed:
            print(f"\ntrain: interrupted after writing {out} and its card", file=sys.stderr)
        else:
            print(f"\ntrain: interrupted while exporting; the checkpoint ({checkpoint}) holds the training: continue "
                  "with --resume (it exports without training again)", file=sys.stderr)
        return 130
    finally:
        staged.unlink(missing_ok=True)
        card_path(staged).unlink(missing_ok=True)
    print(f"train: wrote {out} ({out.stat().st_size:,} bytes) after {epoch} epoch(s), {step} steps, {minutes:.1f} min; "
          f"loss {card['training']['first_loss']} -> {card['training']['last_loss']}; Caffe engine parity {worst:.1e}; "
          f"identity threshold {card.get('identity_threshold')}")
    return 0


def _card(weights: Path, crop_name: str, blob: str, classes: list[str], args, photos: int, epoch: int, step: int,
          minutes: float, threads: int, losses: list[float]) -> dict:
    """The card's entries for the staged caffemodel `weights` (tracker.model.card), threshold aside;
    `blob`: the embedding's, on which the thresholds are then measured."""
    window = max(1, min(20, len(losses) // 3))  # the loss at the start and at the end, smoothed
    return {"weights_sha256": file_sha256(weights), "crop": crop_name, "embedding": EMBEDDING, "blob": blob,
            "classes": classes,
            "training": {"data": [str(p.resolve()) for p in args.data],  # as typed, a relative path meant nothing later
                         "teacher": [str(p.resolve()) for p in args.teacher],
                         "trial": bool(args.steps or args.limit), "photos": photos, "epochs": epoch,
                         "steps": step, "batch": args.batch,
                         "lr": args.lr, "seed": args.seed, "minutes": round(minutes, 1), "threads": threads,
                         "first_loss": round(float(np.mean(losses[:window])), 4) if losses else None,
                         "last_loss": round(float(np.mean(losses[-window:])), 4) if losses else None}}

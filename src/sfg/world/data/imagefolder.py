"""Image-folder datasets: ``train/<class>/*`` and ``test/<class>/*``, as a directory or a tar(.gz).

Class folders sorted alphabetically give the label order (for CIFAR-10 exported this way
that is CIFAR's own order). Images are decoded with Pillow once, in parallel worker processes
(``workers``, default all cores up to 8), into uint8 arrays cached as one ``.npz`` (see
:mod:`sfg.world.data.files` for where); later loads read the cache (well under a few seconds for all
60,000 CIFAR-10 images). ``limit_per_class`` keeps only the first k files (by file name) of
every class in each split, for quick experiments and tests; it is part of the cache key.
All images must have one size unless ``resize=S`` (bilinear resize to S×S) is given; they are
converted to RGB, or to one channel with ``grayscale=true``.

The generic ``imagefolder`` dataset partitions such a folder like CIFAR (Dirichlet label
skew, at least 20 training images per client, 300 label-matched test images per client,
random horizontal flips only with ``hflip=true``).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sfg.errors import SfgError, check
from sfg.util.safety import check_memory, human_bytes, max_member, max_pixels
from sfg.world.data.base import (
    DATASETS,
    FederatedData,
    ImagePool,
    channel_stats,
    federate_label_skew,
    option_bool,
    option_int,
)
from sfg.world.data.files import (
    cache_directory,
    cache_path,
    is_tar,
    iter_tar_files,
    load_cached,
    locate,
    save_cached,
    tar_file_names,
)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif",
                  ".tiff")
SPLITS = ("train", "test")
LOOKED_FOR = ("an image folder train/<class>/*, test/<class>/* (a directory or .tar.gz)")


@dataclass(frozen=True)
class ImageFolderSource:
    """Where an image folder lives: a directory, or an archive with a member ``prefix``."""

    path: Path
    prefix: str = ""
    archive: bool = False


def _is_image(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base.startswith(".") and base.lower().endswith(IMAGE_SUFFIXES)


def _member_parts(name: str) -> list[str]:
    name = name[2:] if name.startswith("./") else name
    return [p for p in name.split("/") if p]


def detect_image_folder(path: Path) -> ImageFolderSource | None:
    """An :class:`ImageFolderSource` if ``path`` is an image folder (dir or tar), else None."""
    if path.is_dir():
        train, test = path / "train", path / "test"
        if train.is_dir() and test.is_dir() and any(p.is_dir() for p in train.iterdir()):
            return ImageFolderSource(path)
        return None
    if is_tar(path):
        for name in tar_file_names(path):
            parts = _member_parts(name)
            if len(parts) >= 3 and parts[-3] in SPLITS and _is_image(parts[-1]):
                prefix = "/".join(parts[:-3])
                return ImageFolderSource(path, prefix + "/" if prefix else "", archive=True)
    return None


def locate_image_folder(data_root, *, what: str = "image folder", hint: str | None = None,
                        fix: str = "") -> ImageFolderSource:
    """Find an image folder at or below ``data_root`` (SfgError listing what was looked for)."""
    return locate(data_root, detect_image_folder, what=what, looked_for=LOOKED_FOR, hint=hint,
                  fix=fix)


# ------------------------------------------------------------------------ listing
Entry = tuple[str, str, bytes]  # (class, file name, encoded bytes)


def _inside(root: Path, path: Path) -> None:
    """Refuse ``path`` (a symbolic link, or below one) that resolves outside ``root``."""
    real = path.resolve()
    if real != root and root not in real.parents:
        raise SfgError(f"image folder {root}: {path} is a symbolic link to {real}, outside the "
                       "data root; copy the file into the folder or point --data-root at the "
                       "real folder")


def _list_directory(root: Path) -> dict[str, list[Entry]]:
    real_root = root.resolve()
    files: dict[str, list[tuple[str, Path]]] = {s: [] for s in SPLITS}
    total = 0
    for split in SPLITS:
        _inside(real_root, root / split)
        for cls_dir in sorted(p for p in (root / split).iterdir()
                              if p.is_dir() and not p.name.startswith(".")):
            _inside(real_root, cls_dir)
            for file in sorted(cls_dir.iterdir()):
                if file.is_file() and _is_image(file.name):
                    _inside(real_root, file)
                    total += file.stat().st_size
                    files[split].append((cls_dir.name, file))
    check_memory(total, f"image folder {root} holds {human_bytes(total)} of encoded images",
                 fix="pass limit_per_class=K to read fewer")
    return {split: [(c, str(f), f.read_bytes()) for c, f in entries]
            for split, entries in files.items()}


def _list_archive(source: ImageFolderSource) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = {s: [] for s in SPLITS}
    depth = len(_member_parts(source.prefix))

    def keep(name: str) -> bool:
        parts = _member_parts(name)
        return (len(parts) == depth + 3 and "/".join(parts[:depth]) == source.prefix.rstrip("/")
                and parts[depth] in SPLITS and _is_image(parts[-1]))

    for name, blob in iter_tar_files(source.path, keep):
        parts = _member_parts(name)
        out[parts[depth]].append((parts[depth + 1], f"{source.path}:{name}", blob))
    for split in SPLITS:
        out[split].sort(key=lambda e: (e[0], e[1]))
    return out


def _limit(entries: list[Entry], limit: int | None) -> list[Entry]:
    if limit is None:
        return entries
    kept, seen = [], {}
    for entry in entries:  # sorted by (class, name)
        k = seen.get(entry[0], 0)
        if k < limit:
            kept.append(entry)
            seen[entry[0]] = k + 1
    return kept


# ------------------------------------------------------------------------ decoding
_SHARED: tuple[list[bytes], list[str]] = ([], [])


def _format_hint(name: str) -> tuple[str, ...] | None:
    """Pillow format to try first for a file name (skips format sniffing; ~20 % faster)."""
    low = name.lower()
    if low.endswith((".jpg", ".jpeg")):
        return ("JPEG", "PNG", "BMP", "GIF", "WEBP", "TIFF", "PPM")
    if low.endswith(".png"):
        return ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF", "PPM")
    return None


def _decode(blobs: list[bytes], names: list[str], mode: str, size: tuple[int, int],
            resize: bool, out: np.ndarray | None = None) -> np.ndarray:
    """uint8 [k, channels, H, W] from encoded images (all of ``size`` (W, H) after resize),
    written into ``out`` when given (no stacked or transposed copy of the whole batch)."""
    from PIL import Image

    channels = 3 if mode == "RGB" else 1
    if out is None:
        out = np.empty((len(blobs), channels, size[1], size[0]), np.uint8)
    for i, (blob, name) in enumerate(zip(blobs, names, strict=True)):
        try:
            im = Image.open(io.BytesIO(blob), formats=_format_hint(name))
            _check_pixels(im.size, name)
            if im.mode != mode:
                im = im.convert(mode)
            if im.size != size:
                if not resize:
                    raise SfgError(f"image {name} is {im.size[0]}x{im.size[1]} but the first "
                                   f"image is {size[0]}x{size[1]}; pass resize=S to resize "
                                   "every image to SxS")
                im = im.resize(size, Image.BILINEAR)
            pixels = np.frombuffer(im.tobytes(), np.uint8).reshape(size[1], size[0], channels)
            out[i] = pixels.transpose(2, 0, 1)
        except SfgError:
            raise
        except Exception as exc:
            raise SfgError(f"cannot decode image {name}: {type(exc).__name__}: {exc}") from None
    return out


def _check_pixels(size: tuple[int, int], name: str) -> None:
    """Refuse one image, from the size in its header (nothing decoded yet), whose pixels exceed
    SFG_MAX_PIXELS (decode time: a folder's decoding stays within about a second per image per
    core) or whose decoded RGBA pixels would exceed SFG_MAX_MEMBER (a pixel bomb)."""
    pixels = size[0] * size[1]
    budget = max_pixels()
    if pixels > budget:
        raise SfgError(f"image {name} is {size[0]}x{size[1]} = {pixels / 1e6:.1f} megapixels, "
                       f"over the per-image budget of {budget / 1e6:.1f} megapixels "
                       f"(SFG_MAX_PIXELS={_pixels_text(budget)}; decoding one takes about a "
                       f"second per 32M pixels): shrink the images, or raise it with "
                       f"SFG_MAX_PIXELS={_pixels_text(4 * budget)}")
    limit = max_member()
    if size[0] * size[1] * 4 > limit:
        raise SfgError(f"image {name} is {size[0]}x{size[1]} pixels = "
                       f"{human_bytes(size[0] * size[1] * 4)} decoded, over the per-image limit "
                       f"of {human_bytes(limit)} (SFG_MAX_MEMBER); is it really an image of "
                       "the data set?")


def _pixels_text(n: int) -> str:
    """A pixel count as SFG_MAX_PIXELS takes it back: ``33554432`` -> ``32M``."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _decode_range(task: tuple[int, int, str, tuple[int, int], bool]) -> tuple[int, np.ndarray]:
    start, stop, mode, size, resize = task
    blobs, names = _SHARED
    return start, _decode(blobs[start:stop], names[start:stop], mode, size, resize)


def decode_images(blobs: list[bytes], names: list[str], *, grayscale: bool = False,
                  resize: int | None = None, workers: int | None = None) -> np.ndarray:
    """Decode encoded images to uint8 [n, C, H, W] (C = 3, or 1 with ``grayscale``).

    Uses ``workers`` forked processes (default: all cores, at most 8) for large batches.
    """
    global _SHARED
    mode = "L" if grayscale else "RGB"
    if not blobs:
        return np.zeros((0, 1 if grayscale else 3, resize or 1, resize or 1), np.uint8)
    if resize is not None:
        size = (resize, resize)
    else:
        from PIL import Image

        try:
            size = Image.open(io.BytesIO(blobs[0])).size
        except Exception as exc:
            raise SfgError(f"cannot decode image {names[0]}: {type(exc).__name__}: {exc}") from None
        _check_pixels(size, names[0])
    channels = 1 if grayscale else 3
    # the decoded array, computed before decoding any image
    check_memory(1.0 * len(blobs) * size[0] * size[1] * channels,
                 f"{len(blobs):,} images of {size[0]}x{size[1]} pixels x {channels} channels",
                 fix="pass limit_per_class=K or resize=S")
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    chunk = 2048
    tasks = [(s, min(s + chunk, len(blobs)), mode, size, resize is not None)
             for s in range(0, len(blobs), chunk)]
    forkable = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    # decoded straight into the one result array (memory: that array plus a chunk per worker)
    out = np.empty((len(blobs), channels, size[1], size[0]), np.uint8)
    if workers <= 1 or len(tasks) < 2 or not forkable:
        return _decode(blobs, names, mode, size, resize is not None, out=out)
    _SHARED = (blobs, names)  # inherited by the forked workers, not pickled
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(tasks))) as pool:
            for start, part in pool.imap_unordered(_decode_range, tasks):
                out[start:start + len(part)] = part
                del part
    finally:
        _SHARED = ([], [])
    return out


# ------------------------------------------------------------------------ loading + cache
def read_image_folder(source: ImageFolderSource, *, limit_per_class: int | None = None,
                      grayscale: bool = False, resize: int | None = None,
                      workers: int | None = None, cache_dir=None) -> tuple[dict, dict]:
    """Decoded arrays of an image folder, from the cache or decoded now (then cached).

    Returns ``(arrays, info)``: arrays ``train_x``/``test_x`` uint8 [n, C, H, W],
    ``train_y``/``test_y`` int64 [n], ``classes`` str [K], ``mean``/``std`` float64 [C];
    info ``{"cache": path, "decoded": bool, "seconds": float}``.
    """
    started = time.perf_counter()
    options = {"limit_per_class": limit_per_class, "grayscale": grayscale, "resize": resize,
               "prefix": source.prefix}
    directory = cache_directory(source.path, cache_dir)
    path = cache_path(directory, "imagefolder", source.path, options)
    arrays = load_cached(path)
    if arrays is not None:
        return arrays, {"cache": str(path), "decoded": False,
                        "seconds": time.perf_counter() - started}
    listing = _list_archive(source) if source.archive else _list_directory(source.path)
    classes = sorted({e[0] for e in listing["train"]})
    check(len(classes) > 0, f"image folder {source.path} has no images under "
                            f"{source.prefix}train/<class>/")
    check(len(listing["test"]) > 0, f"image folder {source.path} has no images under "
                                    f"{source.prefix}test/<class>/")
    unknown = sorted({e[0] for e in listing["test"]} - set(classes))
    check(not unknown, f"image folder {source.path}: test classes {unknown} have no training "
                       "images; every test class needs a train/<class>/ folder")
    label = {c: i for i, c in enumerate(classes)}
    arrays = {"classes": np.array(classes)}
    for split in SPLITS:
        entries = _limit(listing.pop(split), limit_per_class)  # a split's blobs go once decoded
        arrays[f"{split}_x"] = decode_images([e[2] for e in entries], [e[1] for e in entries],
                                             grayscale=grayscale, resize=resize, workers=workers)
        arrays[f"{split}_y"] = np.array([label[e[0]] for e in entries], np.int64)
        del entries
    shapes = {arrays["train_x"].shape[1:], arrays["test_x"].shape[1:]}
    check(len(shapes) == 1, f"image folder {source.path}: train and test images differ in size "
                            f"({sorted(shapes)}); pass resize=S")
    arrays["mean"], arrays["std"] = channel_stats(arrays["train_x"], 255.0)
    save_cached(path, arrays)
    return arrays, {"cache": str(path), "decoded": True, "seconds": time.perf_counter() - started}


def image_folder_pool(source: ImageFolderSource, *, limit_per_class: int | None = None,
                      grayscale: bool = False, resize: int | None = None,
                      workers: int | None = None, cache_dir=None) -> ImagePool:
    """An :class:`ImagePool` from an image folder (scale 255, train-split statistics)."""
    arrays, info = read_image_folder(source, limit_per_class=limit_per_class,
                                     grayscale=grayscale, resize=resize, workers=workers,
                                     cache_dir=cache_dir)
    classes = [str(c) for c in arrays["classes"]]
    return ImagePool(train_x=arrays["train_x"], train_y=arrays["train_y"],
                     test_x=arrays["test_x"], test_y=arrays["test_y"], num_classes=len(classes),
                     scale=255.0, mean=arrays["mean"], std=arrays["std"],
                     meta={"source": str(source.path), "format": "image-folder",
                           "prefix": source.prefix, "label_names": classes,
                           "limit_per_class": limit_per_class, **info})


def folder_options(limit_per_class, workers, grayscale, resize) -> dict:
    """Validated image-folder decoding options."""
    return {"limit_per_class": option_int(limit_per_class, "limit_per_class"),
            "workers": option_int(workers, "workers"),
            "grayscale": option_bool(grayscale, "grayscale"),
            "resize": option_int(resize, "resize")}


def load_imagefolder_federated(*, n_clients: int, seed: int, data_root, alpha: float,
                               min_train: int | None, test_per_client: int | None,
                               val_fraction: float, cache_dir=None, limit_per_class=None,
                               workers=None, grayscale: bool = False, resize=None,
                               hflip: bool = False, balance: bool = True, partition: str = "dirichlet") -> FederatedData:
    """A user's image folder with CIFAR's protocol (see the module docstring)."""
    opts = folder_options(limit_per_class, workers, grayscale, resize)
    source = locate_image_folder(data_root)
    pool = image_folder_pool(source, cache_dir=cache_dir, **opts)
    return federate_label_skew(
        pool, name="imagefolder", n_clients=n_clients, seed=seed, alpha=alpha,
        min_train=20 if min_train is None else min_train,
        test_per_client=300 if test_per_client is None else test_per_client,
        val_fraction=val_fraction, augment_hflip=option_bool(hflip, "hflip"),
        balance=option_bool(balance, "balance"), partition=partition)


DATASETS.register(
    "imagefolder", load_imagefolder_federated,
    params={"cache_dir": None, "limit_per_class": None, "workers": None, "grayscale": False,
            "resize": None, "hflip": False, "balance": True, "min_train": 20,
            "test_per_client": 300},
    doc="any image folder train/<class>/*, test/<class>/* (directory or .tar.gz)",
    tags=("image", "file"))

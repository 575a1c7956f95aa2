"""The training data: the seed's HDF5 shards, this rank's deterministic stream of batches, and the
feeds that bring them to the device without making the step wait."""
from __future__ import annotations

import glob
import os
import queue
import random
import threading
import time
from typing import NamedTuple

import h5py
import numpy as np
import torch

from pretrain_runtime import UsageError

HDF5_KEYS = {
    "input_ids": ("int32", 2),
    "input_mask": ("int8", 2),
    "segment_ids": ("int8", 2),
    "masked_lm_positions": ("int32", 2),
    "masked_lm_ids": ("int32", 2),
    "next_sentence_labels": ("int8", 1),
}


class Position(NamedTuple):
    """Where a batch came from: files this rank finished before it, the epoch, and the index of
    its file in this rank's list of the epoch (the sample's checkpoint "files" start index)."""
    files_done: int
    epoch: int
    file_index: int


def list_training_files(data_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(data_dir, "*_training_*.hdf5")))


def check_shard_format(path: str, seq_len: int, max_pred_len: int) -> int:
    """Return the number of sequences; raise UsageError if the file is not the seed's format."""
    with h5py.File(path, "r") as f:
        rows = None
        for key, (dtype, ndim) in HDF5_KEYS.items():
            if key not in f:
                raise UsageError(f"{path}: missing dataset '{key}'")
            ds = f[key]
            width = max_pred_len if key.startswith("masked_lm_") else seq_len
            expected = f"[N,{width}]" if ndim == 2 else "[N]"
            if ds.ndim != ndim or (ndim == 2 and ds.shape[1] != width):
                raise UsageError(f"{path}: '{key}' has shape {ds.shape}, expected {expected}")
            if np.dtype(ds.dtype).kind != np.dtype(dtype).kind:
                raise UsageError(f"{path}: '{key}' has dtype {ds.dtype}, expected {dtype}")
            rows = ds.shape[0] if rows is None else rows
            if ds.shape[0] != rows:
                raise UsageError(f"{path}: datasets have different lengths")
        return rows


class ShardStream:
    """This rank's endless, deterministic stream of batches.

    Each epoch shuffles the file list with the seed and gives rank r the files r, r+W, ...;
    rows of a file are shuffled too, and a file's last partial batch is dropped. The stream can
    start at any micro-batch index without reading the skipped data (only shard lengths).
    """

    def __init__(self, files, rank, world_size, batch_size, seed):
        self.files, self.rank, self.world_size = files, rank, world_size
        self.batch_size, self.seed = batch_size, seed
        self._lengths = {}

    def epoch_files(self, epoch):
        """All ranks' files in the epoch's order; rank r reads r, r+W, r+2W, ..."""
        order = list(self.files)
        random.Random(self.seed * 1000003 + epoch).shuffle(order)
        return order

    def _rank_files(self, epoch):
        return self.epoch_files(epoch)[self.rank::self.world_size]

    def _length(self, path):
        if path not in self._lengths:
            with h5py.File(path, "r") as f:
                self._lengths[path] = f["input_ids"].shape[0]
        return self._lengths[path]

    def batches(self, start_batch=0):
        """Yield (batch dict of numpy arrays, Position of the file it came from)."""
        skip, files_done, epoch = start_batch, 0, 0
        while True:
            mine = self._rank_files(epoch)
            if not any(self._length(p) >= self.batch_size for p in mine):
                raise UsageError(f"rank {self.rank}: no shard holds a full batch of "
                                 f"{self.batch_size}")
            for file_index, path in enumerate(mine):
                n_batches = self._length(path) // self.batch_size
                if skip >= n_batches:
                    skip -= n_batches
                    files_done += 1
                    continue
                with h5py.File(path, "r") as f:
                    arrays = {key: f[key][()] for key in HDF5_KEYS}
                rows = np.random.default_rng([self.seed, epoch, file_index, self.rank])
                order = rows.permutation(len(arrays["input_ids"]))
                position = Position(files_done, epoch, file_index)
                for b in range(skip, n_batches):
                    idx = np.sort(order[b * self.batch_size:(b + 1) * self.batch_size])
                    yield {k: v[idx] for k, v in arrays.items()}, position
                skip = 0
                files_done += 1
            epoch += 1


_END = object()  # what a closed Prefetcher hands its consumer


class Prefetcher:
    """Reads and converts batches in a background thread so the step never waits on disk."""

    def __init__(self, stream_iter, depth):
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_seconds = 0.0
        self.error = None  # what ended the stream, for a consumer that only sees it stop
        self._thread = threading.Thread(target=self._fill, args=(stream_iter,), daemon=True)
        self._thread.start()

    def _fill(self, stream_iter):
        try:
            for arrays, position in stream_iter:
                batch = {k: torch.from_numpy(v.astype(np.int64)) for k, v in arrays.items()}
                while not self._stop.is_set():
                    try:
                        self._queue.put((batch, position), timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # surfaced in the training thread
            self._queue.put(exc)

    def next(self):
        start = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds += time.perf_counter() - start
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            self.error = item
            raise item
        return item

    def __iter__(self):
        while True:
            try:
                item = self.next()
            except StopIteration:
                return
            yield item

    def close(self, timeout: float = 300) -> None:
        """Stop the reader and wait for it: it stops after the batch it is reading. A daemon thread
        still inside torch or h5py when the interpreter exits aborts the process ("terminate called
        without an active exception"), which failed a rank that had finished (a slow read under load
        outlasted the 5 s this once waited)."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            print(f"UC_INFO the batch reader did not stop in {timeout:.0f} s", flush=True)
        # A consumer waiting for a batch (torch_xla's loader thread) gets the end instead.
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self._queue.put_nowait(_END)
        except queue.Full:  # the reader, still going, filled it again
            pass

    @property
    def reading(self) -> bool:
        return self._thread.is_alive()


class DeviceFeed:
    """What the training step takes its batches from, timing how long it waited for each.

    On XLA, torch_xla's ParallelLoader (what the Neuron sample's MpDeviceLoader wraps; held here so
    that close() can join it) copies the next batches to the device in background threads while the
    current step runs; elsewhere the step moves its batch itself.
    """

    def __init__(self, prefetcher: Prefetcher, runtime):
        self.runtime, self.prefetcher, self.wait_seconds = runtime, prefetcher, 0.0
        self._loader = None
        if runtime.kind == "xla":
            import torch_xla.distributed.parallel_loader as pl
            self._loader = pl.ParallelLoader(prefetcher, [runtime.device])
            self._iter = iter(self._loader.per_device_loader(runtime.device))
        else:
            self._iter = iter(prefetcher)

    def close(self) -> None:
        """The reader first, then torch_xla's loader threads, which its end lets finish: no thread
        may still be inside torch when the interpreter exits (see Prefetcher.close)."""
        self.prefetcher.close()
        if self._loader is not None:
            self._loader.close()

    def next(self):
        start = time.perf_counter()
        try:
            batch, position = next(self._iter)
        except StopIteration:  # the loader's thread stopped: say why (e.g. a UsageError)
            raise self.prefetcher.error or RuntimeError("the batch stream ended") from None
        self.wait_seconds += time.perf_counter() - start
        if self.runtime.kind != "xla":
            batch = {k: v.to(self.runtime.device, non_blocking=True) for k, v in batch.items()}
        return batch, Position(*position)

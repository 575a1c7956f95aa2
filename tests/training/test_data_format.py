"""The local dataset and prepare_data.py: the seed's HDF5 format, masking, NSP balance, determinism."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.training.support import DATASET_NAME, REPO, TRAINING_DIR

pytestmark = pytest.mark.training

SEQ_LEN, MAX_PRED = 128, 20
EXPECTED = {
    "input_ids": ("int32", [SEQ_LEN]),
    "input_mask": ("int8", [SEQ_LEN]),
    "segment_ids": ("int8", [SEQ_LEN]),
    "masked_lm_positions": ("int32", [MAX_PRED]),
    "masked_lm_ids": ("int32", [MAX_PRED]),
    "next_sentence_labels": ("int8", []),
}


def inspect(training_python: Path, data_dir: Path) -> dict:
    done = subprocess.run([str(training_python), str(REPO / "tests" / "training" / "inspect_shards.py"),
                           str(data_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def prepare(training_python: Path, output_dir: Path, *args: str) -> dict:
    done = subprocess.run([str(training_python), str(TRAINING_DIR / "prepare_data.py"),
                           "--output_dir", str(output_dir), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def test_local_dataset_has_the_seed_layout_keys_dtypes_and_shapes(training_python, dataset_cache, data_dir):
    with tarfile.open(dataset_cache / f"{DATASET_NAME}.tar") as tar:
        names = tar.getnames()
    shards = [n for n in names if n.startswith(f"{DATASET_NAME}/") and "_training_" in n and n.endswith(".hdf5")]
    assert len(shards) >= 8  # world sizes up to 8 get a file each

    report = inspect(training_python, data_dir)
    assert len(report["files"]) == len(shards)
    for name, datasets in report["datasets"].items():
        assert set(datasets) == set(EXPECTED), name
        rows = datasets["input_ids"]["shape"][0]
        assert rows > 0
        for key, (dtype, width) in EXPECTED.items():
            assert datasets[key]["dtype"] == dtype, (name, key)
            assert datasets[key]["shape"] == [rows, *width], (name, key)
    assert report["bad_layout"] == 0 and report["bad_segments"] == 0 and report["bad_positions"] == 0
    assert report["max_id"] < report["vocab_size"] <= 30522  # fits the model's vocabulary
    size = (dataset_cache / f"{DATASET_NAME}.tar").stat().st_size
    assert 500_000 < size < 20_000_000


def test_mask_ratio_80_10_10_and_nsp_balance(training_python, data_dir):
    report = inspect(training_python, data_dir)
    # 15% of the real tokens of each sequence, rounded, at most 20 per sequence.
    assert 0.14 <= report["mask_ratio"] <= 0.16
    assert 0.77 <= report["mask_token_fraction"] <= 0.83
    assert 0.08 <= report["kept_fraction"] <= 0.12
    assert 0.08 <= report["random_token_fraction"] <= 0.12
    assert 0.45 <= report["random_next_fraction"] <= 0.55


def test_build_is_reused_and_deterministic(training_python, dataset_cache, tmp_path):
    tar = dataset_cache / f"{DATASET_NAME}.tar"
    before = (tar.stat().st_mtime_ns, hashlib.sha256(tar.read_bytes()).hexdigest())
    env = {**os.environ, "TRAINING_PYTHON": str(training_python)}
    script = str(REPO / "scripts" / "build_local_dataset.sh")

    again = subprocess.run(["bash", script, str(dataset_cache)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stderr == ""  # nothing rebuilt
    assert (tar.stat().st_mtime_ns, hashlib.sha256(tar.read_bytes()).hexdigest()) == before

    fresh = subprocess.run(["bash", script, str(tmp_path / "other-cache")], env=env, capture_output=True,
                           text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    assert hashlib.sha256(Path(fresh.stdout.split()[-1]).read_bytes()).hexdigest() == before[1]


def test_prepare_data_from_text_files_with_a_given_vocab(training_python, data_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = [w for w in (data_dir / "vocab.txt").read_text().splitlines()[200:1500] if w.isalpha()]
    for doc in range(12):
        sentences = [" ".join(words[(doc * 37 + s * 11 + w) % len(words)] for w in range(9)).capitalize() + "."
                     for s in range(30)]
        (corpus / f"doc{doc}.txt").write_text("\n\n".join(" ".join(sentences[i:i + 3]) for i in range(0, 30, 3)))
    args = ["--input", *map(str, sorted(corpus.iterdir())), "--vocab_file", str(data_dir / "vocab.txt"),
            "--num_shards", "4", "--seed", "7"]

    first = prepare(training_python, tmp_path / "a", *args)
    prepare(training_python, tmp_path / "b", *args)
    other_seed = prepare(training_python, tmp_path / "c", *args[:-1], "8")

    assert first["shards"] == 4 and first["sequences"] > 40
    assert (tmp_path / "a" / "vocab.txt").read_bytes() == (data_dir / "vocab.txt").read_bytes()
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")       # same seed, same bytes
    assert first["sha256"] != other_seed["sha256"]                          # the seed matters
    report = inspect(training_python, tmp_path / "a")
    assert report["bad_layout"] == report["bad_segments"] == report["bad_positions"] == 0
    assert 0.14 <= report["mask_ratio"] <= 0.16


def test_the_batch_reader_is_stopped_before_the_worker_exits(training_python, tmp_path):
    """A read still going when training ends (slow storage, a loaded node) is waited for: the reader
    thread, alive at interpreter exit inside torch, would abort the finished rank (SIGABRT)."""
    script = tmp_path / "slow_reader.py"
    script.write_text(
        "import sys, time\nimport numpy as np\n"
        f"sys.path.insert(0, {str(TRAINING_DIR)!r})\n"
        "from pretrain_data import Prefetcher\n"
        "def stream():\n"
        "    arrays = {'input_ids': np.arange(8 * 128).reshape(8, 128)}\n"
        "    yield arrays, 0\n"
        "    time.sleep(6)  # the next file's read, slow\n"
        "    while True:\n"
        "        yield arrays, 1\n"
        "reader = Prefetcher(stream(), depth=1)\n"
        "reader.next()\n"
        "import threading\n"
        "consumer = threading.Thread(target=lambda: list(reader))  # as torch_xla's loader thread\n"
        "consumer.start()\n"
        "time.sleep(0.5)\n"
        "reader.close()\n"
        "consumer.join(10)\n"
        "print('reading after close:', reader.reading, 'consumer waiting:', consumer.is_alive())\n")
    done = subprocess.run([str(training_python), str(script)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "reading after close: False consumer waiting: False"), \
        done.stderr

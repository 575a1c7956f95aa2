"""Facts about a directory of pretraining shards, as JSON (run with the training venv's python).

Usage: inspect_shards.py DATA_DIR   (DATA_DIR holds *_training_*.hdf5 and vocab.txt)
"""
import glob
import json
import os
import sys

import h5py
import numpy as np


def main(data_dir: str) -> None:
    vocab = open(os.path.join(data_dir, "vocab.txt"), encoding="utf-8").read().splitlines()
    ids = {token: i for i, token in enumerate(vocab)}
    cls_id, sep_id, mask_id, pad_id = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"], ids["[PAD]"]
    files = sorted(glob.glob(os.path.join(data_dir, "*_training_*.hdf5")))
    report = {"files": [os.path.basename(f) for f in files], "datasets": {}, "rows": 0}
    masked = real = random_next = to_mask = kept = replaced = 0
    bad_positions = bad_layout = bad_segments = 0
    max_id = 0
    for path in files:
        with h5py.File(path, "r") as f:
            report["datasets"][os.path.basename(path)] = {
                key: {"dtype": str(f[key].dtype), "shape": list(f[key].shape)} for key in f}
            input_ids = f["input_ids"][()]
            input_mask = f["input_mask"][()]
            segment_ids = f["segment_ids"][()]
            positions = f["masked_lm_positions"][()]
            labels = f["masked_lm_ids"][()]
            nsp = f["next_sentence_labels"][()]
        report["rows"] += len(input_ids)
        random_next += int(nsp.sum())
        max_id = max(max_id, int(input_ids.max()), int(labels.max()))
        for row in range(len(input_ids)):
            length = int(input_mask[row].sum())
            # input_mask is 1 on a prefix, then 0; the sequence is [CLS] A [SEP] B [SEP].
            if not (input_mask[row, :length] == 1).all() or (input_ids[row, length:] != pad_id).any():
                bad_layout += 1
            if input_ids[row, 0] != cls_id or input_ids[row, length - 1] != sep_id:
                bad_layout += 1
            seps = np.flatnonzero(input_ids[row, :length] == sep_id)
            segs = segment_ids[row, :length]
            if len(seps) < 2 or (segs[:seps[0] + 1] != 0).any() or (segs[seps[0] + 1:] != 1).any():
                bad_segments += 1
            count = int((labels[row] != 0).sum())
            pos = positions[row, :count]
            lab = labels[row, :count]
            real += length
            masked += count
            if (pos == 0).any() or (pos >= length).any() or len(set(pos.tolist())) != count:
                bad_positions += 1
            if any(lab_id in (cls_id, sep_id, pad_id) for lab_id in lab.tolist()):
                bad_positions += 1
            shown = input_ids[row, pos]
            to_mask += int((shown == mask_id).sum())
            kept += int((shown == lab).sum())
            replaced += int(((shown != mask_id) & (shown != lab)).sum())
    report.update(
        mask_ratio=masked / real, random_next_fraction=random_next / report["rows"],
        mask_token_fraction=to_mask / masked, kept_fraction=kept / masked,
        random_token_fraction=replaced / masked, bad_positions=bad_positions,
        bad_layout=bad_layout, bad_segments=bad_segments, max_id=max_id, vocab_size=len(ids))
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])

#!/usr/bin/env python3
"""Turn raw text into BERT phase-1 pretraining shards (the seed's HDF5 format).

Each shard `<prefix>_training_<i>.hdf5` holds, for N sequences of length L=128 and P=20 predictions:
  input_ids [N,L] i4, input_mask [N,L] i1, segment_ids [N,L] i1,
  masked_lm_positions [N,P] i4, masked_lm_ids [N,P] i4 (0-padded), next_sentence_labels [N] i1
  (1 = sentence B is a random sentence, 0 = B really follows A).

Corpus: text files (one document per file, blank lines split paragraphs), or, by default, the
docstrings of the Python standard library read with `ast` (no import, no download): the same
Python version gives the same corpus on any machine. Deterministic for a given seed.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
from tokenizers import BertWordPieceTokenizer
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Test suites and IDE code hold few docstrings and much noise.
SKIPPED_STDLIB_PARTS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}
SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?:])\s+(?=[A-Z>(`'\"])")


def stdlib_documents() -> list[str]:
    """One document per stdlib module: its docstrings in source order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_STDLIB_PARTS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = [tree] + [
            node for node in ast.walk(tree)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        docstrings = [doc for doc in (ast.get_docstring(node) for node in nodes) if doc]
        if docstrings:
            documents.append("\n\n".join(docstrings))
    return documents


def file_documents(paths: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(paths)]


def split_sentences(document: str) -> list[str]:
    sentences = []
    for paragraph in re.split(r"\n\s*\n", document):
        text = " ".join(paragraph.split())
        if text:
            sentences.extend(s for s in SENTENCE_BOUNDARY.split(text) if s.strip())
    return sentences


def count_vocab(documents: list[str], vocab_size: int, min_frequency: int = 2) -> list[str]:
    """A WordPiece vocabulary from counts, deterministic by construction.

    HF tokenizers' WordPieceTrainer picks different vocabularies in different processes (its
    hash maps are seeded at random, which breaks ties between equal counts differently), so the
    default path counts with HF tokenizers' own BERT normalizer and pre-tokenizer and then ranks
    pieces by (count, text): every character (plain and ##), frequent whole words, and frequent
    word endings (##ing, ##ed...) that greedy longest-match WordPiece uses for the rest.
    """
    normalizer, pre_tokenizer = BertNormalizer(lowercase=True), BertPreTokenizer()
    word_counts: Counter[str] = Counter()
    for document in documents:
        normalized = normalizer.normalize_str(document)
        word_counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalized))
    alphabet = sorted({ch for word in word_counts for ch in word})
    vocab = list(SPECIAL_TOKENS) + alphabet + ["##" + ch for ch in alphabet]
    piece_counts: Counter[str] = Counter()
    for word, count in word_counts.items():
        if len(word) > 1:
            piece_counts[word] += count
        for start in range(1, len(word)):
            if len(word) - start <= 4:
                piece_counts["##" + word[start:]] += count
    already = set(vocab)
    ranked = sorted((-c, piece) for piece, c in piece_counts.items()
                    if c >= min_frequency and piece not in already)
    room = max(0, vocab_size - len(vocab))
    vocab.extend(piece for _, piece in ranked[:room])
    return vocab


def build_tokenizer(documents: list[str], vocab_file: Path | None, vocab_size: int,
                    trainer: str, output_dir: Path) -> BertWordPieceTokenizer:
    target = output_dir / "vocab.txt"
    if vocab_file is not None:
        if vocab_file.resolve() != target.resolve():
            target.write_bytes(vocab_file.read_bytes())
    elif trainer == "hf":
        tokenizer = BertWordPieceTokenizer(lowercase=True)
        tokenizer.train_from_iterator(documents, vocab_size=vocab_size, min_frequency=2,
                                      special_tokens=SPECIAL_TOKENS, show_progress=False)
        tokenizer.save_model(str(output_dir))
    else:
        target.write_text("\n".join(count_vocab(documents, vocab_size)) + "\n", encoding="utf-8")
    tokenizer = BertWordPieceTokenizer(str(target), lowercase=True)
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        sys.exit(f"vocabulary {target} lacks special tokens {missing}")
    return tokenizer


def tokenize_documents(documents: list[str], tokenizer) -> list[list[list[int]]]:
    """Documents as lists of sentences, each a list of token ids (no special tokens)."""
    tokenized = []
    for document in documents:
        sentences = split_sentences(document)
        if not sentences:
            continue
        encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
        ids = [e.ids for e in encodings if e.ids]
        if ids:
            tokenized.append(ids)
    return tokenized


def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int, rng: random.Random):
    # Trim from a random end of the longer side, as BERT's reference data pipeline does.
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def sentence_pairs(documents: list[list[list[int]]], doc_index: int, seq_len: int,
                   short_seq_prob: float, rng: random.Random):
    """Yield (tokens_a, tokens_b, is_random_next) for one document (BERT's NSP construction)."""
    document = documents[doc_index]
    max_tokens = seq_len - 3  # [CLS] A [SEP] B [SEP]
    target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
    chunk, chunk_len, i = [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        chunk_len += len(document[i])
        if i == len(document) - 1 or chunk_len >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for s in chunk[:a_end] for t in s]
            # 50% random B; a one-sentence chunk has no real continuation, so it borrows the
            # next sentence of the document when there is one instead of skewing NSP towards random.
            want_random = rng.random() < 0.5
            if want_random and len(documents) > 1:
                other = rng.randrange(len(documents) - 1)
                other += other >= doc_index
                other_doc = documents[other]
                start = rng.randrange(len(other_doc))
                tokens_b = []
                for sentence in other_doc[start:]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target - len(tokens_a):
                        break
                i -= len(chunk) - a_end  # unused sentences go back to the document
                is_random = True
            else:
                rest = chunk[a_end:]
                if not rest and i + 1 < len(document):
                    i += 1
                    rest = [document[i]]
                if not rest:
                    chunk, chunk_len = [], 0
                    i += 1
                    continue
                tokens_b = [t for s in rest for t in s]
                is_random = False
            truncate_pair(tokens_a, tokens_b, max_tokens, rng)
            if tokens_a and tokens_b:
                yield tokens_a, tokens_b, is_random
            chunk, chunk_len = [], 0
        i += 1


def mask_tokens(tokens: list[int], special_ids: set[int], mask_id: int, vocab_size: int,
                first_regular_id: int, masked_lm_prob: float, max_pred_len: int,
                rng: random.Random):
    """BERT masking: 15% of tokens; of those 80% -> [MASK], 10% random token, 10% unchanged."""
    candidates = [i for i, t in enumerate(tokens) if t not in special_ids]
    rng.shuffle(candidates)
    num_to_predict = min(max_pred_len, max(1, int(round(len(tokens) * masked_lm_prob))))
    positions = sorted(candidates[:num_to_predict])
    output = list(tokens)
    labels = []
    for pos in positions:
        labels.append(tokens[pos])
        draw = rng.random()
        if draw < 0.8:
            output[pos] = mask_id
        elif draw < 0.9:
            output[pos] = rng.randrange(first_regular_id, vocab_size)
    return output, positions, labels


def build_instances(documents, tokenizer, seq_len, max_pred_len, masked_lm_prob, dupe_factor,
                    short_seq_prob, rng):
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    mask_id = tokenizer.token_to_id("[MASK]")
    special_ids = {tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    vocab_size = tokenizer.get_vocab_size()
    first_regular_id = max(special_ids) + 1
    instances = []
    for _ in range(dupe_factor):
        for doc_index in range(len(documents)):
            for tokens_a, tokens_b, is_random in sentence_pairs(documents, doc_index, seq_len,
                                                                short_seq_prob, rng):
                tokens = [cls_id] + tokens_a + [sep_id] + tokens_b + [sep_id]
                segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                masked, positions, labels = mask_tokens(tokens, special_ids, mask_id, vocab_size,
                                                        first_regular_id, masked_lm_prob,
                                                        max_pred_len, rng)
                instances.append((masked, segments, positions, labels, int(is_random)))
    rng.shuffle(instances)
    return instances


def write_shard(path: Path, instances, seq_len: int, max_pred_len: int) -> None:
    n = len(instances)
    arrays = {
        "input_ids": np.zeros((n, seq_len), dtype="i4"),
        "input_mask": np.zeros((n, seq_len), dtype="i1"),
        "segment_ids": np.zeros((n, seq_len), dtype="i1"),
        "masked_lm_positions": np.zeros((n, max_pred_len), dtype="i4"),
        "masked_lm_ids": np.zeros((n, max_pred_len), dtype="i4"),
        "next_sentence_labels": np.zeros((n,), dtype="i1"),
    }
    for row, (tokens, segments, positions, labels, is_random) in enumerate(instances):
        arrays["input_ids"][row, :len(tokens)] = tokens
        arrays["input_mask"][row, :len(tokens)] = 1
        arrays["segment_ids"][row, :len(segments)] = segments
        arrays["masked_lm_positions"][row, :len(positions)] = positions
        arrays["masked_lm_ids"][row, :len(labels)] = labels
        arrays["next_sentence_labels"][row] = is_random
    tmp = path.with_suffix(".hdf5.tmp")
    # track_times=False keeps the bytes identical between builds (no object timestamps).
    with h5py.File(tmp, "w", libver="earliest") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value, dtype=value.dtype, compression="gzip",
                             track_times=False)
    tmp.replace(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True, type=Path)
    parser.add_argument("--input", nargs="*", type=Path, default=[],
                        help="text files, one document each (default corpus: stdlib docstrings)")
    parser.add_argument("--vocab_file", type=Path, help="existing WordPiece vocab.txt to use")
    parser.add_argument("--vocab_size", type=int, default=8192,
                        help="size of the WordPiece vocabulary to train (<= model vocab 30522)")
    parser.add_argument("--vocab_trainer", choices=["counts", "hf"], default="counts",
                        help="counts: deterministic (default); hf: HF WordPieceTrainer, which "
                             "differs from one process to the next")
    parser.add_argument("--num_shards", type=int, default=16)
    parser.add_argument("--shard_prefix", default="stdlib_docstrings")
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--max_pred_len", type=int, default=20)
    parser.add_argument("--masked_lm_prob", type=float, default=0.15)
    parser.add_argument("--dupe_factor", type=int, default=2,
                        help="passes over the corpus, each with different masks and pairs")
    parser.add_argument("--short_seq_prob", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)

    args.output_dir.mkdir(parents=True, exist_ok=True)
    for old in args.output_dir.glob("*_training_*.hdf5"):
        old.unlink()
    raw = file_documents(args.input) if args.input else stdlib_documents()
    if not raw:
        sys.exit("no input documents")
    tokenizer = build_tokenizer(raw, args.vocab_file, args.vocab_size, args.vocab_trainer,
                                args.output_dir)
    documents = tokenize_documents(raw, tokenizer)
    rng = random.Random(args.seed)
    instances = build_instances(documents, tokenizer, args.seq_len, args.max_pred_len,
                                args.masked_lm_prob, args.dupe_factor, args.short_seq_prob, rng)
    if len(instances) < args.num_shards:
        sys.exit(f"only {len(instances)} sequences for {args.num_shards} shards")
    digest = hashlib.sha256()
    for shard in range(args.num_shards):
        path = args.output_dir / f"{args.shard_prefix}_training_{shard}.hdf5"
        write_shard(path, instances[shard::args.num_shards], args.seq_len, args.max_pred_len)
        digest.update(path.read_bytes())
    summary = {
        "documents": len(documents),
        "sequences": len(instances),
        "shards": args.num_shards,
        "vocab_size": tokenizer.get_vocab_size(),
        "random_next_fraction": round(sum(i[4] for i in instances) / len(instances), 4),
        "sha256": digest.hexdigest(),
    }
    (args.output_dir / "dataset_info.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

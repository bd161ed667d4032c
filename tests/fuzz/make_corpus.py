#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/ (npy, config, data, tokenizer), a handful of
valid and slightly broken inputs each, plus one nested 100,000 levels deep where a harness reads
JSON. The checkpoint seeds come from the harness itself, which owns the tiny run they belong to:
    RELGRAD_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/checkpoint build-fuzz/tests/fuzz/fuzz_checkpoint
Run from anywhere with the system Python (numpy: python3-numpy); existing files are overwritten.
"""
import io
import json
import pathlib

import numpy as np

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
DEEP = 100_000  # levels of nesting of the deep seeds


def deep_array(levels=DEEP):
    return "[" * levels + "]" * levels


def write(harness, name, data):
    path = CORPUS / harness / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def npy_bytes(array, version=None):
    out = io.BytesIO()
    if version is None:
        np.save(out, array)
    else:
        np.lib.format.write_array(out, array, version=version)
    return out.getvalue()


def npy_with_header(header, data=b"", version=1):
    """A .npy file with the header text given as is (padded as NumPy pads it)."""
    preamble = 6 + 2 + (2 if version == 1 else 4)
    header = header + " " * (63 - (preamble + len(header)) % 64) + "\n"
    length = len(header).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin-1") + data


def npy_seeds():
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    write("npy", "valid_f32_2x3.npy", npy_bytes(f32))
    write("npy", "valid_f64_scalar.npy", npy_bytes(np.array(2.5)))
    write("npy", "valid_i64_vector.npy", npy_bytes(np.array([1, -2, 3, 1 << 40], dtype=np.int64)))
    write("npy", "valid_bool_2x2.npy", npy_bytes(np.array([[True, False], [False, True]])))
    write("npy", "valid_empty_0x3.npy", npy_bytes(np.zeros((0, 3), dtype=np.float32)))
    write("npy", "valid_version2.npy", npy_bytes(f32, version=(2, 0)))
    write("npy", "valid_version3.npy", npy_bytes(f32, version=(3, 0)))
    write("npy", "valid_nan_inf.npy", npy_bytes(np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32)))
    good = npy_bytes(f32)
    write("npy", "broken_truncated.npy", good[:-4])
    write("npy", "broken_extra_bytes.npy", good + b"\0\0\0\0")
    write("npy", "broken_magic.npy", b"\x93NUMPX" + good[6:])
    write("npy", "broken_header_length.npy", good[:8] + b"\xff\xff" + good[10:])
    write("npy", "fortran_order_2x3.npy", npy_bytes(np.asfortranarray(f32)))
    write("npy", "broken_dtype_i4.npy", npy_bytes(np.arange(3, dtype=np.int32)))
    write("npy", "broken_big_endian.npy", npy_bytes(np.arange(3, dtype=">f4")))
    write("npy", "broken_shape_text.npy", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }"))
    write("npy", "broken_shape_negative.npy",
          npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"))
    write("npy", "broken_shape_overflow.npy",
          npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"))
    write("npy", "broken_bool_byte.npy", npy_with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
                                                           b"\x01\x02"))
    write("npy", "broken_no_descr.npy", npy_with_header("{'fortran_order': False, 'shape': (1,), }", b"\0" * 4))


# the one copy, which the program embeds
QUICKSTART = json.loads((pathlib.Path(__file__).resolve().parents[2] / "configs" / "quickstart.json").read_text())


def config_seeds():
    write("config", "valid_quickstart.json", json.dumps(QUICKSTART, indent=2))
    write("config", "valid_empty_object.json", "{}")
    write("config", "valid_reverse_sets.txt",
          "--set task.kind=reverse\n--set training.steps=800\n--set model.position=gated\n"
          '{"model": {"dim": 32, "heads": 2}, "output": {"dir": "runs/x"}}')
    write("config", "valid_classification.json", json.dumps({
        "task": {"kind": "classification"},
        "data": {"train": "data/train.tsv", "test": "data/test.jsonl", "tokenizer": "word", "lowercase": True,
                 "split_punctuation": True, "min_frequency": 2, "max_length": 64, "train_max_tokens": 20},
        "training": {"epochs": 3, "schedule": "linear", "length_bucketing": True},
        "model": {"pooling": "first", "attention": "fused", "k_left": 4, "k_right": 2, "rank": 4}}))
    write("config", "valid_language_model_null.txt",
          "--set data.train=corpus.txt\n--set model.k=null\n"
          '{"task": {"kind": "language_model"}, "model": {"position": "learned", "token_gate": true}}')
    write("config", "broken_unknown_key.json", '{"training": {"lr": 0.1}}')
    write("config", "broken_bad_values.json",
          '{"model": {"dim": 10, "heads": 4}, "task": {"train_lengths": [9, 4]}, "training": {"steps": "ten"}}')
    write("config", "broken_not_json.json", '{"model": {"dim": 64,, }')
    write("config", "broken_utf8.txt", b"--set output.dir=\xc3\x28\n{\"output\": {\"dir\": \"r\xff\"}}")
    write("config", "broken_root_array.txt", "--set training.steps=3\n[1, 2, 3]")
    write("config", "broken_set_not_section.txt", "--set model.dim.x=3\n--set =4\n--set a..b=1\n{}")
    write("config", "deep_value.json", '{"training": {"steps": ' + deep_array() + "}}")
    write("config", "deep_set.txt", "--set training.steps=" + deep_array() + "\n{}")
    write("config", "deep_task.json", '{"task": ' + deep_array() + "}")


def data_seeds():
    write("data", "valid_classification.tsv", "pos\tA good film.\nneg\tDull, long; bad.\n\n  \t \npos\tJa, sehr schön!\n")
    write("data", "valid_classification_crlf.tsv", "1\tfirst line\r\n0\tsecond line\r\n")
    write("data", "valid_classification.jsonl",
          '{"text": "a fine day", "label": 1}\n{"text": "ÄÖÜ ß — “quoted”", "label": "neg", "id": 7}\n')
    write("data", "valid_pairs.jsonl", '{"source": "Guten Morgen!", "target": "Good morning!"}\n'
                                       '{"source": "Wie geht es dir?", "target": "How are you?"}\n')
    write("data", "valid_pairs.tsv", "ein Haus\ta house\nzwei Häuser\ttwo houses\n")
    write("data", "broken_no_tab.tsv", "just text without a label\n")
    write("data", "broken_two_tabs.tsv", "pos\ttext\tmore\n")
    write("data", "broken_utf8.tsv", b"pos\tcaf\xc3\x28\nneg\t\xed\xa0\x80\n")
    write("data", "broken_empty_field.tsv", "\tno label\npos\t\n")
    write("data", "broken_lines.jsonl", '{"text": "x", "label": 1.5}\n[1, 2]\n{"text": "y"}\nnot json\n')
    write("data", "deep_label.jsonl", '{"text": "deep", "label": ' + deep_array() + "}\n")


RESERVED = ["<pad>", "<unk>", "<bos>", "<eos>"]


def tokenizer_seeds():
    def tok(kind, tokens, **options):
        return json.dumps({"kind": kind, **options, "tokens": RESERVED + tokens}, ensure_ascii=False, indent=2)

    write("tokenizer", "valid_char.json", tok("char", ["e", " ", "a", "ä", "—", "😀"], lowercase=False,
                                              split_punctuation=False))
    write("tokenizer", "valid_char_lowercase.json", tok("char", ["e", "ä", "þ"], lowercase=True))
    write("tokenizer", "valid_word.json", tok("word", ["the", "Haus", "ß", "don't"]))
    write("tokenizer", "valid_word_split.json", tok("word", ["hi", ",", "!", "…", "you"], lowercase=True,
                                                    split_punctuation=True))
    write("tokenizer", "broken_missing_kind.json", json.dumps({"tokens": RESERVED}))
    write("tokenizer", "broken_unknown_key.json", json.dumps({"kind": "char", "tokens": RESERVED, "size": 4}))
    write("tokenizer", "broken_reserved.json", json.dumps({"kind": "char", "tokens": ["<unk>", "<pad>", "<bos>"]}))
    write("tokenizer", "broken_repeated.json", tok("char", ["a", "b", "a"]))
    write("tokenizer", "broken_two_chars.json", tok("char", ["ab"]))
    write("tokenizer", "broken_space_in_word.json", tok("word", ["a b"]))
    write("tokenizer", "broken_upper_lowercased.json", tok("word", ["Haus"], lowercase=True))
    write("tokenizer", "broken_split_chars.json", tok("char", ["a"], split_punctuation=True))
    write("tokenizer", "broken_not_object.json", '["char", "<pad>"]')
    write("tokenizer", "broken_not_json.json", '{"kind": "char", "tokens": [')
    write("tokenizer", "deep_tokens.json", '{"kind": "char", "tokens": ' + deep_array() + "}")


if __name__ == "__main__":
    npy_seeds()
    config_seeds()
    data_seeds()
    tokenizer_seeds()

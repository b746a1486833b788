#!/usr/bin/python3
"""Fixture for tests/data/test_byte_level_bpe.cpp: a small GPT-2-style byte-level BPE trained with Hugging
Face's `tokenizers`, and the ids `tokenizers` gives for a stress corpus.

Run: /usr/bin/python3 tests/reference/make_bpe_fixture.py   (needs `tokenizers`, `regex`; they come
with `pip install transformers==4.36.2`). Writes into tests/reference/gpt2_bpe/:
  vocab.json, merges.txt   the model as GPT-2 ships it (tokenizers' BPE.save)
  tokenizer.json           the same as one file (tokenizers' Tokenizer.save)
  expected.json            {"tokenizers_version", "cases": [{"name", "hex", "ids", "source"}]}:
                           `hex` is the text's bytes; `source` says where `ids` come from:
                           "tokenizers" = Tokenizer.encode(text).ids (valid UTF-8 only, which is all
                           HF accepts); "pattern+model" = for text with invalid UTF-8, qkv's rule
                           (an invalid byte is one character of the "other" class): the text split
                           by GPT-2's pattern with the `regex` package over the text decoded with
                           surrogateescape (an invalid byte becomes a lone surrogate, class Cs =
                           other), each piece's bytes mapped to the byte alphabet and encoded by
                           tokenizers' own BPE model (model.tokenize). For every valid text the
                           script checks that this second route gives tokenizers' ids too.
The training text is written here, so the merges cover words, digits, CJK, accents and emoji.
"""
import json
import os

import regex
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_bpe")
EOT = "<|endoftext|>"
PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

TRAIN = [
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "We're sure they've gone; I'm told he'll come and she'd stay. Don't you think it's late?",
    "The year 2024 had 366 days; 3.14159 and 1,000,000 are numbers. Call 555-0100 at 10:30pm.",
    "Café, naïve, résumé, Ångström, façade, über, jalapeño, Zürich, São Paulo.",
    "東京は日本の首都です。中文测试，标点符号！한국어 문장입니다. Ελληνικά κείμενα. Русский текст.",
    "Emoji: 😀 😃 👍🏽 👨‍👩‍👧 🎉🎉🎉 ❤️ ★☆",
    "    indented code\n\tif (x) { return y; }\n\n\nfor i in range(10):\n    print(i)\n",
    "email@example.com http://example.org/path?q=1&r=2 #hashtag @user $100 50% ~tilde~",
] * 20 + [EOT.join(["first document", " second document", "\nthird"])]

STRESS = [
    ("plain", "Hello world! This is a test of the tokenizer."),
    ("contractions", "It's we're they've I'm he'll she'd don't 'S 'T IT'S ''s 's's 'll'"),
    ("contraction at end", "that'"),
    ("digits", "0 12 345 6789 3.14159 1,000,000 2024-12-01 x2y3z4 ２０２４ Ⅻ ½ ²³"),
    ("accents", "café naïve résumé Ångström e\u0301 A\u030a"),
    ("cjk", "東京は日本の首都です。中文测试，标点！ 한국어"),
    ("emoji", "😀👍🏽 👨‍👩‍👧 a😀b 🎉🎉"),
    ("long spaces", "a" + " " * 40 + "b" + " " * 7),
    ("long whitespace mix", "\n\n\n\t\t  x  \t \n y\r\n\r\nz\n"),
    ("unicode spaces", "a\u00a0b \u3000c\u2028d\u2003 e\u0085f \u1680g"),
    ("not white space", "a\x1cb\x1d c\x1f"),
    ("trailing spaces", "end   "),
    ("only spaces", "     "),
    ("leading space word", " hello  world   again"),
    ("symbols", "$%^&*()[]{}<>?/\\|`~ !!! ... --- ===>"),
    ("mixed classes", "abc123def!!!ghi   jkl...456"),
    ("special token", "first" + EOT + " second" + EOT + EOT + "third"),
    ("partial special", "<|endof <|endoftext| |>"),
    ("empty", ""),
    ("single", "a"),
    ("newline word", "\nhello"),
    ("training line", TRAIN[1]),
    ("long word", "supercalifragilisticexpialidocious" * 5),
]
INVALID = [
    ("invalid bytes", b"\xff\xfe abc \x80\x80 caf\xc3 \xed\xa0\x80 \xf0\x9f\x98 end"),
    ("overlong", b"\xc0\xaf x \xe0\x80\xaf"),
    ("space then invalid", b"a \xff b \xfe\xfe"),
    ("invalid inside word", b"hel\xfflo wor\x80ld"),
    ("truncated utf8 at end", b"emoji \xf0\x9f\x98"),
    ("beyond U+10FFFF", b"\xf4\x90\x80\x80 ok"),
]


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def pattern_and_model(tok, data: bytes):
    """qkv's rule, using tokenizers only for the BPE merges of each piece."""
    alphabet = byte_alphabet()
    special = tok.token_to_id(EOT)
    ids = []
    text = data.decode("utf-8", "surrogateescape")
    for k, part in enumerate(text.split(EOT)):
        if k:
            ids.append(special)
        for piece in PATTERN.findall(part):
            mapped = "".join(alphabet[b] for b in piece.encode("utf-8", "surrogateescape"))
            ids += [t.id for t in tok.model.tokenize(mapped)]
    return ids


def main():
    os.makedirs(HERE, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN, trainer)
    tok.model.save(HERE)  # vocab.json, merges.txt
    tok.save(os.path.join(HERE, "tokenizer.json"))
    # Reload from the saved files: the fixture is what the files say.
    tok = Tokenizer.from_file(os.path.join(HERE, "tokenizer.json"))

    cases = []
    for name, text in STRESS:
        ids = tok.encode(text).ids
        assert pattern_and_model(tok, text.encode()) == ids, f"pattern+model disagrees with tokenizers on {name!r}"
        assert tok.decode(ids, skip_special_tokens=False) == text, name
        cases.append({"name": name, "hex": text.encode().hex(), "ids": ids, "source": "tokenizers"})
    for name, data in INVALID:
        cases.append({"name": name, "hex": data.hex(), "ids": pattern_and_model(tok, data), "source": "pattern+model"})
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "vocab_size": tok.get_vocab_size(),
                   "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {HERE}: vocab {tok.get_vocab_size()}, {len(cases)} cases")


if __name__ == "__main__":
    main()

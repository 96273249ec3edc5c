"""Bitext mining sets in LASER's Tatoeba layout: ``tatoeba.<xxx>-eng.<xxx>`` and ``.eng``, aligned by line."""

from __future__ import annotations

import re

from embedlib import storage
from embedlib.eval.beir import DatasetError

_PAIR = re.compile(r"tatoeba\.([a-z]{3})-eng\.\1$")


def tatoeba_languages(url: str) -> list[str]:
    """The languages with a ``tatoeba.<xxx>-eng.<xxx>`` file under ``url``, sorted."""
    fs, path = storage.filesystem(url)
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    return sorted(match.group(1) for name in names if (match := _PAIR.match(name)))


def read_lines(url: str) -> list[str]:
    return storage.read_bytes(url).decode("utf-8").rstrip("\n").split("\n")


def load_tatoeba(url: str, lang: str) -> tuple[list[str], list[str]]:
    """``(sentences in lang, their English translations)``, aligned by line."""
    source_url = storage.join(url, f"tatoeba.{lang}-eng.{lang}")
    english_url = storage.join(url, f"tatoeba.{lang}-eng.eng")
    for file in (source_url, english_url):
        if not storage.exists(file):
            raise DatasetError(f"{file}: file not found")
    source, english = read_lines(source_url), read_lines(english_url)
    if len(source) != len(english):
        raise DatasetError(f"{source_url} has {len(source)} lines but {english_url} has {len(english)}")
    if not source or source == [""]:
        raise DatasetError(f"{source_url}: no sentences")
    return source, english

"""Errors whose messages name settings as data: each front end words them its own way."""

from __future__ import annotations

import pickle

import pytest

from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    ConfigMismatchError,
    FilterUnavailableError,
    SettingError,
    SettingName,
    Wording,
)

OPTIONS = {"BLOOMFILTER_RETRY_TIMEOUT": "--retry-timeout", "BLOOMFILTER_KEY": "--key"}


def option(setting: str) -> str:
    """Name a setting as a command line would: its option, else the setting."""
    return OPTIONS.get(setting, setting)


def test_render_names_each_setting_and_the_word_for_it() -> None:
    wording = Wording(
        "The {BLOOMFILTER_KEY} {setting} ({key!r}) and the {settings} {names} clash;"
        " see {why}. Retried for {waited:.1f} s.",
        key="a{b}",  # a value's braces are never read as fields
        names=SettingName("BLOOMFILTER_TTL"),
        why=Wording("{BLOOMFILTER_RETRY_TIMEOUT} = {s:g} s", s=0.5),
        waited=1.25,
    )
    assert wording.settings == ("BLOOMFILTER_KEY", "BLOOMFILTER_TTL", "BLOOMFILTER_RETRY_TIMEOUT")
    assert (
        str(wording)
        == wording.render()
        == (
            "The BLOOMFILTER_KEY setting ('a{b}') and the settings BLOOMFILTER_TTL clash;"
            " see BLOOMFILTER_RETRY_TIMEOUT = 0.5 s. Retried for 1.2 s."
        )
    )
    assert wording.render(option, "option") == (
        "The --key option ('a{b}') and the options BLOOMFILTER_TTL clash;"
        " see --retry-timeout = 0.5 s. Retried for 1.2 s."
    )


def test_an_error_reads_as_scrapy_words_and_renders_in_others() -> None:
    exc = FilterUnavailableError(
        Wording("Retried ({BLOOMFILTER_RETRY_TIMEOUT} = {t:g} s).", t=2.0),
        operation="check",
        server="Redis at h:1",
    )
    assert str(exc) == exc.args[0] == "Retried (BLOOMFILTER_RETRY_TIMEOUT = 2 s)."
    assert exc.render() == str(exc)
    assert exc.render(option, "option") == "Retried (--retry-timeout = 2 s)."
    assert (exc.operation, exc.server) == ("check", "Redis at h:1")
    assert exc.wording is not None
    assert exc.wording.settings == ("BLOOMFILTER_RETRY_TIMEOUT",)
    with pytest.raises(FilterUnavailableError, match=r"BLOOMFILTER_RETRY_TIMEOUT = 2 s"):
        raise exc


def test_plain_messages_and_pickling_are_unchanged() -> None:
    plain = ConfigMismatchError("no settings here: {braces} kept")
    assert plain.wording is None
    assert plain.render(option, "option") == str(plain) == "no settings here: {braces} kept"
    worded = BloomFilterError(Wording("Choose another {BLOOMFILTER_KEY}."))
    assert str(pickle.loads(pickle.dumps(worded))) == "Choose another BLOOMFILTER_KEY."


def test_a_setting_error_is_a_value_error() -> None:
    name = SettingName("BLOOMFILTER_KEY")
    exc = SettingError(Wording("The {name} {setting} is invalid.", name=name))
    assert isinstance(exc, ValueError)
    assert str(exc) == "The BLOOMFILTER_KEY setting is invalid."
    assert exc.render(option, "option") == "The --key option is invalid."

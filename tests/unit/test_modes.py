"""The speculation modes have one definition, the core's registry: lookups name the choices, a server
without a drafter offers only modes that need none, and the client offers exactly the core's modes."""

from __future__ import annotations

import pytest

from adaflash_contract.modes import MODE_NAMES, parse_mode, modes_served
from adaflash_client.client import SPEC_MODES


def test_client_offers_exactly_the_core_modes():
    assert tuple(SPEC_MODES) == MODE_NAMES


@pytest.mark.parametrize("name", MODE_NAMES)
def test_every_mode_name_resolves_to_its_mode(name):
    assert parse_mode(name).name == name


def test_unknown_mode_error_names_the_choices():
    with pytest.raises(ValueError) as info:
        parse_mode("eagle")
    message = str(info.value)
    assert "'eagle'" in message
    assert all(name in message for name in MODE_NAMES), message


def test_without_a_drafter_only_modes_needing_none_are_served():
    served = modes_served(False)
    assert "ar" in served
    assert set(served) == {name for name in MODE_NAMES if parse_mode(name).drafter is None}


def test_with_a_drafter_every_mode_is_served():
    assert modes_served(True) == MODE_NAMES

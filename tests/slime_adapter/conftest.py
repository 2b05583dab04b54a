"""Fixtures shared by this folder's conformance tests, which run each test once on the SGLang stand-in and
once on the real server: ``engine`` (module-scoped, parametrised over both) and the autouse
``never_left_paused`` (acts only on a test that uses ``engine``). Defined in tests/support/conformance.py;
named here so pytest finds them by name without each test module importing them."""

from support.conformance import engine, never_left_paused  # noqa: F401

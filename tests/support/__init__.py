"""The tests' helpers: servers, clients, fault injection, readers and scenarios shared by
test modules (tests/README.md). Fixtures live in tests/conftest.py, not here."""

"""Checks of the repository itself that run outside tools (make, pip, hadolint, kubectl):
slower than unit tests, so `make unit` leaves them out; `make test` runs them."""

//! Test-only: the C client lives in `c/`, the scenarios in `tests/`.
